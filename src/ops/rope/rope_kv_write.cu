// Fused RoPE + KV-cache write (see rope_kv_cuda.h): one warp per (token, head), q heads first,
// then k heads. A lane turns pairs lane, lane + 32, ... of its head exactly as rope.cu does (same
// sincosf angle, same rounding steps); a k warp also stores the turned pairs, the head's
// pass-through dims and the matching v head straight into the cache slot. No loop carries a load
// into the next iteration's, so a decode token costs one memory round trip (the per-token block
// of the plain rope kernel walked 3000+ pairs with 128 threads, one dependent load after another).
#include <cuda_bf16.h>

#include <cstdint>

#include "core/kernel_launch.h"
#include "core/error.h"
#include "ops/rope/rope_kv_cuda.h"
#include "ops/rope/rope_turn.cuh"

namespace tetra::ops::cuda {

namespace {

constexpr int kWarps = 8;  // heads per block
constexpr int kEarlyPairs = 2;  // rotary pairs per lane whose angle is computed before the wait

__global__ void __launch_bounds__(kWarps * 32)
    rope_kv_kernel(__nv_bfloat16* q, __nv_bfloat16* k, const __nv_bfloat16* v, int64_t v_stride,
                   const int32_t* __restrict__ positions, const int64_t* __restrict__ slots,
                   const float* __restrict__ inv_freq, RopeShape s, int64_t num_slots,
                   __nv_bfloat16* k_cache, __nv_bfloat16* v_cache) {
  const int t = blockIdx.x;
  const int head = blockIdx.y * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool active = head < s.n_q_heads + s.n_k_heads;
  const bool is_q = head < s.n_q_heads;
  const int half = s.rotary_dim / 2;
  // Programmatic dependent of the q/k/v projection. Before waiting for it: the step inputs
  // (positions and slots, uploaded before the step's first kernel), inv_freq (a constant) and
  // the angles of the lane's first kEarlyPairs pairs, so their latency overlaps that kernel.
  const float pos = float(positions[t]);
  const int64_t slot = active && !is_q ? slots[t] : -1;
  float sn0[kEarlyPairs], cs0[kEarlyPairs];
#pragma unroll
  for (int j = 0; j < kEarlyPairs; ++j) {
    const int i = lane + 32 * j;
    if (active && i < half) sincosf(pos * inv_freq[i], &sn0[j], &cs0[j]);
  }
  // q/k/v are the projection's output: wait for it; then let the attention kernel after this one
  // get scheduled. The trigger stays after the wait: the attention reads cache rows before its
  // own wait, which is safe only if every kernel before this one has completed by then.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  if (!active) return;
  const int h = is_q ? head : head - s.n_q_heads;
  __nv_bfloat16* x = is_q ? q + t * s.q_stride + int64_t(h) * s.head_dim
                          : k + t * s.k_stride + int64_t(h) * s.head_dim;
  const bool store = slot >= 0 && slot < num_slots;  // false for q heads and padded tokens
  const int64_t row = int64_t(s.n_k_heads) * s.head_dim;
  __nv_bfloat16* kc = store ? k_cache + slot * row + int64_t(h) * s.head_dim : nullptr;
  const bool neox = s.style == RopeStyle::NeoX;
  auto turn = [&](int i, float sn, float c) {  // pair i by the angle (sn, c)
    int ia, ib;
    rope_pair_dims(i, half, neox, ia, ib);
    __nv_bfloat16 ra, rb;
    rope_turn(__bfloat162float(x[ia]), __bfloat162float(x[ib]), sn, c, ra, rb);
    x[ia] = ra;
    x[ib] = rb;
    if (store) kc[ia] = ra, kc[ib] = rb;
  };
#pragma unroll
  for (int j = 0; j < kEarlyPairs; ++j)
    if (lane + 32 * j < half) turn(lane + 32 * j, sn0[j], cs0[j]);
  for (int i = lane + 32 * kEarlyPairs; i < half; i += 32) {  // rotary_dim > 128 only
    float sn, c;
    sincosf(pos * inv_freq[i], &sn, &c);
    turn(i, sn, c);
  }
  if (!store) return;
  for (int d = s.rotary_dim + lane; d < s.head_dim; d += 32) kc[d] = x[d];  // not rotated
  const __nv_bfloat16* vr = v + t * v_stride + int64_t(h) * s.head_dim;
  __nv_bfloat16* vc = v_cache + slot * row + int64_t(h) * s.head_dim;
  for (int d = lane; d < s.head_dim; d += 32) vc[d] = vr[d];
}

}  // namespace

cudaError_t rope_and_write_kv(uint16_t* q, uint16_t* k, const uint16_t* v, int64_t v_stride,
                              const int32_t* positions, const int64_t* slots, int T,
                              const float* inv_freq, const RopeShape& shape, int64_t num_slots,
                              uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream) {
  check_rope_shape(shape);
  TETRA_CHECK(k != nullptr && v != nullptr, "rope_and_write_kv: k and v are required");
  TETRA_CHECK(T >= 0 && num_slots > 0, "rope_and_write_kv: T=", T, " num_slots=", num_slots);
  const int64_t elems = int64_t(shape.n_k_heads) * shape.head_dim;
  TETRA_CHECK(shape.k_stride >= elems && v_stride >= elems, "rope_and_write_kv: k/v stride");
  if (T == 0) return cudaSuccess;
  const int heads = shape.n_q_heads + shape.n_k_heads;
  const dim3 grid(unsigned(T), unsigned((heads + kWarps - 1) / kWarps));
  // Programmatic dependent launch (the kernel waits for its predecessor first): hides the launch
  // latency of this small kernel behind the projection's tail.
  const KernelLaunch launch(grid, dim3(kWarps * 32), stream);
  return launch(rope_kv_kernel, reinterpret_cast<__nv_bfloat16*>(q),
                            reinterpret_cast<__nv_bfloat16*>(k),
                            reinterpret_cast<const __nv_bfloat16*>(v), v_stride, positions, slots,
                            inv_freq, shape, num_slots, reinterpret_cast<__nv_bfloat16*>(k_cache),
                            reinterpret_cast<__nv_bfloat16*>(v_cache));
}

}  // namespace tetra::ops::cuda
