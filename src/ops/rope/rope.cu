// RoPE kernel: one block per token; threads walk the (head, pair) grid of q then k.
#include <cuda_bf16.h>

#include "core/error.h"
#include "ops/rope/rope_cuda.h"
#include "ops/rope/rope_turn.cuh"

namespace tetra::ops::cuda {

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    rope_kernel(__nv_bfloat16* q, __nv_bfloat16* k, const int32_t* __restrict__ positions,
                const float* __restrict__ inv_freq, RopeShape s) {
  const int t = blockIdx.x;
  const float pos = float(positions[t]);
  const int half = s.rotary_dim / 2;
  const int q_pairs = s.n_q_heads * half;
  const int total = q_pairs + (k != nullptr ? s.n_k_heads * half : 0);
  const bool neox = s.style == RopeStyle::NeoX;
  for (int idx = threadIdx.x; idx < total; idx += kThreads) {
    const bool is_q = idx < q_pairs;
    const int j = is_q ? idx : idx - q_pairs;
    const int h = j / half, i = j % half;
    __nv_bfloat16* x = is_q ? q + t * s.q_stride + int64_t(h) * s.head_dim
                            : k + t * s.k_stride + int64_t(h) * s.head_dim;
    float sn, c;
    sincosf(pos * inv_freq[i], &sn, &c);
    int ia, ib;
    rope_pair_dims(i, half, neox, ia, ib);
    rope_turn(__bfloat162float(x[ia]), __bfloat162float(x[ib]), sn, c, x[ia], x[ib]);
  }
}

}  // namespace

cudaError_t apply_rope(uint16_t* q, uint16_t* k, const int32_t* positions, int T,
                       const float* inv_freq, const RopeShape& shape, cudaStream_t stream) {
  check_rope_shape(shape);
  TETRA_CHECK(T >= 0, "rope: T ", T);
  if (T == 0) return cudaSuccess;
  rope_kernel<<<T, kThreads, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(q),
                                          reinterpret_cast<__nv_bfloat16*>(k), positions, inv_freq,
                                          shape);
  return cudaGetLastError();
}

}  // namespace tetra::ops::cuda
