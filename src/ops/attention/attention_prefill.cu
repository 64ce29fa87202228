// Causal varlen prefill attention on tensor cores, FlashAttention-2 style.
// Grid (query tile of 64, query head, sequence); 4 warps, each owning 16 query rows. Per key tile
// of 64: K and V^T are staged in shared memory, S = Q K^T by mma.sync m16n8k16 (bf16 in, fp32
// accumulate), scale + causal mask, online softmax (running max and sum per row), then the
// P fragments are repacked in registers as bf16 A operands and O += P V by the same MMA.
// Single-stage: loads and MMAs do not overlap yet (no cp.async pipeline); correctness first.
//
// m16n8k16 fragment layout (PTX ISA), lane = 4*gid + tq:
//   A (16x16, row): a0 = (gid, 2tq..+1), a1 = (gid+8, 2tq..), a2 = (gid, 2tq+8..), a3 = (gid+8, 2tq+8..)
//   B (16x8, col):  b0 = (k 2tq..+1, n gid), b1 = (k 2tq+8..+9, n gid)
//   C (16x8):       c0,c1 = (gid, 2tq..+1), c2,c3 = (gid+8, 2tq..+1)
#include <cuda_bf16.h>

#include "core/error.h"
#include "ops/attention/attention_cuda.h"

namespace tetra::ops::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kTileQ = 16 * kWarps;  // query rows per block
constexpr int kTileK = 64;           // keys per tile
constexpr int kPad = 8;              // bf16 of padding per shared row: spreads the banks

struct PrefillArgs {
  const __nv_bfloat16* q;  // [T, Hq, D] with q_step
  const __nv_bfloat16* k;  // [T, Hk, D] with kv_step
  const __nv_bfloat16* v;
  const int32_t* cu_seqlens;  // [num_seqs + 1]
  int n_heads, group;
  int64_t q_step, kv_step;
  float scale;
  __nv_bfloat16* out;  // [T, Hq, D]
};

__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 two = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&two);
}

__device__ __forceinline__ uint32_t ld32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32) prefill_kernel(PrefillArgs a) {
  constexpr int kSteps = D / 16;        // k-steps of Q K^T
  constexpr int kDTiles = D / 8;        // n-tiles of O
  constexpr int kKeyTiles = kTileK / 8; // n-tiles of S
  __shared__ __align__(16) __nv_bfloat16 k_s[kTileK][D + kPad];   // [key][dim]
  __shared__ __align__(16) __nv_bfloat16 vt_s[D][kTileK + kPad];  // [dim][key]

  const int b = blockIdx.z, h = blockIdx.y, kh = h / a.group;
  const int start = a.cu_seqlens[b], len = a.cu_seqlens[b + 1] - start;
  const int q0 = blockIdx.x * kTileQ;
  if (q0 >= len) return;  // the whole block leaves before any barrier
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tq = lane % 4;
  const int r0 = q0 + warp * 16 + gid, r1 = r0 + 8;  // this lane's two query rows

  uint32_t qa[kSteps][4];  // Q rows r0/r1 as A fragments
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    const int col = ks * 16 + 2 * tq;
    const __nv_bfloat16* p0 = a.q + (start + r0) * a.q_step + int64_t(h) * D + col;
    const __nv_bfloat16* p1 = a.q + (start + r1) * a.q_step + int64_t(h) * D + col;
    qa[ks][0] = r0 < len ? ld32(p0) : 0u;
    qa[ks][1] = r1 < len ? ld32(p1) : 0u;
    qa[ks][2] = r0 < len ? ld32(p0 + 8) : 0u;
    qa[ks][3] = r1 < len ? ld32(p1 + 8) : 0u;
  }
  float o[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows r0, r1 (l: this lane's part)

  const int last_row = min(q0 + kTileQ, len) - 1;
  const int num_tiles = last_row / kTileK + 1;
  for (int kt = 0; kt < num_tiles; ++kt) {
    const int key0 = kt * kTileK;
    __syncthreads();  // the previous tile is no longer read
    for (int c = threadIdx.x; c < kTileK * D / 8; c += kWarps * 32) {
      const int j = c / (D / 8), d8 = (c % (D / 8)) * 8;
      uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);  // zeros past the end
      if (key0 + j < len) {
        const int64_t off = (start + key0 + j) * a.kv_step + int64_t(kh) * D + d8;
        kv4 = *reinterpret_cast<const uint4*>(a.k + off);
        vv4 = *reinterpret_cast<const uint4*>(a.v + off);
      }
      *reinterpret_cast<uint4*>(&k_s[j][d8]) = kv4;
      const __nv_bfloat16* ve = reinterpret_cast<const __nv_bfloat16*>(&vv4);
#pragma unroll
      for (int e = 0; e < 8; ++e) vt_s[d8 + e][j] = ve[e];
    }
    __syncthreads();

    float s[kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks)
        mma_16816(s[nt], qa[ks], ld32(&k_s[nt * 8 + gid][ks * 16 + 2 * tq]),
                  ld32(&k_s[nt * 8 + gid][ks * 16 + 8 + 2 * tq]));
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + nt * 8 + 2 * tq + (e & 1);
        const int row = e < 2 ? r0 : r1;
        const float val = (key > row || key >= len) ? -INFINITY : s[nt][e] * a.scale;
        s[nt][e] = val;
        mx[e / 2] = fmaxf(mx[e / 2], val);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      corr[r] = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);  // first tile: exp(-inf) = 0
      m[r] = m_new;
      l[r] *= corr[r];
    }
#pragma unroll
    for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float mr = m[e / 2];
        const float p = mr == -INFINITY ? 0.0f : expf(s[nt][e] - mr);
        s[nt][e] = p;
        l[e / 2] += p;
      }
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      o[dt][0] *= corr[0];
      o[dt][1] *= corr[0];
      o[dt][2] *= corr[1];
      o[dt][3] *= corr[1];
    }
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]),
                              pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt)
        mma_16816(o[dt], pa, ld32(&vt_s[dt * 8 + gid][kk * 16 + 2 * tq]),
                  ld32(&vt_s[dt * 8 + gid][kk * 16 + 8 + 2 * tq]));
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const int64_t out_step = int64_t(a.n_heads) * D;
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) {
    const int col = dt * 8 + 2 * tq;
    if (r0 < len)
      *reinterpret_cast<__nv_bfloat162*>(a.out + (start + r0) * out_step + int64_t(h) * D + col) =
          __floats2bfloat162_rn(o[dt][0] / l[0], o[dt][1] / l[0]);
    if (r1 < len)
      *reinterpret_cast<__nv_bfloat162*>(a.out + (start + r1) * out_step + int64_t(h) * D + col) =
          __floats2bfloat162_rn(o[dt][2] / l[1], o[dt][3] / l[1]);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t prefill_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                              const int32_t* cu_seqlens, int num_seqs, int max_seqlen,
                              const AttentionShape& s, uint16_t* out, cudaStream_t stream) {
  check_attention_shape(s);
  TETRA_CHECK(s.head_dim == 64 || s.head_dim == 128, "prefill attention: head_dim ", s.head_dim,
              " unsupported (64 or 128)");
  TETRA_CHECK(num_seqs >= 0 && max_seqlen >= 0, "prefill attention: num_seqs ", num_seqs,
              " max_seqlen ", max_seqlen);
  TETRA_CHECK(s.q_step() % 2 == 0 && reinterpret_cast<uintptr_t>(q) % 4 == 0,
              "prefill attention: q must allow 4-byte loads");
  TETRA_CHECK(s.kv_step() % 8 == 0 && aligned16(k) && aligned16(v),
              "prefill attention: k/v must allow 16-byte loads (aligned, stride % 8 == 0)");
  if (num_seqs == 0 || max_seqlen == 0) return cudaSuccess;
  PrefillArgs a{reinterpret_cast<const __nv_bfloat16*>(q), reinterpret_cast<const __nv_bfloat16*>(k),
                reinterpret_cast<const __nv_bfloat16*>(v), cu_seqlens, s.n_heads,
                s.n_heads / s.n_kv_heads, s.q_step(), s.kv_step(), s.scale,
                reinterpret_cast<__nv_bfloat16*>(out)};
  const dim3 grid((max_seqlen + kTileQ - 1) / kTileQ, s.n_heads, num_seqs);
  if (s.head_dim == 64)
    prefill_kernel<64><<<grid, kWarps * 32, 0, stream>>>(a);
  else
    prefill_kernel<128><<<grid, kWarps * 32, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace tetra::ops::cuda
