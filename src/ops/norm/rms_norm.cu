// RMSNorm kernels. A "group" of threads owns one row: a whole block for hidden-size rows (two
// passes over the row: sum of squares, then scale and write; each thread touches the same elements
// in both passes, so the fused residual it stored in pass one is its own to read in pass two), one
// warp for rows of at most 256 elements (heads; the row stays in registers between the two steps),
// and the one-pass vector kernel for hidden-size rows whose shape it takes.
#include <cuda_bf16.h>

#include <cstdint>

#include "core/kernel_launch.h"
#include "core/error.h"
#include "ops/norm/rms_norm_cuda.h"

namespace tetra::ops::cuda {

namespace {

constexpr int kBlock = 256;

template <int kGroup>
__device__ __forceinline__ float group_sum(float v, float* scratch) {
  for (int off = 16; off >= 1; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  if constexpr (kGroup == 32) {
    return v;
  } else {
    static_assert(kGroup == kBlock, "a group is one warp or the whole block");
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int i = 0; i < kBlock / 32; ++i) total += scratch[i];
    return total;
  }
}

// Row r = (token r / heads, head r % heads) starts at t*stride + h*n in x, residual and out.
// Hidden-size rows (n > 256) that the one-pass vector kernel below does not take: a block per row.
__global__ void __launch_bounds__(kBlock)
    rms_norm_kernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                    const __nv_bfloat16* __restrict__ w, __nv_bfloat16* out, int rows, int n,
                    int heads, int64_t stride, float eps) {
  __shared__ float scratch[kBlock / 32];
  const int row = blockIdx.x;
  const int64_t base = int64_t(row / heads) * stride + int64_t(row % heads) * n;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += kBlock) {
    float v = __bfloat162float(x[base + i]);
    if (residual != nullptr) {
      const __nv_bfloat16 r = __float2bfloat16_rn(v + __bfloat162float(residual[base + i]));
      residual[base + i] = r;
      v = __bfloat162float(r);
    }
    ss += v * v;
  }
  const float inv_rms = rsqrtf(group_sum<kBlock>(ss, scratch) / float(n) + eps);
  const __nv_bfloat16* src = residual != nullptr ? residual : x;
  for (int i = threadIdx.x; i < n; i += kBlock)
    out[base + i] =
        __float2bfloat16_rn(__bfloat162float(src[base + i]) * inv_rms * __bfloat162float(w[i]));
}

// Rows of at most 256 elements (heads, tiny hidden sizes): one warp per row, element lane + 32 j
// in register j between the sum of squares and the write, with the same float arithmetic per
// element as rms_norm_kernel.
constexpr int kWarpRowMax = 8;  // elements per lane: n <= 256

__device__ __forceinline__ void load_warp_row_weights(const __nv_bfloat16* w, int n, int lane,
                                                      float (&wr)[kWarpRowMax]) {
#pragma unroll
  for (int j = 0; j < kWarpRowMax; ++j)
    if (lane + 32 * j < n) wr[j] = __bfloat162float(w[lane + 32 * j]);
}

// out = bf16(v * inv_rms * w) with v = x, or (residual != nullptr) v = bf16(x + residual), which
// is also stored to residual. x and out may be the same row.
__device__ __forceinline__ void warp_row_rms_norm(const __nv_bfloat16* x, __nv_bfloat16* residual,
                                                  const float (&wr)[kWarpRowMax],
                                                  __nv_bfloat16* out, int n, float eps, int lane) {
  float v[kWarpRowMax];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kWarpRowMax; ++j)
    if (const int i = lane + 32 * j; i < n) {
      v[j] = __bfloat162float(x[i]);
      if (residual != nullptr) {
        const __nv_bfloat16 r = __float2bfloat16_rn(v[j] + __bfloat162float(residual[i]));
        residual[i] = r;
        v[j] = __bfloat162float(r);
      }
      ss += v[j] * v[j];
    }
  const float inv_rms = rsqrtf(group_sum<32>(ss, nullptr) / float(n) + eps);
#pragma unroll
  for (int j = 0; j < kWarpRowMax; ++j)
    if (lane + 32 * j < n) out[lane + 32 * j] = __float2bfloat16_rn(v[j] * inv_rms * wr[j]);
}

__global__ void __launch_bounds__(kBlock)
    rms_norm_warp_rows_kernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                              const __nv_bfloat16* __restrict__ w, __nv_bfloat16* out, int rows,
                              int n, int heads, int64_t stride, float eps) {
  const int row = blockIdx.x * (kBlock / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave
  const int64_t base = int64_t(row / heads) * stride + int64_t(row % heads) * n;
  float wr[kWarpRowMax];
  load_warp_row_weights(w, n, lane, wr);
  warp_row_rms_norm(x + base, residual != nullptr ? residual + base : nullptr, wr, out + base, n,
                    eps, lane);
}

// The q and k heads of one step in one launch (head_rms_norm_qk): rows [0, T * q.heads) are q's,
// the rest k's, normalised in place. A programmatic dependent of the q/k/v projection: the
// weights (parameters) are read before waiting for it, q and k after.
struct HeadNormPart {
  __nv_bfloat16* x;                // [T, heads, n] rows at token stride `stride`, in place
  const __nv_bfloat16* w;          // [n]
  int heads;
  int64_t stride;
};

__global__ void __launch_bounds__(kBlock)
    head_rms_norm_qk_kernel(const HeadNormPart q, const HeadNormPart k, int T, int n, float eps) {
  asm volatile("griddepcontrol.launch_dependents;");  // the attention's prologue may start
  const int row = blockIdx.x * (kBlock / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q_rows = T * q.heads;
  if (row >= q_rows + T * k.heads) return;
  const bool is_q = row < q_rows;
  const HeadNormPart& p = is_q ? q : k;
  const int r = is_q ? row : row - q_rows;
  float wr[kWarpRowMax];
  load_warp_row_weights(p.w, n, lane, wr);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  __nv_bfloat16* x = p.x + int64_t(r / p.heads) * p.stride + int64_t(r % p.heads) * n;
  warp_row_rms_norm(x, nullptr, wr, x, n, eps, lane);
}

// Hidden-size rows, one pass: each thread keeps its VPT 16-byte vectors (8 bf16 each) in
// registers between the sum of squares and the write, so the row is read once and written once
// (at batch 1 the two-pass kernel's dependent scalar loads made a 4096-wide norm latency-bound).
// Same float arithmetic per element as rms_norm_kernel; only the order of the partial sums differs.
constexpr int kVecBlock = 256;

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(a))) |
         (uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(b))) << 16);
}

template <int VPT>
__global__ void __launch_bounds__(kVecBlock)
    rms_norm_vec_kernel(const uint4* x, uint4* residual, const uint4* __restrict__ w, uint4* out,
                        int vecs, float n, float eps) {
  __shared__ float scratch[kVecBlock / 32];
  // A programmatic dependent (the decode q/k/v GEMV) may start streaming its weights now; it
  // waits for this grid before it reads the output.
  asm volatile("griddepcontrol.launch_dependents;");
  // The norm weight is a model parameter no kernel writes: its loads go out before the wait, so
  // at batch 1 their latency overlaps the previous kernel instead of following the reduction.
  uint4 wv[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = threadIdx.x + j * kVecBlock;
    if (i < vecs) wv[j] = w[i];
  }
  // Launched as a programmatic dependent itself: wait for the kernel that wrote x (and that may
  // still read residual/out) before touching anything else.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int64_t base = int64_t(blockIdx.x) * vecs;
  float v[VPT][8];  // [vector][element] this thread's part of the row (residual sum if fused)
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = threadIdx.x + j * kVecBlock;
    if (i < vecs) {
      unpack8(x[base + i], v[j]);
      if (residual != nullptr) {
        float r[8];
        unpack8(residual[base + i], r);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[j][e] = __bfloat162float(__float2bfloat16_rn(v[j][e] + r[e]));
        residual[base + i] = make_uint4(pack2(v[j][0], v[j][1]), pack2(v[j][2], v[j][3]),
                                        pack2(v[j][4], v[j][5]), pack2(v[j][6], v[j][7]));
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v[j][e] * v[j][e];
    }
  }
  const float inv_rms = rsqrtf(group_sum<kBlock>(ss, scratch) / n + eps);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = threadIdx.x + j * kVecBlock;
    if (i < vecs) {
      float g[8];
      unpack8(wv[j], g);
      float y[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = v[j][e] * inv_rms * g[e];
      out[base + i] = make_uint4(pack2(y[0], y[1]), pack2(y[2], y[3]), pack2(y[4], y[5]),
                                 pack2(y[6], y[7]));
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The one-pass kernel when rows are whole 16-byte vectors (n % 8 == 0, contiguous rows) and fit
// 4 vectors per thread (n <= 8192); false: the caller takes the general kernel.
bool launch_vec(const uint16_t* x, uint16_t* residual, const uint16_t* w, uint16_t* out, int rows,
                int n, int heads, int64_t stride, float eps, cudaStream_t stream,
                cudaError_t& err) {
  if (heads != 1 || stride != n || n % 8 != 0 || n > 4 * kVecBlock * 8) return false;
  if (!aligned16(x) || !aligned16(w) || !aligned16(out) ||
      (residual != nullptr && !aligned16(residual)))
    return false;
  const int vecs = n / 8;
  auto* xv = reinterpret_cast<const uint4*>(x);
  auto* rv = reinterpret_cast<uint4*>(residual);
  auto* wv = reinterpret_cast<const uint4*>(w);
  auto* ov = reinterpret_cast<uint4*>(out);
  const float nf = float(n);
  const int vpt = (vecs + kVecBlock - 1) / kVecBlock;
  // Programmatic dependent launch: the block is scheduled while the previous kernel drains (it
  // waits for it before reading), hiding the launch latency at batch 1.
  const KernelLaunch launch(dim3(unsigned(rows)), dim3(kVecBlock), stream);
  if (vpt == 1)
    err = launch(rms_norm_vec_kernel<1>, xv, rv, wv, ov, vecs, nf, eps);
  else if (vpt == 2)
    err = launch(rms_norm_vec_kernel<2>, xv, rv, wv, ov, vecs, nf, eps);
  else
    err = launch(rms_norm_vec_kernel<4>, xv, rv, wv, ov, vecs, nf, eps);
  return true;
}

cudaError_t launch(const uint16_t* x, uint16_t* residual, const uint16_t* w, uint16_t* out,
                   int rows, int n, int heads, int64_t stride, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
  auto* rb = reinterpret_cast<__nv_bfloat16*>(residual);
  auto* wb = reinterpret_cast<const __nv_bfloat16*>(w);
  auto* ob = reinterpret_cast<__nv_bfloat16*>(out);
  cudaError_t vec_err = cudaSuccess;
  if (n > 32 * kWarpRowMax &&
      launch_vec(x, residual, w, out, rows, n, heads, stride, eps, stream, vec_err))
    return vec_err;
  if (n <= 32 * kWarpRowMax) {  // a warp per row: head-size rows
    const int grid = (rows + kBlock / 32 - 1) / (kBlock / 32);
    rms_norm_warp_rows_kernel<<<grid, kBlock, 0, stream>>>(xb, rb, wb, ob, rows, n, heads, stride,
                                                           eps);
  } else {
    rms_norm_kernel<<<rows, kBlock, 0, stream>>>(xb, rb, wb, ob, rows, n, heads, stride, eps);
  }
  return cudaGetLastError();
}

void check(int T, int n, float eps, const char* op) {
  TETRA_CHECK(T >= 0 && n > 0, op, ": T=", T, " n=", n);
  TETRA_CHECK(eps >= 0.0f, op, ": eps=", eps);
}

}  // namespace

cudaError_t rms_norm(const uint16_t* x, const uint16_t* w, int T, int H, float eps, uint16_t* out,
                     cudaStream_t stream) {
  check(T, H, eps, "rms_norm");
  return launch(x, nullptr, w, out, T, H, 1, H, eps, stream);
}

cudaError_t fused_add_rms_norm(const uint16_t* x, uint16_t* residual, const uint16_t* w, int T,
                               int H, float eps, uint16_t* out, cudaStream_t stream) {
  check(T, H, eps, "fused_add_rms_norm");
  TETRA_CHECK(residual != nullptr, "fused_add_rms_norm: residual is null");
  return launch(x, residual, w, out, T, H, 1, H, eps, stream);
}

cudaError_t head_rms_norm(uint16_t* x, int T, int n_heads, int head_dim, int64_t token_stride,
                          const uint16_t* w, float eps, cudaStream_t stream) {
  check(T, head_dim, eps, "head_rms_norm");
  TETRA_CHECK(n_heads > 0 && token_stride >= int64_t(n_heads) * head_dim, "head_rms_norm: heads=",
              n_heads, " head_dim=", head_dim, " token_stride=", token_stride);
  return launch(x, nullptr, w, x, T * n_heads, head_dim, n_heads, token_stride, eps, stream);
}

cudaError_t head_rms_norm_qk(uint16_t* q, int64_t q_stride, int q_heads, const uint16_t* wq,
                             uint16_t* k, int64_t k_stride, int k_heads, const uint16_t* wk, int T,
                             int head_dim, float eps, cudaStream_t stream) {
  check(T, head_dim, eps, "head_rms_norm_qk");
  TETRA_CHECK(head_dim <= 32 * kWarpRowMax, "head_rms_norm_qk: head_dim ", head_dim,
              " (at most ", 32 * kWarpRowMax, ")");
  TETRA_CHECK(q_heads > 0 && k_heads > 0 && q_stride >= int64_t(q_heads) * head_dim &&
                  k_stride >= int64_t(k_heads) * head_dim,
              "head_rms_norm_qk: q heads=", q_heads, " stride=", q_stride, ", k heads=", k_heads,
              " stride=", k_stride, ", head_dim=", head_dim);
  const int64_t rows = int64_t(T) * (q_heads + k_heads);
  if (rows == 0) return cudaSuccess;
  const HeadNormPart qp{reinterpret_cast<__nv_bfloat16*>(q),
                        reinterpret_cast<const __nv_bfloat16*>(wq), q_heads, q_stride};
  const HeadNormPart kp{reinterpret_cast<__nv_bfloat16*>(k),
                        reinterpret_cast<const __nv_bfloat16*>(wk), k_heads, k_stride};
  const KernelLaunch launch(dim3(unsigned((rows + kBlock / 32 - 1) / (kBlock / 32))), dim3(kBlock),
                            stream);
  return launch(head_rms_norm_qk_kernel, qp, kp, T, head_dim, eps);
}

}  // namespace tetra::ops::cuda
