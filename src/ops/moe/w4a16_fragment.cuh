// Device helpers shared by the W4A16 MoE kernels: fragment dequant, bf16 MMA, loads.
// The packed layout they read is described in moe/expert_weights.h.
#pragma once
#include <cuda_bf16.h>
#include <cstdint>

#include "moe/fragment_code.h"

namespace tetra::moe_detail {

constexpr int kChunkK = 64;         // k per chunk: 4 mma k-steps of 16
constexpr int kLaneBytes = 16;      // weight bytes per lane per (tile, chunk)
constexpr int kTileChunkBytes = 512;  // weight bytes per (16-row tile, chunk)
constexpr int kTileChunkScales = 64;  // scale bytes per (16-row tile, chunk)

// ue5m3 scale byte pair (row g in the low byte, row g+8 in the high byte) -> two bf16x2 registers,
// each holding its row's scale twice, as scale * 2^116 (exact: 4 significant bits, exponent <= 251).
__device__ __forceinline__ void scale_pair_to_bf16x2(uint32_t s, uint32_t& sg, uint32_t& sg8) {
  sg = __byte_perm(s, 0u, 0x4040u) * 16u + 0x74807480u;
  sg8 = __byte_perm(s, 0u, 0x4141u) * 16u + 0x74807480u;
}

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Word i (k-step i) of a lane's 16-byte chunk.
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// One packed word (one k-step) -> the four A registers of mma.m16n8k16, scaled. The word's code
// (moe/fragment_code.h) puts each E2M1 magnitude on bf16 bits 6..8 (so code c reads as
// value(c) * 2^-126, the e=0 subnormal path included) and its sign on bit 15; times
// scale * 2^116 that gives value * scale * 2^-10 exactly.
__device__ __forceinline__ void dequant_word(uint32_t w, uint32_t sg, uint32_t sg8, uint32_t a[4]) {
  uint32_t r[4];
  fragment_word_decode(w, r);
  a[0] = mul_bf16x2(r[0], sg);
  a[1] = mul_bf16x2(r[1], sg8);
  a[2] = mul_bf16x2(r[2], sg);
  a[3] = mul_bf16x2(r[3], sg8);
}

// d += A(16x16 bf16, row) * B(16x8 bf16, col), fp32 accumulate.
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One 64-k chunk of a pair of 16-row tiles times NT 8-row activation tiles: 4 k-steps x 2 tiles x
// NT MMAs. w / sc: the lane's 16 weight bytes and scale byte pair of each tile; xv: the lane's
// activations of each token tile, k 16 (lane % 4) .. +15 of the chunk (the fragment order).
template <int NT>
__device__ __forceinline__ void mma_chunk_pair(float (&acc)[2][NT][4], const uint4 (&w)[2],
                                               const uint32_t (&sc)[2], const uint4 (&xv)[NT][2]) {
  uint32_t sg[2], sg8[2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) scale_pair_to_bf16x2(sc[mt], sg[mt], sg8[mt]);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      uint32_t A[4];
      dequant_word(word_of(w[mt], j), sg[mt], sg8[mt], A);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4& xh = xv[nt][j >> 1];  // k 16t+8*(j/2) .. +7
        mma_bf16_16816(acc[mt][nt], A, (j & 1) ? xh.z : xh.x, (j & 1) ? xh.w : xh.y);
      }
    }
  }
}

// L2 policies for weight loads: evict first (bytes read once per launch) or normal priority
// (bytes the same launch reads again, e.g. one pass per 8 tokens of an expert).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t l2_evict_normal_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// Weight stream: keep out of L1; in L2 under `policy`, by default evict first (read once: the
// L2 then keeps what the latency-bound kernels between the streams read, such as activations,
// routing arrays and their code: GLM-4.5-Air decode batch 1 -2..-3% on the H200).
__device__ __forceinline__ uint4 ld_stream_u4(const void* p,
                                              uint64_t policy = l2_evict_first_policy()) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}
__device__ __forceinline__ uint32_t ld_stream_u16(const void* p,
                                                  uint64_t policy = l2_evict_first_policy()) {
  unsigned short v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.u16 %0, [%1], %2;"
               : "=h"(v)
               : "l"(p), "l"(policy));
  return v;
}
// Activations written earlier in the same grid: a weak load (L1-cacheable, not the read-only
// path), ordered after the caller's acquire of the writers' counter.
__device__ __forceinline__ uint4 ld_weak_u4(const void* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
// Activations: reused by every weight tile of the expert, so let L1 keep them.
__device__ __forceinline__ uint4 ld_cached_u4(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// Asks the copy engine to pull [p, p + bytes) into L2 (sm_90; p and bytes multiples of 16).
// Costs no registers, so a warp can keep far more bytes in flight than its loads alone.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// cp.async 16 bytes global -> shared; src_bytes = 0 zero-fills (rows past an expert's count).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

}  // namespace tetra::moe_detail
