// Split paged decode attention (see split_decode_attention.h).
#include "model/cuda/split_decode_attention.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/fast_div.h"
#include "core/kernel_smem_attr.h"
#include "model/cuda/split_decode_plan.h"
#include "perf/block_stamps.cuh"
#include "ops/attention/attention_cuda.h"
#include "ops/rope/rope_turn.cuh"

namespace tetra::model::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 64;                 // tokens staged at once: 16 per warp
constexpr int kWarpTokens = kChunk / kWarps;
constexpr int kStages = 3;                 // chunks in flight per block
constexpr int kMaxGroup = ops::cuda::kDecodeMaxGroup;  // query heads per kv head: the MMA's M side
constexpr float kLog2e = 1.4426950408889634f;

struct SplitArgs {
  const uint16_t* q;        // [S, q_step] bf16, heads of kv head h at h*G*D
  const uint16_t* k_cache;  // [blocks, block_size, n_kv, D] bf16
  const uint16_t* v_cache;  // [blocks, block_size, n_kv, D] bf16
  const int32_t* tables;    // [S, max_blocks]
  const int32_t* lens;      // [S]
  const int32_t* plan;      // [S][splits][kSplitPlanInts] (split_decode_plan.h), or nullptr
  int max_blocks, block_size, n_kv, group;
  FastDiv block_div;  // position -> KV block: three instructions, not an integer division
  int64_t q_step;
  float scale_log2;  // softmax scale * log2(e): the softmax runs on exp2
  uint16_t* out;     // [S, H, D] bf16
  // PredecessorWrites::QAndNewKvRow: lengths, tables and all cache rows but position len - 1
  // are read before griddepcontrol.wait.
  bool early_kv;
  // RoPE inside the attention (DecodeRope; implies early_kv): q is un-rotated, and the row of
  // position len - 1 comes from rope.k_new / v_new, turned here and stored to the cache.
  bool rope_on;
  DecodeRope rope;
  unsigned long long* stamps = nullptr;  // perf/block_stamps.h (nullptr: none)
  int stamp_launch = 0;
};

template <int D>
constexpr int stage_bytes() { return 2 * kChunk * D * 2; }  // K rows then V rows, bf16
template <int D>
constexpr int smem_bytes() { return kStages * stage_bytes<D>(); }
// The end-of-kernel merge reuses the stage memory: per-warp partials [kWarps][16][D + 4] and
// the block's merged partial [16][D], floats.
template <int D>
constexpr int warp_row_floats() { return D + 4; }  // padded: float4 rows stay 16-byte aligned
template <int D>
constexpr int merge_bytes() { return (kWarps * kMaxGroup * warp_row_floats<D>() + kMaxGroup * D) * 4; }
static_assert(merge_bytes<64>() <= smem_bytes<64>() && merge_bytes<128>() <= smem_bytes<128>());

// Byte offset of 16-byte piece c of staged row j. Rows are D*2 bytes unpadded; the piece index
// is XORed with j % 8 so the 8 rows an ldmatrix phase reads (same piece, consecutive tokens)
// land in 8 distinct 16-byte bank groups.
template <int D>
__device__ __forceinline__ uint32_t swizzled(int j, int c) {
  return uint32_t(j * (D / 8) + (c ^ (j & 7))) * 16u;
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  // src-size 0 zero-fills: rows past the chunk's end become zeros (P = 0 must not meet NaNs).
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ uint4 load_16_l2(const uint16_t* src) {
  // .cg: from L2, where the predecessor's stores are, never from this SM's L1.
  return __ldcg(reinterpret_cast<const uint4*>(src));
}
__device__ __forceinline__ void store_16_shared(uint32_t dst, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b: m16n8k16, bf16 in, f32 accumulate.
__device__ __forceinline__ void mma_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi, float& sum) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  sum += __low2float(p) + __high2float(p);  // the running sum takes the rounded values P.V uses
  return *reinterpret_cast<const uint32_t*>(&p);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// A chunk's copies take two steps, so the block-table reads of the next chunk can be in flight
// while this one computes: chunk_rows reads the table (every read independent), issue_chunk
// starts the cp.async copies. Thread piece `it` of a chunk: idx = tid + it * 128, token
// j = idx / (D/8), 16-byte piece c = idx % (D/8). Since D/8 divides 128, c is the same for all
// of a thread's pieces and j = j0 + it * piece_row_step; the swizzle key j % 8 is j0 % 8 for
// every piece (the step is a multiple of 8), so a piece's shared offset is one constant plus
// it * step rows. At batch 1 each warp has a scheduler to itself and issues at ~5 cycles per
// instruction (Nsight Compute, session 22), so the per-thread terms are computed once
// (PieceGeometry) rather than per piece.
template <int D>
constexpr int pieces_per_thread() { return kChunk * (D / 8) / kThreads; }
template <int D>
constexpr int piece_row_step() { return kThreads / (D / 8); }
static_assert(piece_row_step<64>() % 8 == 0 && piece_row_step<128>() % 8 == 0);
static_assert(kStages * kChunk == kSplitPlanRows && kWarpTokens == kSplitAlign);

// This thread's share of every staged chunk.
struct PieceGeometry {
  int j0;            // row of piece 0 (piece it: row j0 + it * piece_row_step)
  int c;             // 16-byte piece of each row
  uint32_t smem0;    // stage offset of piece 0's bytes (piece it: + it * row step * D * 2)
  int64_t head_off;  // element offset of (kv head, piece) inside a cache row
  int64_t row_elems; // elements per cache row: n_kv * D
};
template <int D>
__device__ __forceinline__ PieceGeometry piece_geometry(const SplitArgs& a, int kh) {
  const unsigned tid = threadIdx.x;
  PieceGeometry p;
  p.j0 = int(tid / (D / 8));
  p.c = int(tid % (D / 8));
  p.smem0 = swizzled<D>(p.j0, p.c);
  p.head_off = int64_t(kh) * D + p.c * 8;
  p.row_elems = int64_t(a.n_kv) * D;
  return p;
}

// slot[it]: cache row (block * block_size + offset) of the thread's piece it of tokens
// c0 .. c0+n-1, -1 past the end.
template <int D>
__device__ __forceinline__ void chunk_rows(const SplitArgs& a, const PieceGeometry& pg,
                                           const int32_t* table, int c0, int n,
                                           int32_t (&slot)[pieces_per_thread<D>()]) {
#pragma unroll
  for (int it = 0; it < pieces_per_thread<D>(); ++it) {
    const int j = pg.j0 + it * piece_row_step<D>(), tok = c0 + j;
    slot[it] = -1;
    if (j < n) {
      const int blk = int(a.block_div.div(uint32_t(tok)));
      slot[it] = table[blk] * a.block_size + (tok - blk * a.block_size);
    }
  }
}

// chunk_rows from the step's plan: rows [kChunk] of one chunk, -1 past the block's end (loaded
// whatever the chunk's length, so they need not wait for the plan's header).
template <int D>
__device__ __forceinline__ void plan_rows(const PieceGeometry& pg, const int32_t* rows,
                                          int32_t (&slot)[pieces_per_thread<D>()]) {
#pragma unroll
  for (int it = 0; it < pieces_per_thread<D>(); ++it)
    slot[it] = rows[pg.j0 + it * piece_row_step<D>()];
}

// The thread's 16-byte piece of the K and V row that is copied late (after the wait): element
// offset in the caches and destinations in shared memory; off < 0 when the thread has none. A
// row's D/8 pieces go to D/8 consecutive idx, i.e. one piece each to D/8 threads (D/8 | 128).
struct LatePiece {
  int64_t off = -1;
  uint32_t k_dst = 0, v_dst = 0;
};

// late_j: staged row (token c0 + late_j) whose pieces get no copy here but are noted in `late`;
// -1 for none. Nothing else writes a skipped piece's shared memory, so the late copy does not
// race with a zero fill.
template <int D>
__device__ __forceinline__ void issue_chunk(const SplitArgs& a, const PieceGeometry& pg,
                                            const int32_t (&slot)[pieces_per_thread<D>()],
                                            uint32_t k_dst, uint32_t v_dst, int late_j,
                                            LatePiece& late) {
  constexpr uint32_t kPieceStride = uint32_t(piece_row_step<D>()) * D * 2;  // bytes per it
#pragma unroll
  for (int it = 0; it < pieces_per_thread<D>(); ++it) {
    const int64_t off = slot[it] >= 0 ? int64_t(slot[it]) * pg.row_elems + pg.head_off : 0;
    const uint32_t o = pg.smem0 + uint32_t(it) * kPieceStride;
    if (pg.j0 + it * piece_row_step<D>() == late_j) {  // j < n, so slot[it] >= 0
      late.off = off, late.k_dst = k_dst + o, late.v_dst = v_dst + o;
      continue;
    }
    cp_async_16(k_dst + o, a.k_cache + off, slot[it] >= 0);
    cp_async_16(v_dst + o, a.v_cache + off, slot[it] >= 0);
  }
}
template <int D>
__device__ __forceinline__ void issue_chunk(const SplitArgs& a, const PieceGeometry& pg,
                                            const int32_t (&slot)[pieces_per_thread<D>()],
                                            uint32_t k_dst, uint32_t v_dst) {
  LatePiece none;
  issue_chunk<D>(a, pg, slot, k_dst, v_dst, -1, none);
}

// Element e of register lo and of register hi (two distinct registers) turned as one pair.
__device__ __forceinline__ void rope_pair(uint32_t& lo, uint32_t& hi, int e, float sn, float cs) {
  __nv_bfloat162 l = *reinterpret_cast<__nv_bfloat162*>(&lo);
  __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162*>(&hi);
  __nv_bfloat16& a = e ? l.y : l.x;
  __nv_bfloat16& b = e ? h.y : h.x;
  ops::cuda::rope_turn(__bfloat162float(a), __bfloat162float(b), sn, cs, a, b);
  lo = *reinterpret_cast<uint32_t*>(&l);
  hi = *reinterpret_cast<uint32_t*>(&h);
}
// RoPE of the q fragments in registers (SplitArgs::rope_on). Fragment qa[ks][r] holds dims
// 16ks + 2t (+1) (r = 0, 1) or 16ks + 8 + 2t (+1) (r = 2, 3) of heads g (r even), g + 8 (r odd),
// so this thread holds both dims of every pair it needs: NeoX pairs (i, i + half) sit
// STEP = half/16 steps apart, GPT-J pairs (2i, 2i + 1) in one register (STEP = 0: GPT-J over
// `pairs` pairs). STEP is a template argument so that every register index is a constant.
// sn/cs [half]: the angles of the sequence's position, from shared memory.
template <int D, int STEP>
__device__ __forceinline__ void rope_q_fragments(uint32_t (&qa)[D / 16][4], int pairs, int t,
                                                 bool hi, const float* sn, const float* cs) {
  if constexpr (STEP > 0) {
#pragma unroll
    for (int ks = 0; ks < STEP; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (r % 2 && !hi) continue;
          const int i = 16 * ks + 2 * t + (r >= 2 ? 8 : 0) + e;
          rope_pair(qa[ks][r], qa[ks + STEP][r], e, sn[i], cs[i]);
        }
  } else {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      if (ks < pairs / 8)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if (r % 2 && !hi) continue;
          const int i = 8 * ks + t + (r >= 2 ? 4 : 0);
          __nv_bfloat162 p = *reinterpret_cast<__nv_bfloat162*>(&qa[ks][r]);
          ops::cuda::rope_turn(__bfloat162float(p.x), __bfloat162float(p.y), sn[i], cs[i], p.x,
                               p.y);
          qa[ks][r] = *reinterpret_cast<uint32_t*>(&p);
        }
  }
}
// rows: the group's query heads; rows g + 8 (odd registers) are turned only where some exist.
template <int D>
__device__ __forceinline__ void rope_q(uint32_t (&qa)[D / 16][4], const DecodeRope& r, int t,
                                       int rows, const float* sn, const float* cs) {
  const int half = r.rotary_dim / 2;
  const bool hi = rows > 8;  // warp-uniform
  if (!r.neox) return rope_q_fragments<D, 0>(qa, half, t, hi, sn, cs);
  switch (half / 16) {  // rotary_dim % 32 == 0 (split_decode_rope_unsupported_reason)
    case 1: return rope_q_fragments<D, 1>(qa, half, t, hi, sn, cs);
    case 2: return rope_q_fragments<D, 2>(qa, half, t, hi, sn, cs);
    case 3: if constexpr (D >= 96) return rope_q_fragments<D, 3>(qa, half, t, hi, sn, cs); break;
    case 4: if constexpr (D >= 128) return rope_q_fragments<D, 4>(qa, half, t, hi, sn, cs); break;
    default: break;
  }
}

// Element e of 8 bf16 held as 4 words (constant e after unrolling: stays in registers).
__device__ __forceinline__ float bf16_elem(const uint32_t (&w)[4], int e) {
  return __uint_as_float(e % 2 ? w[e / 2] & 0xffff0000u : w[e / 2] << 16);
}
__device__ __forceinline__ void set_bf16_elem(uint32_t (&w)[4], int e, __nv_bfloat16 v) {
  const uint32_t bits = __bfloat16_as_ushort(v);
  w[e / 2] = e % 2 ? (w[e / 2] & 0xffffu) | (bits << 16) : (w[e / 2] & 0xffff0000u) | bits;
}

// The new row's 16-byte piece c of kv head kh (SplitArgs::rope_on): k turned as the RoPE kernel
// turns it (a NeoX partner piece sits half/8 pieces away), v as it is.
template <int D>
__device__ __forceinline__ void rope_new_row_piece(const SplitArgs& a, int s, int kh, int c,
                                                   const float* sn, const float* cs, uint4& k,
                                                   uint4& v) {
  const DecodeRope& r = a.rope;
  const uint16_t* kr = r.k_new + int64_t(s) * r.k_stride + int64_t(kh) * D;
  k = load_16_l2(kr + 8 * c);
  v = load_16_l2(r.v_new + int64_t(s) * r.v_stride + int64_t(kh) * D + 8 * c);
  const int half = r.rotary_dim / 2;
  if (8 * c >= r.rotary_dim) return;  // pass-through dims
  uint32_t x[4] = {k.x, k.y, k.z, k.w};
  if (r.neox) {
    const bool low = 8 * c < half;
    const uint4 o = load_16_l2(kr + 8 * c + (low ? half : -half));
    const uint32_t y[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int i = 8 * c + e - (low ? 0 : half);
      const float self = bf16_elem(x, e), partner = bf16_elem(y, e);
      __nv_bfloat16 ra, rb;
      ops::cuda::rope_turn(low ? self : partner, low ? partner : self, sn[i], cs[i], ra, rb);
      set_bf16_elem(x, e, low ? ra : rb);
    }
  } else {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int i = 4 * c + p;
      __nv_bfloat16 ra, rb;
      ops::cuda::rope_turn(bf16_elem(x, 2 * p), bf16_elem(x, 2 * p + 1), sn[i], cs[i], ra, rb);
      set_bf16_elem(x, 2 * p, ra);
      set_bf16_elem(x, 2 * p + 1, rb);
    }
  }
  k = make_uint4(x[0], x[1], x[2], x[3]);
}

// The cluster's merge through distributed shared memory: block `split` of `splits` (<= P)
// finishes items split*128 + tid, (split + splits)*128 + tid, ... (item = 4 dims of one head)
// from every block's partial (block_m, block_l [16], block_acc [16][D/4] float4) and stores them
// as bf16 to out_kh ([G][D]: this kv head's query heads).
template <int D, int P>
__device__ __forceinline__ void cluster_merge(const cg::cluster_group& cluster, int splits,
                                              int split, int items, const float* block_m,
                                              const float* block_l, const float4* block_acc,
                                              uint16_t* out_kh) {
  for (int idx = split * kThreads + int(threadIdx.x); idx < items; idx += splits * kThreads) {
    const int i = idx / (D / 4);
    float mp[P];
    float mx = -INFINITY;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      mp[p] = p < splits ? *cluster.map_shared_rank(block_m + i, p) : -INFINITY;
      mx = fmaxf(mx, mp[p]);
    }
    float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float den = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (p < splits && mp[p] != -INFINITY) {
        const float e = exp2f(mp[p] - mx);
        const float4 v = *cluster.map_shared_rank(block_acc + idx, p);
        num.x += e * v.x, num.y += e * v.y, num.z += e * v.z, num.w += e * v.w;
        den += e * *cluster.map_shared_rank(block_l + i, p);
      }
    }
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;  // an empty sequence gives zeros
    const __nv_bfloat162 lo = __floats2bfloat162_rn(num.x * inv, num.y * inv);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(num.z * inv, num.w * inv);
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&lo);
    packed.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(out_kh + int64_t(i) * D + 4 * (idx % (D / 4))) = packed;
  }
}

// Grid (splits, n_kv, S), clusters of (splits, 1, 1): block r of a cluster owns split r of
// (sequence blockIdx.z, kv head blockIdx.y). Warp w owns tokens 16w .. 16w+15 of every chunk
// and keeps the softmax state (max m, sum l, unnormalised acc) of its tokens for the group's
// heads; in the m16n8k16 fragments lane (g, t) = (lane / 4, lane % 4) holds heads g and g + 8.
// Three 32 KB stages (D = 128) let 2 blocks share an SM (small grids ask for one SM each, see
// launch_split_decode). Measured on the H200 against two stages
// at 3 blocks per SM: batch 64 x 1025 tokens 77.7 vs 84.7 us (best split count of each),
// batch 1 9.6 vs 10.7 us; batch 8 was within 10% either way.
// With a.early_kv (PredecessorWrites::QAndNewKvRow) the prologue's reads overlap the preceding
// kernel: only q and the cache row of position len - 1 are read after griddepcontrol.wait.
template <int D>
__global__ void __launch_bounds__(kThreads, 2) split_decode_kernel(SplitArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];  // [kStages][K, V][64][D] bf16, swizzled
  __shared__ float warp_m[kWarps][kMaxGroup], warp_l[kWarps][kMaxGroup];
  __shared__ float block_m[kMaxGroup], block_l[kMaxGroup];
  __shared__ float rope_sn[D / 2], rope_cs[D / 2];  // rope_on: angles of the sequence's position

  const uint64_t t_start = perf::stamp_time();
  // A programmatic dependent (the o_proj GEMV) may start streaming its weights now; it waits for
  // this grid before it reads the attention output.
  asm volatile("griddepcontrol.launch_dependents;");
  // Launched as a programmatic dependent itself (of the RoPE + KV write, or with rope_on of the
  // q/k/v projection). Without early_kv, wait
  // for it before reading anything; with it, only before reading q and the row of position
  // len - 1 (see the prologue). The "memory" clobber keeps the compiler from hoisting loads.
  if (!a.early_kv) asm volatile("griddepcontrol.wait;" ::: "memory");
  cg::cluster_group cluster = cg::this_cluster();
  const int splits = int(gridDim.x), split = int(blockIdx.x), kh = int(blockIdx.y), s = int(blockIdx.z);
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // rope_on: the position's angles into shared memory, one pair per thread (positions and
  // inv_freq are step inputs and a constant: read before the wait). q is turned before the chunk
  // loop's first barrier, so they need a barrier of their own.
  if (a.rope_on) {
    const float pos = float(a.rope.positions[s]);
    for (int i = tid; i < a.rope.rotary_dim / 2; i += kThreads)
      sincosf(pos * a.rope.inv_freq[i], &rope_sn[i], &rope_cs[i]);
    __syncthreads();
  }
  const int G = a.group;
  // This block's tokens and the cache rows of its first kStages chunks: from the step's plan in
  // one round trip (its header and rows are independent loads), or from the lengths and then
  // the block table.
  const int32_t* plan = a.plan ? a.plan + (int64_t(s) * splits + split) * kSplitPlanInts : nullptr;
  int len, begin, end;
  if (plan) {
    const SplitPlanHeader h = *reinterpret_cast<const SplitPlanHeader*>(plan);
    begin = h.begin, end = h.end, len = h.len;
  } else {
    len = a.lens[s];
    const SplitRange r = split_range(len, splits, split);
    begin = r.begin, end = r.end;
  }
  const int chunks = (end - begin + kChunk - 1) / kChunk;
  const int32_t* table = a.tables + int64_t(s) * a.max_blocks;
  const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));

  // Prologue: the table rows of the first kStages chunks (one round trip), their copies, then
  // the rows of the next chunk, which arrive while chunk 0 computes. With early_kv all of it runs
  // before the wait (lens, tables and the older cache rows are complete before the predecessor
  // starts) except the copy of position len - 1, the row the predecessor may be writing: it is
  // in at most one chunk, the last of the block holding the end of the sequence.
  constexpr int kPieces = pieces_per_thread<D>();
  const PieceGeometry pg = piece_geometry<D>(a, kh);
  LatePiece late;
  {
    int32_t first[kStages][kPieces];
#pragma unroll
    for (int c = 0; c < kStages; ++c) {
      const int c0 = begin + c * kChunk;
      if (plan)
        plan_rows<D>(pg, plan + kSplitPlanHeader + c * kChunk, first[c]);
      else
        chunk_rows<D>(a, pg, table, c0, c < chunks ? min(kChunk, end - c0) : 0, first[c]);
    }
#pragma unroll
    for (int c = 0; c < kStages; ++c) {
      const uint32_t k_dst = base + c * stage_bytes<D>();
      const int c0 = begin + c * kChunk;
      const bool has_late = a.early_kv && len - 1 >= c0 && len - 1 < min(end, c0 + kChunk);
      const int late_j = has_late ? len - 1 - c0 : -1;
      if (c < chunks)
        issue_chunk<D>(a, pg, first[c], k_dst, k_dst + stage_bytes<D>() / 2, late_j, late);
      cp_async_commit();  // empty groups too: the wait count below stays kStages - 1
    }
  }
  int32_t next[kPieces];  // table rows of chunk c + kStages
  {
    const int c0 = begin + kStages * kChunk;
    chunk_rows<D>(a, pg, table, c0, kStages < chunks ? min(kChunk, end - c0) : 0, next);
  }
  // After the wait the predecessor's writes are visible. The late piece is loaded here and
  // stored to shared memory below, after q's loads are issued (two round trips would otherwise
  // be in series) and before the first __syncthreads of the chunk loop, which publishes it to
  // the other warps before any chunk is computed. A row of a later chunk is copied by the loop,
  // which runs after the wait anyway.
  // rope_on: the block holding position len - 1 makes that row itself, in whichever chunk it
  // falls: the thread holding piece `new_piece` of it (row new_j of its chunk) turns it now,
  // stores it to the cache and into the stage when its chunk is issued (the copies skip it).
  const int new_j =
      a.rope_on && len - 1 >= begin && len - 1 < end ? (len - 1 - begin) % kChunk : -1;
  // The thread's rows are j0 + it * row step (it < kPieces): it holds a piece of row new_j
  // when the difference is a non-negative multiple of the step inside that range.
  const int new_dj = new_j - pg.j0;
  const int new_piece = new_j >= 0 && new_dj >= 0 && new_dj % piece_row_step<D>() == 0 &&
                                new_dj / piece_row_step<D>() < kPieces
                            ? pg.c
                            : -1;
  if (a.early_kv) asm volatile("griddepcontrol.wait;" ::: "memory");
  const uint64_t t_waited = perf::stamp_time();
  uint4 late_k = make_uint4(0u, 0u, 0u, 0u), late_v = late_k;
  if (new_piece >= 0) {
    rope_new_row_piece<D>(a, s, kh, new_piece, rope_sn, rope_cs, late_k, late_v);
    // Into the cache at the token's slot, as rope_and_write_kv stores it (padding: no slot).
    const int64_t slot = a.rope.slots[s];
    if (slot >= 0 && slot < a.rope.num_slots) {
      const int64_t off = (slot * a.n_kv + kh) * D + 8 * new_piece;
      *reinterpret_cast<uint4*>(a.rope.k_cache + off) = late_k;
      *reinterpret_cast<uint4*>(a.rope.v_cache + off) = late_v;
    }
  } else if (late.off >= 0 && !a.rope_on) {
    late_k = load_16_l2(a.k_cache + late.off);
    late_v = load_16_l2(a.v_cache + late.off);
  }

  // Q as A fragments for all of D, straight from global (rows >= G are zero); after the wait:
  // the predecessor (RoPE) writes q in place, or (rope_on) the projection writes it un-rotated.
  uint32_t qa[D / 16][4];
  const uint16_t* qh = a.q + int64_t(s) * a.q_step + int64_t(kh) * G * D;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int d0 = 16 * ks + 2 * t;
    qa[ks][0] = g < G ? *reinterpret_cast<const uint32_t*>(qh + g * D + d0) : 0u;
    qa[ks][1] = g + 8 < G ? *reinterpret_cast<const uint32_t*>(qh + (g + 8) * D + d0) : 0u;
    qa[ks][2] = g < G ? *reinterpret_cast<const uint32_t*>(qh + g * D + d0 + 8) : 0u;
    qa[ks][3] = g + 8 < G ? *reinterpret_cast<const uint32_t*>(qh + (g + 8) * D + d0 + 8) : 0u;
  }
  if (a.rope_on) rope_q<D>(qa, a.rope, t, G, rope_sn, rope_cs);
  if (late.off >= 0) {
    store_16_shared(late.k_dst, late_k);
    store_16_shared(late.v_dst, late_v);
  }
  float acc[D / 8][4];  // [dim tile][c fragment]: dims 8j + 2t (+1) of heads g (0, 1), g + 8 (2, 3)
#pragma unroll
  for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY;  // log2-scaled running max of heads g, g + 8
  float l_lo = 0.0f, l_hi = 0.0f;            // this thread's share of the running sums

  const int tok0 = warp * kWarpTokens;
  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<kStages - 1>();
    __syncthreads();  // every thread's copies of chunk c have landed
    const int c0 = begin + c * kChunk, n = min(kChunk, end - c0);
    const uint32_t k_st = base + (c % kStages) * stage_bytes<D>();
    const uint32_t v_st = k_st + stage_bytes<D>() / 2;
    if (tok0 < n) {  // warp-uniform: a warp whose 16 tokens are all past the end has nothing
      const int mi = lane / 8, r = lane % 8;  // ldmatrix: lane r of matrix mi gives a row address
      // [chain][token tile][c fragment]: even and odd k steps accumulate apart, so four MMA
      // chains are in flight instead of two (one warp per scheduler at batch 1 hides nothing).
      float scc[2][2][4] = {};
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t b[4];
        ldmatrix_x4(b, k_st + swizzled<D>(tok0 + r + 8 * (mi / 2), 2 * ks + mi % 2));
        mma_16816(scc[ks % 2][0], qa[ks], b[0], b[1]);
        mma_16816(scc[ks % 2][1], qa[ks], b[2], b[3]);
      }
      float sc[2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] = scc[0][nt][e] + scc[1][nt][e];
      float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int tok = tok0 + 8 * nt + 2 * t + (e & 1);
          sc[nt][e] = tok < n ? sc[nt][e] * a.scale_log2 : -INFINITY;
          if (e < 2) mx_lo = fmaxf(mx_lo, sc[nt][e]);
          else mx_hi = fmaxf(mx_hi, sc[nt][e]);
        }
      // Finite: token tok0 is inside the chunk, so each head has one finite score.
      const float mn_lo = fmaxf(m_lo, quad_max(mx_lo)), mn_hi = fmaxf(m_hi, quad_max(mx_hi));
      const float f_lo = exp2f(m_lo - mn_lo), f_hi = exp2f(m_hi - mn_hi);  // 0 on a first chunk
      m_lo = mn_lo, m_hi = mn_hi;
      float sum_lo = 0.0f, sum_hi = 0.0f;
      uint32_t pa[4];  // P as the A fragment of one k16 step (the warp's 16 tokens)
      pa[0] = pack_bf16(exp2f(sc[0][0] - mn_lo), exp2f(sc[0][1] - mn_lo), sum_lo);
      pa[1] = pack_bf16(exp2f(sc[0][2] - mn_hi), exp2f(sc[0][3] - mn_hi), sum_hi);
      pa[2] = pack_bf16(exp2f(sc[1][0] - mn_lo), exp2f(sc[1][1] - mn_lo), sum_lo);
      pa[3] = pack_bf16(exp2f(sc[1][2] - mn_hi), exp2f(sc[1][3] - mn_hi), sum_hi);
      l_lo = l_lo * f_lo + sum_lo;
      l_hi = l_hi * f_hi + sum_hi;
#pragma unroll
      for (int dt = 0; dt < D / 16; ++dt) {
        uint32_t v[4];
        ldmatrix_x4_trans(v, v_st + swizzled<D>(tok0 + r + 8 * (mi % 2), 2 * dt + mi / 2));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float* o = acc[2 * dt + h];
          o[0] *= f_lo, o[1] *= f_lo, o[2] *= f_hi, o[3] *= f_hi;
          mma_16816(o, pa, v[2 * h], v[2 * h + 1]);
        }
      }
    }
    __syncthreads();  // the stage is free again
    if (c + kStages < chunks) {
      // rope_on: the new row, if it is in that chunk, comes from registers (see new_piece).
      const int cn0 = begin + (c + kStages) * kChunk;
      const int lj = new_j >= 0 && len - 1 >= cn0 && len - 1 < cn0 + kChunk ? new_j : -1;
      LatePiece lp;
      issue_chunk<D>(a, pg, next, k_st, v_st, lj, lp);
      if (lp.off >= 0) {
        store_16_shared(lp.k_dst, late_k);
        store_16_shared(lp.v_dst, late_v);
      }
      const int c1 = c + kStages + 1, n0 = begin + c1 * kChunk;
      chunk_rows<D>(a, pg, table, n0, c1 < chunks ? min(kChunk, end - n0) : 0, next);
    }
    cp_async_commit();
  }
  cp_async_wait<0>();
  __syncthreads();
  const uint64_t t_chunks = perf::stamp_time();

  // Merge the 4 warps' partials of this block (stage memory reused).
  constexpr int kRow = warp_row_floats<D>();
  float* warp_acc = reinterpret_cast<float*>(smem);                // [kWarps][16][kRow]
  float* block_acc = warp_acc + kWarps * kMaxGroup * kRow;         // [16][D]
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 1);
  l_lo += __shfl_xor_sync(0xffffffffu, l_lo, 2);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 1);
  l_hi += __shfl_xor_sync(0xffffffffu, l_hi, 2);
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    float* row = warp_acc + (warp * kMaxGroup + g) * kRow + 8 * j + 2 * t;
    *reinterpret_cast<float2*>(row) = make_float2(acc[j][0], acc[j][1]);
    *reinterpret_cast<float2*>(row + 8 * kRow) = make_float2(acc[j][2], acc[j][3]);
  }
  if (t == 0) {
    warp_m[warp][g] = m_lo, warp_m[warp][g + 8] = m_hi;
    warp_l[warp][g] = l_lo, warp_l[warp][g + 8] = l_hi;
  }
  __syncthreads();
  // Items: 4 dims of one head. acc = sum_w e^(m_w - M) acc_w, l likewise, M = max_w m_w; a warp
  // (or block) that saw no token has m = -inf and weight 0.
  const int items = G * D / 4;
  for (int idx = tid; idx < items; idx += kThreads) {
    const int i = idx / (D / 4), d4 = idx % (D / 4);
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, warp_m[w][i]);
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float e = warp_m[w][i] == -INFINITY ? 0.0f : exp2f(warp_m[w][i] - mx);
      const float4 v = *reinterpret_cast<const float4*>(warp_acc + (w * kMaxGroup + i) * kRow + 4 * d4);
      sum.x += e * v.x, sum.y += e * v.y, sum.z += e * v.z, sum.w += e * v.w;
      l += e * warp_l[w][i];
    }
    reinterpret_cast<float4*>(block_acc)[idx] = sum;
    if (d4 == 0) block_m[i] = mx, block_l[i] = l;
  }

  // Merge the cluster's blocks through distributed shared memory: block r writes items
  // r*128 + tid, (r + splits)*128 + tid, ...
  const uint64_t t_block_merged = perf::stamp_time();
  cluster.sync();
  const uint64_t t_cluster_synced = perf::stamp_time();
  // The loops over the cluster's blocks are unrolled to the split count's power-of-two bound, so
  // a block runs (and fetches from a cold instruction cache) only the remote loads it can need.
  const float4* block_acc4 = reinterpret_cast<const float4*>(block_acc);
  uint16_t* out_kh = a.out + (int64_t(s) * a.n_kv * G + int64_t(kh) * G) * D;
  if (splits <= 1)
    cluster_merge<D, 1>(cluster, splits, split, items, block_m, block_l, block_acc4, out_kh);
  else if (splits <= 2)
    cluster_merge<D, 2>(cluster, splits, split, items, block_m, block_l, block_acc4, out_kh);
  else if (splits <= 4)
    cluster_merge<D, 4>(cluster, splits, split, items, block_m, block_l, block_acc4, out_kh);
  else if (splits <= 8)
    cluster_merge<D, 8>(cluster, splits, split, items, block_m, block_l, block_acc4, out_kh);
  else
    cluster_merge<D, kMaxSplits>(cluster, splits, split, items, block_m, block_l, block_acc4,
                                 out_kh);
  const uint64_t t_merged = perf::stamp_time();
  cluster.sync();  // peers may still be reading this block's shared memory
  // Stamps: start, wait returned, chunks done, block merge done, first cluster barrier passed,
  // cluster merge done, end.
  if (tid == 0)
    perf::block_stamp(a.stamps, perf::kStampAttention, a.stamp_launch, t_start, t_waited,
                      t_chunks, t_block_merged, t_cluster_synced, t_merged, perf::stamp_time());
}

// Clusters of more than 8 blocks are "non-portable": each kernel opts in, once per GPU.
template <auto Kernel>
cudaError_t allow_large_clusters() {
  return ensure_func_attribute<Kernel, cudaFuncAttributeNonPortableClusterSizeAllowed>(1);
}

// Dynamic shared memory that leaves no room for a second block on the SM: more than half of it.
int one_block_per_sm_smem() { return current_device_smem_per_sm() / 2 + 1024; }

// A grid of at most half the SMs runs one block per SM, by asking for more than half an SM's
// shared memory (the stages use 96 KB of it; the rest stays idle). Otherwise the blocks placed
// while the previous kernel (the q/k/v projection) drains pair up on the first SMs it frees:
// GLM-4.5-Air batch 1 (64 blocks) ran on ~37 SMs, two latency chains per SM, with the o_proj
// blocks that start streaming beside them. Spread over 64 SMs the attention ends ~2 us earlier
// per layer (H200, bench/results/2026-12-01-session18-h200.md). Larger grids keep two blocks per
// SM: with clusters of 4-8 (batch 2 and 4, 128 blocks) one block per SM left clusters waiting
// for a GPC with enough free SMs (+4-5% per step).
template <int D>
cudaError_t launch_split_decode(const SplitArgs& a, int splits, int num_seqs, cudaStream_t stream) {
  constexpr auto kernel = split_decode_kernel<D>;
  const int blocks = splits * a.n_kv * num_seqs;
  const int spread_smem = std::max(smem_bytes<D>(), one_block_per_sm_smem());
  const int smem = 2 * blocks <= current_device_sm_count() ? spread_smem : smem_bytes<D>();
  // The opt-in is set once per GPU: to the larger of the two sizes.
  cudaError_t err = ensure_max_dynamic_smem<kernel>(spread_smem);
  if (err == cudaSuccess && splits > 8) err = allow_large_clusters<kernel>();
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr[2] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(splits);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  // Programmatic dependent launch: scheduled while the previous kernel drains; the kernel
  // waits for it before reading what it may write (a.early_kv).
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(splits), unsigned(a.n_kv), unsigned(num_seqs));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, kernel, a);
}

}  // namespace

std::string split_decode_unsupported_reason(const ops::AttentionShape& s) {
  if (!ops::cuda::attention_head_dim_supported(s.head_dim))
    return str("head_dim ", s.head_dim, " (the split decode kernel takes 64 or 128)");
  if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0) return "bad head counts";
  if (s.n_heads / s.n_kv_heads > kMaxGroup)
    return str("query heads per kv head ", s.n_heads / s.n_kv_heads, " > ", kMaxGroup);
  if (s.q_step() % 8 != 0 || s.kv_step() != int64_t(s.n_kv_heads) * s.head_dim)
    return "q rows must be 16-byte aligned and k/v packed";
  return "";
}


std::string split_decode_rope_unsupported_reason(const ops::AttentionShape& s, int rotary_dim,
                                                 bool neox) {
  if (rotary_dim <= 0 || rotary_dim > s.head_dim)
    return str("rotary_dim ", rotary_dim, " outside 1..head_dim ", s.head_dim);
  if (neox && rotary_dim % 32 != 0)
    return str("NeoX rotary_dim ", rotary_dim, " (the q fragments hold both dims of a pair for "
               "multiples of 32)");
  if (!neox && rotary_dim % 16 != 0)
    return str("GPT-J rotary_dim ", rotary_dim, " (multiples of 16)");
  return "";
}

int split_decode_auto_splits(int num_seqs, const ops::AttentionShape& s, int max_len) {
  const int sms = current_device_sm_count();
  // Double the splits while the blocks stay within one per multiprocessor: measured on the H200
  // (GLM-4.5-Air, contexts 1024..8192) the best count was 2 at batch 8 and 1 at batch 64, as this
  // picks: past one block per SM, splitting adds merge work but no more bandwidth. At batch 1 the
  // best count grows with the context, about as sqrt(len / 8): 4 splits at 128 and 256 tokens
  // (5.9 / 6.9 us, 7.6 / 7.7 with 16), 8 at 512 and 1024 (7.9 / 9.2 us, 8.1 / 9.4 with 16), 16
  // from 2048 (bench/results/2026-11-30-session12-h200.md): shorter splits merge more partials
  // than they save in reading.
  const int64_t pairs = int64_t(std::max(num_seqs, 1)) * std::max(s.n_kv_heads, 1);
  int splits = 1;
  while (splits < kMaxSplits && pairs * splits * 2 <= sms &&
         (max_len <= 0 || int64_t(8) * (2 * splits) * (2 * splits) <= max_len))
    splits *= 2;
  return splits;
}

cudaError_t split_decode_attention(const uint16_t* q, const ops::PagedKv& kv, int num_seqs,
                                   const ops::AttentionShape& s, uint16_t* out,
                                   cudaStream_t stream, int splits,
                                   PredecessorWrites predecessor, const DecodeRope* rope,
                                   const int32_t* plan) {
  const std::string why = split_decode_unsupported_reason(s);
  if (!why.empty()) TETRA_FAIL("split decode attention: ", why);
  TETRA_CHECK(splits >= 0 && splits <= kMaxSplits, "split decode attention: splits ", splits,
              " outside 0..", kMaxSplits);
  if (num_seqs <= 0) return cudaSuccess;
  TETRA_CHECK(kv.block_size > 0 && int64_t(kv.num_blocks) * kv.block_size <= INT32_MAX,
              "split decode attention: ", kv.num_blocks, " blocks of ", kv.block_size,
              " tokens (cache rows are int32)");
  SplitArgs a;
  a.q = q;
  a.k_cache = kv.k_cache;
  a.v_cache = kv.v_cache;
  a.tables = kv.block_tables;
  a.lens = kv.seq_lens;
  TETRA_CHECK(plan == nullptr || (splits > 0 && reinterpret_cast<uintptr_t>(plan) % 16 == 0),
              "split decode attention: a plan needs an explicit split count and 16-byte alignment");
  a.plan = plan;
  a.max_blocks = kv.max_blocks_per_seq;
  a.block_size = kv.block_size;
  a.block_div = FastDiv(uint32_t(kv.block_size));
  a.n_kv = s.n_kv_heads;
  a.group = s.n_heads / s.n_kv_heads;
  a.q_step = s.q_step();
  a.scale_log2 = s.scale * kLog2e;
  a.out = out;
  a.early_kv = predecessor == PredecessorWrites::QAndNewKvRow || rope != nullptr;
  a.rope_on = rope != nullptr;
  if (rope) {
    const std::string no = split_decode_rope_unsupported_reason(s, rope->rotary_dim, rope->neox);
    if (!no.empty()) TETRA_FAIL("split decode attention with RoPE: ", no);
    TETRA_CHECK(rope->k_new && rope->v_new && rope->positions && rope->slots && rope->inv_freq &&
                    rope->k_cache && rope->v_cache && rope->num_slots > 0 &&
                    rope->k_stride >= int64_t(s.n_kv_heads) * s.head_dim &&
                    rope->v_stride >= int64_t(s.n_kv_heads) * s.head_dim,
                "split decode attention with RoPE: missing pointers or short rows");
    a.rope = *rope;
  }
  a.stamps = perf::block_stamp_buffer();
  if (a.stamps) a.stamp_launch = perf::next_block_stamp_launch();
  if (splits == 0) splits = split_decode_auto_splits(num_seqs, s);
  if (s.head_dim == 64) return launch_split_decode<64>(a, splits, num_seqs, stream);
  return launch_split_decode<128>(a, splits, num_seqs, stream);
}

}  // namespace tetra::model::cuda
