// Causal varlen prefill attention on tensor cores, FlashAttention-2 style.
// Grid (query head, sequence, query tile of 128); 8 warps, each owning 16 query rows whose Q
// fragments stay in registers. The query-tile index runs backwards along blockIdx.z so the longest
// (most key tiles) blocks start first and the causal imbalance leaves no tail; heads of one kv group
// are neighbours in blockIdx.x, so their K/V reads meet in L2.
// Per key tile of 64: K and V rows arrive by cp.async into a 3-stage shared ring (rows padded by
// 16 bytes, so ldmatrix of 8 rows hits 8 distinct bank groups) while earlier tiles are computed. S = Q K^T by mma.sync m16n8k16 (bf16 in, fp32 accumulate, K fragments by ldmatrix),
// online softmax in the exp2 domain with the scale folded in, causal mask only on tiles that cross
// the warp's diagonal (tiles wholly above it are skipped per warp), then P is repacked in registers
// as bf16 A operands and O += P V (V fragments by ldmatrix.trans).
//
// m16n8k16 fragment layout (PTX ISA), lane = 4*gid + tq:
//   A (16x16, row): a0 = (gid, 2tq..+1), a1 = (gid+8, 2tq..), a2 = (gid, 2tq+8..), a3 = (gid+8, 2tq+8..)
//   B (16x8, col):  b0 = (k 2tq..+1, n gid), b1 = (k 2tq+8..+9, n gid)
//   C (16x8):       c0,c1 = (gid, 2tq..+1), c2,c3 = (gid+8, 2tq..+1)
// ldmatrix (x4): lane i addresses row i%8 of matrix i/8; register j of a lane then holds row gid,
// columns 2tq..+1 of matrix j (with .trans: row 2tq..+1, column gid, i.e. the transpose).
#include <cuda_bf16.h>

#include "core/error.h"
#include "core/kernel_smem_attr.h"
#include "ops/attention/attention_cuda.h"

namespace tetra::ops::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileQ = 16 * kWarps;  // query rows per block
constexpr int kTileK = 64;           // keys per tile
constexpr int kPad = 8;              // bf16 of padding per shared row
constexpr int kStages = 3;           // shared ring depth: tiles j+1, j+2 load while j is computed
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
constexpr int row_elems() { return D + kPad; }
// One stage: K tile then V tile, each [kTileK][D + kPad] bf16.
template <int D>
constexpr int stage_elems() { return 2 * kTileK * row_elems<D>(); }
template <int D>
constexpr size_t smem_bytes() { return size_t(kStages) * stage_elems<D>() * 2; }

struct PrefillArgs {
  const __nv_bfloat16* q;  // [T, Hq, D] with q_step
  const __nv_bfloat16* k;  // [T, Hk, D] with kv_step
  const __nv_bfloat16* v;
  const int32_t* cu_seqlens;  // [num_seqs + 1]
  int n_heads, group;
  int64_t q_step, kv_step;
  float scale_log2;  // softmax scale * log2(e)
  __nv_bfloat16* out;  // [T, Hq, D]
};

__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const __nv_bfloat16* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const __nv_bfloat16* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16 bytes global -> shared; src_bytes 0 writes zeros (rows past the sequence) without reading.
__device__ __forceinline__ void cp_async_16(__nv_bfloat16* dst, const __nv_bfloat16* src, int src_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(addr), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 two = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&two);
}

__device__ __forceinline__ uint32_t ld32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Starts the copy of key tile `key0` (K and V rows of kv head kh) into one ring stage.
template <int D>
__device__ __forceinline__ void load_kv_tile(__nv_bfloat16* stage, const PrefillArgs& a, int start,
                                             int len, int kh, int key0) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
  __nv_bfloat16* k_s = stage;                            // [kTileK][D + kPad]
  __nv_bfloat16* v_s = stage + kTileK * row_elems<D>();  // [kTileK][D + kPad]
  static_assert(kTileK * kChunks % kThreads == 0, "every thread copies the same number of pieces");
#pragma unroll
  for (int i = 0; i < kTileK * kChunks / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int j = c / kChunks, d8 = (c % kChunks) * 8;
    const bool in = key0 + j < len;
    const int64_t off = int64_t(start + (in ? key0 + j : 0)) * a.kv_step + int64_t(kh) * D + d8;
    cp_async_16(k_s + j * row_elems<D>() + d8, a.k + off, in ? 16 : 0);
    cp_async_16(v_s + j * row_elems<D>() + d8, a.v + off, in ? 16 : 0);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads, D == 64 ? 2 : 1) prefill_kernel(PrefillArgs a) {
  constexpr int kSteps = D / 16;         // k-steps of Q K^T
  constexpr int kDTiles = D / 8;         // n-tiles of O
  constexpr int kKeyTiles = kTileK / 8;  // n-tiles of S
  constexpr int kRow = row_elems<D>();
  extern __shared__ __align__(16) __nv_bfloat16 smem[];  // [kStages][K, V][kTileK][D + kPad]

  const int h = blockIdx.x, b = blockIdx.y, kh = h / a.group;
  const int start = a.cu_seqlens[b], len = a.cu_seqlens[b + 1] - start;
  const int q0 = (gridDim.z - 1 - blockIdx.z) * kTileQ;  // longest tiles first
  if (q0 >= len) return;  // the whole block leaves before any barrier
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tq = lane % 4;
  const int w0 = q0 + warp * 16;                // this warp's first query row
  const int r0 = w0 + gid, r1 = r0 + 8;         // this lane's two query rows

  const int last_row = min(q0 + kTileQ, len) - 1;
  const int num_tiles = last_row / kTileK + 1;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {  // fill the ring but one stage
    if (st < num_tiles) load_kv_tile<D>(smem + st * stage_elems<D>(), a, start, len, kh, st * kTileK);
    cp_async_commit();  // possibly empty: keeps one group per tile
  }

  uint32_t qa[kSteps][4];  // Q rows r0/r1 as A fragments
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    const int col = ks * 16 + 2 * tq;
    const __nv_bfloat16* p0 = a.q + int64_t(start + r0) * a.q_step + int64_t(h) * D + col;
    const __nv_bfloat16* p1 = a.q + int64_t(start + r1) * a.q_step + int64_t(h) * D + col;
    qa[ks][0] = r0 < len ? ld32(p0) : 0u;
    qa[ks][1] = r1 < len ? ld32(p1) : 0u;
    qa[ks][2] = r0 < len ? ld32(p0 + 8) : 0u;
    qa[ks][3] = r1 < len ? ld32(p1 + 8) : 0u;
  }
  float o[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  // Running max (in scaled log2 units) and this lane's part of the sum, rows r0, r1. Tile 0 holds
  // key 0, visible to every row, so m is finite after it and exp2(-inf - m) = 0 stays clean.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  // ldmatrix lane addressing: row within an 8x8 matrix and which of the four matrices.
  const int lrow = lane % 8, lmat = lane / 8;

  for (int kt = 0; kt < num_tiles; ++kt) {
    const int key0 = kt * kTileK;
    cp_async_wait<kStages - 2>();  // tile kt has landed (this thread's part)
    __syncthreads();  // ... and every thread's; and every warp is done with tile kt-1's stage
    const int next = kt + kStages - 1;  // refills the stage tile kt-1 used
    if (next < num_tiles)
      load_kv_tile<D>(smem + (next % kStages) * stage_elems<D>(), a, start, len, kh, next * kTileK);
    cp_async_commit();  // possibly empty: keeps one group per tile

    // A warp whose rows all sit above this tile's first key gets nothing from it.
    if (key0 <= w0 + 15) {
      const __nv_bfloat16* k_s = smem + (kt % kStages) * stage_elems<D>();
      const __nv_bfloat16* v_s = k_s + kTileK * kRow;

      float s[kKeyTiles][4];
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < kSteps; ks += 2) {
          uint32_t kb[4];  // b0,b1 of k-step ks, then of ks+1
          ldmatrix_x4(kb, k_s + (nt * 8 + lrow) * kRow + ks * 16 + lmat * 8);
          mma_16816(s[nt], qa[ks], kb[0], kb[1]);
          mma_16816(s[nt], qa[ks + 1], kb[2], kb[3]);
        }
      }
      // Only a tile reaching past the warp's first row can hold a key > row.
      if (key0 + kTileK - 1 > w0) {
#pragma unroll
        for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + nt * 8 + 2 * tq + (e & 1);
            if (key > (e < 2 ? r0 : r1)) s[nt][e] = -INFINITY;
          }
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt) {
        mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
      }
      float corr[2], neg_m[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m[r], mx[r] * a.scale_log2);
        corr[r] = exp2f(m[r] - m_new);
        m[r] = m_new;
        neg_m[r] = -m_new;
        l[r] *= corr[r];
      }
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = exp2f(fmaf(s[nt][e], a.scale_log2, neg_m[e / 2]));
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
        for (int dt = 0; dt < kDTiles; dt += 2) {
          uint32_t vb[4];  // b0,b1 of d-tile dt, then of dt+1
          ldmatrix_x4_trans(vb, v_s + (kk * 16 + (lmat & 1) * 8 + lrow) * kRow + (dt + (lmat >> 1)) * 8);
          mma_16816(o[dt], pa, vb[0], vb[1]);
          mma_16816(o[dt + 1], pa, vb[2], vb[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing may stay in flight at exit (the last groups are empty)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  const float inv0 = 1.0f / l[0], inv1 = 1.0f / l[1];
  const int64_t out_step = int64_t(a.n_heads) * D;
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) {
    const int col = dt * 8 + 2 * tq;
    if (r0 < len)
      *reinterpret_cast<__nv_bfloat162*>(a.out + int64_t(start + r0) * out_step + int64_t(h) * D + col) =
          __floats2bfloat162_rn(o[dt][0] * inv0, o[dt][1] * inv0);
    if (r1 < len)
      *reinterpret_cast<__nv_bfloat162*>(a.out + int64_t(start + r1) * out_step + int64_t(h) * D + col) =
          __floats2bfloat162_rn(o[dt][2] * inv1, o[dt][3] * inv1);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int D>
cudaError_t launch_prefill(const PrefillArgs& a, int num_seqs, int max_seqlen, cudaStream_t stream) {
  constexpr size_t kSmem = smem_bytes<D>();
  const cudaError_t attr = ensure_max_dynamic_smem<prefill_kernel<D>>(int(kSmem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(a.n_heads, num_seqs, (max_seqlen + kTileQ - 1) / kTileQ);
  prefill_kernel<D><<<grid, kThreads, kSmem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t prefill_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                              const int32_t* cu_seqlens, int num_seqs, int max_seqlen,
                              const AttentionShape& s, uint16_t* out, cudaStream_t stream) {
  check_attention_shape(s);
  TETRA_CHECK(attention_head_dim_supported(s.head_dim), "prefill attention: head_dim ", s.head_dim,
              " unsupported (64 or 128)");
  TETRA_CHECK(num_seqs >= 0 && max_seqlen >= 0, "prefill attention: num_seqs ", num_seqs,
              " max_seqlen ", max_seqlen);
  TETRA_CHECK(num_seqs <= 65535, "prefill attention: ", num_seqs, " sequences (at most 65535)");
  TETRA_CHECK(s.q_step() % 2 == 0 && reinterpret_cast<uintptr_t>(q) % 4 == 0,
              "prefill attention: q must allow 4-byte loads");
  TETRA_CHECK(s.kv_step() % 8 == 0 && aligned16(k) && aligned16(v),
              "prefill attention: k/v must allow 16-byte loads (aligned, stride % 8 == 0)");
  if (num_seqs == 0 || max_seqlen == 0) return cudaSuccess;
  PrefillArgs a{reinterpret_cast<const __nv_bfloat16*>(q), reinterpret_cast<const __nv_bfloat16*>(k),
                reinterpret_cast<const __nv_bfloat16*>(v), cu_seqlens, s.n_heads,
                s.n_heads / s.n_kv_heads, s.q_step(), s.kv_step(), s.scale * kLog2e,
                reinterpret_cast<__nv_bfloat16*>(out)};
  return s.head_dim == 64 ? launch_prefill<64>(a, num_seqs, max_seqlen, stream)
                          : launch_prefill<128>(a, num_seqs, max_seqlen, stream);
}

}  // namespace tetra::ops::cuda
