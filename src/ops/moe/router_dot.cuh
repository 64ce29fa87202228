// One router logit, x[t] . w_gate[e], by one warp in the order router_logits_cpu emulates: lane l
// owns the 8-element blocks b with b % 32 == l and FMAs them in ascending k; a butterfly then
// sums the lanes. Shared by router_logits.cu and the small-T token path (token_path.cu).
#pragma once
#include <cstdint>

#include "moe/routing_math.h"

namespace tetra::moe::cuda::detail {

__device__ __forceinline__ float router_bf16_to_f32(uint16_t b) {
  return math::f32_from_bits(uint32_t(b) << 16);
}
__device__ __forceinline__ float router_to_f32(float v) { return v; }
__device__ __forceinline__ float router_to_f32(uint16_t b) { return router_bf16_to_f32(b); }

// 8 consecutive values as float, one 16-byte (bf16) or two 16-byte (f32) loads.
__device__ __forceinline__ void router_load8(const uint16_t* p, float* v) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = router_bf16_to_f32(uint16_t(w[i] & 0xffffu));
    v[2 * i + 1] = router_bf16_to_f32(uint16_t(w[i] >> 16));
  }
}
__device__ __forceinline__ void router_load8(const float* p, float* v) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// xt [H] (bf16 bits or f32), we [H] bf16 bits. kVec: H % 8 == 0 and 16-byte aligned rows.
// Every lane returns the sum.
template <typename X, bool kVec>
__device__ __forceinline__ float router_dot(const X* __restrict__ xt,
                                            const uint16_t* __restrict__ we, int H, int lane) {
  float acc = 0.0f;
  // Unrolled so that several iterations' loads are in flight before their FMAs (which stay in
  // ascending k order): one warp per dot product is latency-bound otherwise.
#pragma unroll 4
  for (int k0 = lane * 8; k0 < H; k0 += 32 * 8) {
    if (kVec) {
      float xv[8], wv[8];
      router_load8(xt + k0, xv);
      router_load8(we + k0, wv);
      for (int i = 0; i < 8; ++i) acc = fmaf(xv[i], wv[i], acc);
    } else {
      const int k1 = min(k0 + 8, H);
      for (int k = k0; k < k1; ++k)
        acc = fmaf(router_to_f32(xt[k]), router_bf16_to_f32(we[k]), acc);
    }
  }
  for (int off = 16; off >= 1; off /= 2) acc = acc + __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

}  // namespace tetra::moe::cuda::detail
