// cuBLAS GEMMs for the prefill side of the absorbed MLA ops (mla_gemm.h). Row-major tensors
// read as cuBLAS's column-major matrices: a row-major [r, c] view with row stride ld is a
// column-major [c, r] matrix with leading dimension ld. Per head h (the batch, stride between
// heads in brackets):
//   absorb: q_abs_h^T [Dl, T] (ldc H (Dl + Dr), [Dl + Dr]) = W_uk_h^T [Dl, nope] (lda Dl,
//           [(nope + v) Dl]) . q_nope_h^T [nope, T] (ldb H (nope + Dr), [nope + Dr]);
//   up v:   out_h^T [v, T] (ldc H v, [v]) = op_T(W_uv_h as [Dl, v], lda Dl, [(nope + v) Dl])
//           . out_lat_h^T [Dl, T] (ldb H Dl, [Dl]).
#include "ops/attention/mla_gemm.h"

#include <cublas_v2.h>

#include <cstddef>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"

namespace tetra::ops::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(8) << 20;

#define TETRA_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                      \
    const cublasStatus_t st_ = (expr);                                                      \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      TETRA_FAIL("cuBLAS error in " #expr ": ", cublasGetStatusName(st_), " (", int(st_), ")"); \
  } while (0)

struct DeviceHandle {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;  // [kWorkspaceBytes], ours, so cuBLAS never allocates per stream
};

// This thread's handle on the current device, bound to `stream`. The handles live as long as
// the thread and are deliberately never destroyed: a destructor at thread or process exit can
// run after the CUDA context is gone.
cublasHandle_t handle_for(cudaStream_t stream) {
  thread_local std::vector<DeviceHandle> per_device;
  int device = 0;
  TETRA_CUDA_CHECK(cudaGetDevice(&device));
  if (per_device.size() <= size_t(device)) per_device.resize(size_t(device) + 1);
  DeviceHandle& d = per_device[size_t(device)];
  if (d.handle == nullptr) {
    TETRA_CUDA_MALLOC(&d.workspace, kWorkspaceBytes);
    TETRA_CUBLAS_CHECK(cublasCreate(&d.handle));
  }
  TETRA_CUBLAS_CHECK(cublasSetStream(d.handle, stream));
  // After the stream: setting a stream resets the workspace to cuBLAS's own pool.
  TETRA_CUBLAS_CHECK(cublasSetWorkspace(d.handle, d.workspace, kWorkspaceBytes));
  return d.handle;
}

void check_ld(int64_t ld, const char* what) {
  TETRA_CHECK(ld < (int64_t(1) << 31), "mla gemm (cuda): ", what, " ", ld, " overflows int");
}

}  // namespace

void mla_absorb_gemm(const uint16_t* q, const uint16_t* kv_b, int T, const MlaShape& s,
                     uint16_t* q_abs, cudaStream_t stream) {
  if (T <= 0) return;
  const int64_t H = s.n_heads, Dl = s.kv_lora, nope = s.nope_dim;
  const int64_t ldb = H * s.q_head(), ldc = H * s.row();
  check_ld(ldb, "q row stride");
  check_ld(ldc, "q_abs row stride");
  const float alpha = 1.0f, beta = 0.0f;
  TETRA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle_for(stream), CUBLAS_OP_N, CUBLAS_OP_N, int(Dl), T, int(nope), &alpha,
      kv_b, CUDA_R_16BF, int(Dl), (nope + s.v_dim) * Dl,  // W_uk_h^T [Dl, nope]
      q, CUDA_R_16BF, int(ldb), s.q_head(),                // q_nope_h^T [nope, T]
      &beta, q_abs, CUDA_R_16BF, int(ldc), s.row(),        // q_abs_h^T [Dl, T]
      int(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void mla_up_v_gemm(const uint16_t* out_lat, const uint16_t* kv_b, int T, const MlaShape& s,
                   uint16_t* out, cudaStream_t stream) {
  if (T <= 0) return;
  const int64_t H = s.n_heads, Dl = s.kv_lora, nope = s.nope_dim, v = s.v_dim;
  const int64_t ldb = H * Dl, ldc = H * v;
  check_ld(ldb, "out_lat row stride");
  check_ld(ldc, "out row stride");
  const float alpha = 1.0f, beta = 0.0f;
  TETRA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle_for(stream), CUBLAS_OP_T, CUBLAS_OP_N, int(v), T, int(Dl), &alpha,
      kv_b + nope * Dl, CUDA_R_16BF, int(Dl), (nope + v) * Dl,  // W_uv_h as [Dl, v], transposed
      out_lat, CUDA_R_16BF, int(ldb), Dl,                       // out_lat_h^T [Dl, T]
      &beta, out, CUDA_R_16BF, int(ldc), v,                     // out_h^T [v, T]
      int(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace tetra::ops::cuda
