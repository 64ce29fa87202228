// BF16 dense linear: the small-M GEMV (bf16_gemv.cu) where it applies, cuBLASLt otherwise.
// Row-major y[M, N] = x[M, K] . W^T is, in cuBLAS's column-major terms, y^T [N, M] =
// W^T' . x^T where W [N, K] row-major is a column-major [K, N] matrix used transposed (op T)
// and x [M, K] row-major is a column-major [K, M] matrix used as is.
#include <cublasLt.h>

#include <cstdint>
#include <cstdlib>

#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/linear/linear_cuda.h"

namespace tetra::ops::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's recommendation for Hopper

#define TETRA_LT_CHECK(expr)                                                             \
  do {                                                                                   \
    const cublasStatus_t st_ = (expr);                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                    \
      TETRA_FAIL("cuBLASLt error in " #expr ": ", cublasGetStatusName(st_), " (", int(st_), ")"); \
  } while (0)

// Frees the cuBLASLt descriptors of one call even when a check throws.
struct LtCall {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtCall() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

Bf16Linear::Bf16Linear(bool small_m_gemv) {
  const char* knob = std::getenv("TETRA_BF16_GEMV");
  use_gemv_ = small_m_gemv && !(knob != nullptr && knob[0] == '0');
  cublasLtHandle_t h = nullptr;
  TETRA_LT_CHECK(cublasLtCreate(&h));
  handle_ = h;
  workspace_bytes_ = kWorkspaceBytes;
  TETRA_CUDA_MALLOC(&workspace_, workspace_bytes_);
}

Bf16Linear::~Bf16Linear() {
  cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

void Bf16Linear::run(const uint16_t* w, int N, int K, const uint16_t* x, int M, void* y,
                     DType out_dtype, cudaStream_t stream) {
  TETRA_CHECK(out_dtype == DType::F32 || out_dtype == DType::BF16, "out dtype ",
              dtype_name(out_dtype));
  TETRA_CHECK(N > 0 && K > 0 && M >= 0, "bf16 linear shape M=", M, " N=", N, " K=", K);
  if (M == 0) return;
  if (use_gemv_ && bf16_gemv_unsupported_reason(w, N, K, x, M, y).empty()) {
    TETRA_CUDA_CHECK(linear_bf16_gemv(w, N, K, x, M, y, out_dtype, stream));
    return;
  }
  const cudaDataType_t out_type = out_dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
  LtCall c;
  TETRA_LT_CHECK(cublasLtMatmulDescCreate(&c.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  TETRA_LT_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                sizeof(trans_a)));
  TETRA_LT_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                                sizeof(trans_b)));
  TETRA_LT_CHECK(cublasLtMatrixLayoutCreate(&c.a, CUDA_R_16BF, K, N, K));  // W as [K, N] col-major
  TETRA_LT_CHECK(cublasLtMatrixLayoutCreate(&c.b, CUDA_R_16BF, K, M, K));  // x as [K, M]
  TETRA_LT_CHECK(cublasLtMatrixLayoutCreate(&c.d, out_type, N, M, N));     // y as [N, M]
  TETRA_LT_CHECK(cublasLtMatmulPreferenceCreate(&c.pref));
  TETRA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(
      c.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
      sizeof(workspace_bytes_)));
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  auto h = static_cast<cublasLtHandle_t>(handle_);
  TETRA_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(h, c.op, c.a, c.b, c.d, c.d, c.pref, 1, &result,
                                                &found));
  if (found == 0)
    TETRA_FAIL("cuBLASLt has no algorithm for bf16 linear M=", M, " N=", N, " K=", K);
  const float alpha = 1.0f, beta = 0.0f;
  TETRA_LT_CHECK(cublasLtMatmul(h, c.op, &alpha, w, c.a, x, c.b, &beta, y, c.d, y, c.d,
                                &result.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace tetra::ops::cuda
