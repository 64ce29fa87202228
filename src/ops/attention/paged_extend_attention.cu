// Extend attention on the GPU (ops/attention/paged_extend_attention.h): one warp per (new token,
// query head). The warp copies its query row to shared memory as float, then walks the keys
// 0 .. pos of its sequence 32 at a time: lane i scores key j0 + i (a full dot product over the
// paged cache row, 16-byte loads), the warp keeps an online softmax (running max m and sum l,
// rescaling the accumulator when m grows), and for the value sum each lane owns head_dim / 32
// consecutive output dims and reads every key's value row (coalesced across the warp).
// Float throughout, one bf16 rounding of the output: agrees with the CPU twin up to summation
// order. No tensor cores: correct first (chunked prefill is a small part of a serving step).
#include <cuda_bf16.h>

#include "core/error.h"
#include "ops/attention/paged_extend_attention.h"

namespace tetra::ops::cuda {
namespace {

constexpr int kWarps = 4;  // (token, head) pairs per block

struct ExtendArgs {
  const __nv_bfloat16* q;     // [T, Hq, D] with q_step
  const int32_t* cu_seqlens;  // [S + 1]
  int num_seqs, num_tokens, n_heads, group;
  int64_t q_step;
  float scale;
  const __nv_bfloat16* k_cache;  // [num_blocks, block_size, Hk, D]
  const __nv_bfloat16* v_cache;
  const int32_t* block_tables;   // [S, max_blocks_per_seq]
  const int32_t* seq_lens;       // [S]
  int block_size, max_blocks_per_seq;
  int64_t token_elems;           // Hk * D
  __nv_bfloat16* out;            // [T, Hq, D]
};

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32) extend_kernel(ExtendArgs a) {
  constexpr int kPer = D / 32;  // output dims per lane
  __shared__ float q_s[kWarps][D];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t pair = int64_t(blockIdx.x) * kWarps + warp;
  if (pair >= int64_t(a.num_tokens) * a.n_heads) return;  // no block barriers below
  const int t = int(pair / a.n_heads), h = int(pair % a.n_heads), kh = h / a.group;
  // The sequence owning token t: the last b with cu_seqlens[b] <= t.
  int lo = 0, hi = a.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.cu_seqlens[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int b = lo;
  const int n_new = a.cu_seqlens[b + 1] - a.cu_seqlens[b];
  const int n_keys = a.seq_lens[b] - n_new + (t - a.cu_seqlens[b]) + 1;  // keys 0 .. pos
  const int32_t* table = a.block_tables + int64_t(b) * a.max_blocks_per_seq;

  const __nv_bfloat16* qr = a.q + int64_t(t) * a.q_step + int64_t(h) * D;
  for (int d = lane; d < D; d += 32) q_s[warp][d] = __bfloat162float(qr[d]);
  __syncwarp();

  float m = -INFINITY, l = 0.0f;
  float acc[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) acc[e] = 0.0f;

  for (int j0 = 0; j0 < n_keys; j0 += 32) {
    const int j = j0 + lane;
    float score = -INFINITY;
    if (j < n_keys) {
      const int64_t slot = int64_t(table[j / a.block_size]) * a.block_size + j % a.block_size;
      const uint4* kr = reinterpret_cast<const uint4*>(a.k_cache + slot * a.token_elems + int64_t(kh) * D);
      float dot = 0.0f;
#pragma unroll
      for (int c = 0; c < D / 8; ++c) {
        const uint4 raw = kr[c];
        const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 kf = __bfloat1622float2(pairs[e]);
          dot += q_s[warp][c * 8 + 2 * e] * kf.x + q_s[warp][c * 8 + 2 * e + 1] * kf.y;
        }
      }
      score = dot * a.scale;
    }
    const float m_new = fmaxf(m, warp_max(score));
    const float corr = m == -INFINITY ? 0.0f : __expf(m - m_new);
    const float p = j < n_keys ? __expf(score - m_new) : 0.0f;
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[e] *= corr;
    m = m_new;
    const int keys_here = min(32, n_keys - j0);
    for (int kk = 0; kk < keys_here; ++kk) {
      const float pk = __shfl_sync(0xffffffffu, p, kk);
      const int jj = j0 + kk;
      const int64_t slot = int64_t(table[jj / a.block_size]) * a.block_size + jj % a.block_size;
      const __nv_bfloat16* vr = a.v_cache + slot * a.token_elems + int64_t(kh) * D + lane * kPer;
#pragma unroll
      for (int e = 0; e < kPer; e += 2) {
        const float2 vf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(vr + e));
        acc[e] += pk * vf.x;
        acc[e + 1] += pk * vf.y;
      }
    }
  }
  __nv_bfloat16* o = a.out + pair * D + lane * kPer;
  const float inv = 1.0f / l;
#pragma unroll
  for (int e = 0; e < kPer; e += 2)
    *reinterpret_cast<__nv_bfloat162*>(o + e) = __floats2bfloat162_rn(acc[e] * inv, acc[e + 1] * inv);
}

}  // namespace

cudaError_t paged_extend_attention(const uint16_t* q, const int32_t* cu_seqlens, int num_seqs,
                                   int num_tokens, const PagedKv& kv, const AttentionShape& s,
                                   uint16_t* out, cudaStream_t stream) {
  check_attention_shape(s);
  TETRA_CHECK(s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256,
              "extend attention (cuda): head_dim ", s.head_dim, " is not 64, 128 or 256");
  TETRA_CHECK(kv.block_size > 0 && kv.num_blocks > 0 && kv.max_blocks_per_seq > 0,
              "extend attention (cuda): block_size ", kv.block_size, " num_blocks ", kv.num_blocks);
  TETRA_CHECK(num_seqs >= 1 && num_tokens >= 0, "extend attention (cuda): ", num_seqs, " sequences, ",
              num_tokens, " tokens");
  if (num_tokens == 0) return cudaSuccess;
  ExtendArgs a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(q);
  a.cu_seqlens = cu_seqlens;
  a.num_seqs = num_seqs;
  a.num_tokens = num_tokens;
  a.n_heads = s.n_heads;
  a.group = s.n_heads / s.n_kv_heads;
  a.q_step = s.q_step();
  a.scale = s.scale;
  a.k_cache = reinterpret_cast<const __nv_bfloat16*>(kv.k_cache);
  a.v_cache = reinterpret_cast<const __nv_bfloat16*>(kv.v_cache);
  a.block_tables = kv.block_tables;
  a.seq_lens = kv.seq_lens;
  a.block_size = kv.block_size;
  a.max_blocks_per_seq = kv.max_blocks_per_seq;
  a.token_elems = int64_t(s.n_kv_heads) * s.head_dim;
  a.out = reinterpret_cast<__nv_bfloat16*>(out);
  const int64_t pairs = int64_t(num_tokens) * s.n_heads;
  const dim3 grid(unsigned((pairs + kWarps - 1) / kWarps));
  switch (s.head_dim) {
    case 64: extend_kernel<64><<<grid, kWarps * 32, 0, stream>>>(a); break;
    case 128: extend_kernel<128><<<grid, kWarps * 32, 0, stream>>>(a); break;
    default: extend_kernel<256><<<grid, kWarps * 32, 0, stream>>>(a); break;
  }
  return cudaGetLastError();
}

}  // namespace tetra::ops::cuda
