// Fused RoPE + KV-cache write (see rope_kv_cuda.h): one block per token. The block computes each
// pair's angle once into shared memory (the plain rope kernel recomputed sincosf per head), turns
// q and k pairs exactly as rope.cu does, then copies the finished k row and the v row to the
// token's cache slot, 16 bytes at a time when rows and pointers allow.
#include <cuda_bf16.h>

#include <cstdint>

#include "core/error.h"
#include "ops/rope/rope_kv_cuda.h"

namespace tetra::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxHalf = 256;  // rotary_dim / 2 held in shared memory

template <typename Word>
__device__ __forceinline__ void copy_row(const Word* src, Word* dst, int64_t words) {
  for (int64_t i = threadIdx.x; i < words; i += kThreads) dst[i] = src[i];
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    rope_kv_kernel(__nv_bfloat16* q, __nv_bfloat16* k, const __nv_bfloat16* v, int64_t v_stride,
                   const int32_t* __restrict__ positions, const int64_t* __restrict__ slots,
                   const float* __restrict__ inv_freq, RopeShape s, int64_t num_slots,
                   __nv_bfloat16* k_cache, __nv_bfloat16* v_cache) {
  __shared__ float sin_s[kMaxHalf], cos_s[kMaxHalf];  // [rotary_dim / 2] this token's angles
  const int t = blockIdx.x;
  const float pos = float(positions[t]);
  const int half = s.rotary_dim / 2;
  for (int i = threadIdx.x; i < half; i += kThreads) sincosf(pos * inv_freq[i], &sin_s[i], &cos_s[i]);
  __syncthreads();
  const int q_pairs = s.n_q_heads * half;
  const int total = q_pairs + s.n_k_heads * half;
  const bool neox = s.style == RopeStyle::NeoX;
  for (int idx = threadIdx.x; idx < total; idx += kThreads) {
    const bool is_q = idx < q_pairs;
    const int j = is_q ? idx : idx - q_pairs;
    const int h = j / half, i = j % half;
    __nv_bfloat16* x = is_q ? q + t * s.q_stride + int64_t(h) * s.head_dim
                            : k + t * s.k_stride + int64_t(h) * s.head_dim;
    const float sn = sin_s[i], c = cos_s[i];
    const int ia = neox ? i : 2 * i;
    const int ib = neox ? i + half : 2 * i + 1;
    const float a = __bfloat162float(x[ia]), b = __bfloat162float(x[ib]);
    x[ia] = __float2bfloat16_rn(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)));
    x[ib] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, sn)));
  }
  const int64_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;  // uniform per block: no thread is left at the barrier
  __syncthreads();  // the rotated k row (written by other threads) is complete
  const int64_t elems = int64_t(s.n_k_heads) * s.head_dim;
  if constexpr (kVec) {
    copy_row(reinterpret_cast<const uint4*>(k + t * s.k_stride),
             reinterpret_cast<uint4*>(k_cache + slot * elems), elems / 8);
    copy_row(reinterpret_cast<const uint4*>(v + t * v_stride),
             reinterpret_cast<uint4*>(v_cache + slot * elems), elems / 8);
  } else {
    copy_row(k + t * s.k_stride, k_cache + slot * elems, elems);
    copy_row(v + t * v_stride, v_cache + slot * elems, elems);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t rope_and_write_kv(uint16_t* q, uint16_t* k, const uint16_t* v, int64_t v_stride,
                              const int32_t* positions, const int64_t* slots, int T,
                              const float* inv_freq, const RopeShape& shape, int64_t num_slots,
                              uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream) {
  check_rope_shape(shape);
  TETRA_CHECK(k != nullptr && v != nullptr, "rope_and_write_kv: k and v are required");
  TETRA_CHECK(T >= 0 && num_slots > 0, "rope_and_write_kv: T=", T, " num_slots=", num_slots);
  TETRA_CHECK_LE(shape.rotary_dim / 2, kMaxHalf, "rope_and_write_kv: rotary_dim");
  const int64_t elems = int64_t(shape.n_k_heads) * shape.head_dim;
  TETRA_CHECK(shape.k_stride >= elems && v_stride >= elems, "rope_and_write_kv: k/v stride");
  if (T == 0) return cudaSuccess;
  const bool vec = elems % 8 == 0 && shape.k_stride % 8 == 0 && v_stride % 8 == 0 &&
                   aligned16(k) && aligned16(v) && aligned16(k_cache) && aligned16(v_cache);
  auto* qb = reinterpret_cast<__nv_bfloat16*>(q);
  auto* kb = reinterpret_cast<__nv_bfloat16*>(k);
  auto* vb = reinterpret_cast<const __nv_bfloat16*>(v);
  auto* kc = reinterpret_cast<__nv_bfloat16*>(k_cache);
  auto* vc = reinterpret_cast<__nv_bfloat16*>(v_cache);
  if (vec)
    rope_kv_kernel<true><<<T, kThreads, 0, stream>>>(qb, kb, vb, v_stride, positions, slots,
                                                     inv_freq, shape, num_slots, kc, vc);
  else
    rope_kv_kernel<false><<<T, kThreads, 0, stream>>>(qb, kb, vb, v_stride, positions, slots,
                                                      inv_freq, shape, num_slots, kc, vc);
  return cudaGetLastError();
}

}  // namespace tetra::ops::cuda
