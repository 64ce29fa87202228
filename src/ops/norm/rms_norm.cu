// RMSNorm kernels. A "group" of threads owns one row: a whole block for hidden-size rows, one
// warp for head-size rows (so a block normalises 8 heads at once). Two passes over the row: sum
// of squares, then scale and write; each thread touches the same elements in both passes, so the
// fused residual it stored in pass one is its own to read in pass two.
#include <cuda_bf16.h>

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
template <int kGroup>
__global__ void __launch_bounds__(kBlock)
    rms_norm_kernel(const __nv_bfloat16* x, __nv_bfloat16* residual,
                    const __nv_bfloat16* __restrict__ w, __nv_bfloat16* out, int rows, int n,
                    int heads, int64_t stride, float eps) {
  __shared__ float scratch[kBlock / 32];
  constexpr int kRowsPerBlock = kBlock / kGroup;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kGroup;
  const int lane = threadIdx.x % kGroup;
  // Warp groups leave whole; the block group (one row per block) never has row >= rows.
  if (row >= rows) return;
  const int64_t base = int64_t(row / heads) * stride + int64_t(row % heads) * n;
  float ss = 0.0f;
  for (int i = lane; i < n; i += kGroup) {
    float v = __bfloat162float(x[base + i]);
    if (residual != nullptr) {
      const __nv_bfloat16 r = __float2bfloat16_rn(v + __bfloat162float(residual[base + i]));
      residual[base + i] = r;
      v = __bfloat162float(r);
    }
    ss += v * v;
  }
  const float inv_rms = rsqrtf(group_sum<kGroup>(ss, scratch) / float(n) + eps);
  const __nv_bfloat16* src = residual != nullptr ? residual : x;
  for (int i = lane; i < n; i += kGroup)
    out[base + i] =
        __float2bfloat16_rn(__bfloat162float(src[base + i]) * inv_rms * __bfloat162float(w[i]));
}

cudaError_t launch(const uint16_t* x, uint16_t* residual, const uint16_t* w, uint16_t* out,
                   int rows, int n, int heads, int64_t stride, float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
  auto* rb = reinterpret_cast<__nv_bfloat16*>(residual);
  auto* wb = reinterpret_cast<const __nv_bfloat16*>(w);
  auto* ob = reinterpret_cast<__nv_bfloat16*>(out);
  if (n <= 256) {  // a warp per row: head-size rows
    const int grid = (rows + kBlock / 32 - 1) / (kBlock / 32);
    rms_norm_kernel<32><<<grid, kBlock, 0, stream>>>(xb, rb, wb, ob, rows, n, heads, stride, eps);
  } else {
    rms_norm_kernel<kBlock><<<rows, kBlock, 0, stream>>>(xb, rb, wb, ob, rows, n, heads, stride, eps);
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

}  // namespace tetra::ops::cuda
