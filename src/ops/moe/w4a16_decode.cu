// Decode / small-M W4A16 MoE kernel: weights stream from HBM straight into registers.
//
// Out^T = W x X^T with W on the MMA's M side (16 weight rows) and up to 8*NT tokens on its N side.
// A block owns two 16-row tiles (gate+up pair for GEMM1, 32 output rows for GEMM2) of one expert;
// its KW warps split k, each keeping U chunks (U x 2 x 16 B of weights per lane) in flight before
// first use, then the partial sums meet in shared memory for the epilogue. The "late" variant (the
// default at <= 8 rows per expert) reads activations from L1 just before their MMA and caps
// registers so 8 blocks (32 warps) fit per SM: at 1..64 tokens more warps with 2 chunks each beat
// fewer warps with 4-8 chunks each (bench/moe_kernels/RESULTS.md). A GEMM2 launched as a
// programmatic dependent takes 3-warp blocks (10 per SM, or 9 where that holds its grid) where
// only they fit its grid in one wave (one_wave_late_config).
// The pair kernel runs GEMM1 and GEMM2 of that configuration as one grid, GEMM2's blocks waiting
// per expert on counters instead of for the whole GEMM1 grid (moe_w4a16_gemm_pair).
// Grids of half a wave to one wave stage each warp's scale pieces in shared memory first
// (decode_scales_in_smem): fewer, larger requests where many blocks share an SM.
#include <cuda_runtime.h>

#include "core/atomics.cuh"
#include "core/cuda_check.h"
#include "core/kernel_launch.h"
#include "ops/moe/gemm1_routing.h"
#include "ops/moe/routing_device.cuh"
#include "ops/moe/w4a16_fragment.cuh"
#include "ops/moe/w4a16_launch.h"
#include "perf/block_stamps.cuh"

namespace tetra::moe_detail {
namespace {


// Phase stamps of a decode block (perf/block_stamps.h; 0 where a phase did not run), recorded
// after the block's start as t1, t2 = waited, first batch multiplied; t3 = end; then t4..t7 =
// (the routed GEMM1's) scores and routing done, the first weight batch requested, the scales
// staged in shared memory landed.
enum DecodeStamp {
  kStampWaited,           // the previous grid's (or GEMM1's counter's) wait returned
  kStampFirstMultiplied,  // the first weight batch was multiplied
  kStampScored,           // routed GEMM1: scores and selection keys in shared memory
  kStampRouted,           // routed GEMM1: the block knows its expert
  kStampFirstRequested,   // the first weight batch was requested
  kStampScalesLanded,     // SCALES_SMEM: this warp's scale copies landed
  kDecodeStamps
};
__device__ __forceinline__ void decode_block_stamp(const GroupedGemmArgs& a, int kind,
                                                   uint64_t t_start,
                                                   const uint64_t (&t)[kDecodeStamps]) {
  if (threadIdx.x == 0)
    perf::block_stamp(a.stamps, kind, a.stamp_launch, t_start, t[kStampWaited],
                      t[kStampFirstMultiplied], perf::stamp_time(), t[kStampScored],
                      t[kStampRouted], t[kStampFirstRequested], t[kStampScalesLanded]);
}

// One block's work: tile pair `pair` of slot `slot`. U: chunks per load batch. LATE: activations
// are read from L1 right before their MMA instead of with the weights (frees U*NT*8 registers).
// DIAG: a DecodeDiag mode (benchmarks only). XWEAK: activations written earlier in the same grid,
// read by weak loads (the read-only path may not see them). wait_x() runs in every warp before
// its first activation read (griddepcontrol.wait as a programmatic dependent; a per-expert
// counter in the pair kernel). x_scale() is read in the epilogue, after a block barrier: the
// outputs are scaled by it (the router fold's 1/rms, x being g * h: moe/router_fold.h).
// Returns false when the slot has no rows (nothing written).
// t_mid: phase stamps (DecodeStamp; left as they are without stamps). SCALES_SMEM (late kernel,
// DecodeConfig::scales_smem): each warp copies its k range's scale pieces into shared memory with
// 16-byte cp.async before its first weight batch, instead of 2-byte loads beside every batch.
struct UnitXScale {
  __device__ float operator()() const { return 1.0f; }
};
template <int NT, int KW, int U, bool LATE, bool GATED, bool OUT_F32, int DIAG, bool XWEAK,
          class WaitX, bool SCALES_SMEM = false, class XScale = UnitXScale>
__device__ __forceinline__ bool decode_block(const GroupedGemmArgs& a, int pair, int slot,
                                             WaitX wait_x, uint64_t (&t_mid)[kDecodeStamps],
                                             XScale x_scale = {}) {
  static_assert(DIAG == kDecodeFull || (LATE && NT == 1), "diagnostics: the late n8 kernel only");
  // GEMM1 as a programmatic dependent of the token path: the row mapping is its output.
  if (a.wait_first) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    t_mid[kStampWaited] = perf::stamp_time();
  }
  const int e = a.rows.expert_ids ? a.rows.expert_ids[slot] : slot;
  if (e < 0) return false;
  const int cnt = a.rows.row_count[e];
  if (cnt <= 0) return false;
  const int start = a.rows.row_start[e];
  // The expert's alphas (constants) are loaded now, not after the k reduction: the epilogue then
  // starts without another memory round trip.
  const float alpha_a = a.alpha0[e], alpha_b = GATED ? a.alpha1[e] : 0.0f;
  // Let a dependent launch (GEMM2) start its prologue while this grid finishes.
  asm volatile("griddepcontrol.launch_dependents;");

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = a.k / kChunkK;
  const int c_begin = warp * chunks / KW, c_end = (warp + 1) * chunks / KW;
  const size_t tiles = size_t(a.n) / 16;
  const size_t tile0 = 2 * size_t(pair);
  // Pointers at this lane's 16 bytes / 2 scale bytes of tile0's chunk 0; tile0 + 1 starts `chunks`
  // chunks further. Indexing it instead of keeping a second pointer pair saves 4 registers, which
  // cut the pair kernel's spills from 44/52 to 16/16 bytes (GLM-5 1 token -2.7%, session 21).
  const uint8_t* wp0 = a.w + (size_t(e) * tiles + tile0) * chunks * kTileChunkBytes + lane * 16;
  const uint8_t* sp0 = a.s + (size_t(e) * tiles + tile0) * chunks * kTileChunkScales + lane * 2;

  __shared__ float red[KW][2][NT][4][32];  // per-warp partial sums, lane fastest
  // [warp][tile][chunk of the warp's range][lane] scale pairs, as in global memory
  __shared__ __align__(16) uint8_t
      sc_s[SCALES_SMEM ? KW : 1][2][SCALES_SMEM ? kScalesSmemMaxWarpChunks * kTileChunkScales : 16];
  if constexpr (SCALES_SMEM) {
    const int pieces = (c_end - c_begin) * 4;  // 16-byte pieces per tile
    const uint8_t* src0 = a.s + ((size_t(e) * tiles + tile0) * chunks + c_begin) * kTileChunkScales;
    for (int i = lane; i < 2 * pieces; i += 32) {
      const int t = i >= pieces, j = i - t * pieces;
      cp_async_16(&sc_s[warp][t][j * 16], src0 + size_t(t) * chunks * kTileChunkScales + j * 16, 16);
    }
    cp_async_commit();
  }
  // One pass over the expert's rows reads its weights once: evict them first from L2. More
  // passes read them again, so they keep normal priority there.
  const uint64_t policy = cnt <= 8 * NT ? l2_evict_first_policy() : l2_evict_normal_policy();

  // [U][2 tiles] one batch of this lane's weight words / scale pairs
  auto load_w = [&](int c, uint4 (&wv)[U][2], uint32_t (&sv)[U][2]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c + u < c_end) {
        const size_t cc = size_t(c + u);
        wv[u][0] = ld_stream_u4(wp0 + cc * kTileChunkBytes, policy);
        wv[u][1] = ld_stream_u4(wp0 + (cc + chunks) * kTileChunkBytes, policy);
        if constexpr (!SCALES_SMEM) {
          sv[u][0] = ld_stream_u16(sp0 + cc * kTileChunkScales, policy);
          sv[u][1] = ld_stream_u16(sp0 + (cc + chunks) * kTileChunkScales, policy);
        }
      }
    }
  };

  for (int tok0 = 0; tok0 < cnt; tok0 += 8 * NT) {
    const uint16_t* xp[NT];  // this lane's token row, at k = 16t
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int token = tok0 + nt * 8 + lane / 4;
      const int r = start + min(token, cnt - 1);  // past the count: any valid row, result dropped
      const int src = a.rows.gather ? a.rows.gather[r] : r;
      xp[nt] = a.x + size_t(src) * a.k + 16 * (lane % 4);
    }
    float acc[2][NT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mt][nt][r] = 0.0f;

    auto load_x = [&](int c, uint4 (&xv)[NT][2]) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        xv[nt][0] = XWEAK ? ld_weak_u4(xp[nt] + size_t(c) * kChunkK)
                          : ld_cached_u4(xp[nt] + size_t(c) * kChunkK);
        xv[nt][1] = XWEAK ? ld_weak_u4(xp[nt] + size_t(c) * kChunkK + 8)
                          : ld_cached_u4(xp[nt] + size_t(c) * kChunkK + 8);
      }
    };
    // Batch of U chunks whose weights are already in registers; activations read now.
    auto compute_batch_late = [&](int c, const uint4 (&wv)[U][2], const uint32_t (&sv)[U][2]) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (c + u < c_end) {
          if constexpr (DIAG == kDecodeLoadsOnly) {
            acc[0][0][0] += __uint_as_float(wv[u][0].x ^ wv[u][0].y ^ wv[u][0].z ^ wv[u][0].w ^
                                            wv[u][1].x ^ wv[u][1].y ^ wv[u][1].z ^ wv[u][1].w ^
                                            sv[u][0] ^ sv[u][1]) * 0.0f;
          } else if constexpr (DIAG == kDecodeNoDequant) {
            uint4 xv[NT][2];
            load_x(c + u, xv);
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
              for (int mt = 0; mt < 2; ++mt) {
                const uint32_t wd = word_of(wv[u][mt], j) ^ sv[u][mt];
                const uint32_t A[4] = {wd, wd, wd, wd};
                mma_bf16_16816(acc[mt][0], A, (j & 1) ? xv[0][j >> 1].z : xv[0][j >> 1].x,
                               (j & 1) ? xv[0][j >> 1].w : xv[0][j >> 1].y);
              }
          } else {
            uint4 xv[NT][2];
            load_x(c + u, xv);
            mma_chunk_pair<NT>(acc, wv[u], sv[u], xv);
          }
        }
      }
    };

    // Launched as a programmatic dependent (GEMM2 after GEMM1), this block may start while the
    // previous grid still runs: wait for its output before reading activations. A no-op for a
    // normal launch. LATE waits after issuing its first weight batch instead.
    if (!LATE && tok0 == 0) wait_x();
    for (int c = c_begin; c < c_end; c += U) {
      uint4 wv[U][2];
      uint32_t sv[U][2];
      load_w(c, wv, sv);
      if (tok0 == 0 && c == c_begin) t_mid[kStampFirstRequested] = perf::stamp_time();
      if (LATE && tok0 == 0 && c == c_begin) {
        wait_x();
        if (t_mid[kStampWaited] == 0) t_mid[kStampWaited] = perf::stamp_time();
      }
      if constexpr (SCALES_SMEM) {
        if (tok0 == 0 && c == c_begin) {  // the copies of this warp's range have landed
          cp_async_wait<0>();
          __syncwarp();  // also orders the shared-memory reads below after the wait
          t_mid[kStampScalesLanded] = perf::stamp_time();
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int t = 0; t < 2; ++t)
            if (c + u < c_end)
              sv[u][t] = *reinterpret_cast<const uint16_t*>(
                  &sc_s[warp][t][(c + u - c_begin) * kTileChunkScales + lane * 2]);
      }
      if constexpr (LATE) {
        compute_batch_late(c, wv, sv);
        if (tok0 == 0 && c == c_begin) t_mid[kStampFirstMultiplied] = perf::stamp_time();
      } else {
        uint4 xv[U][NT][2];
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (c + u < c_end) load_x(c + u, xv[u]);
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (c + u < c_end) mma_chunk_pair<NT>(acc, wv[u], sv[u], xv[u]);
      }
    }

#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) red[warp][mt][nt][r][lane] = acc[mt][nt][r];
    __syncthreads();

    // Epilogue: sum the k-split partials; element (nt, r, l) is row g(+8 for r >= 2) of the tile,
    // token tok0 + 8nt + 2(l%4) + (r&1).
    if constexpr (GATED) {
      const float xs = x_scale(), ag = alpha_a * xs, au = alpha_b * xs;
      const int out_ld = a.n / 2;
      for (int idx = threadIdx.x; idx < NT * 4 * 32; idx += KW * 32) {
        const int nt = idx / 128, r = (idx / 32) % 4, l = idx % 32;
        float gs = 0.0f, us = 0.0f;
#pragma unroll
        for (int w = 0; w < KW; ++w) {
          gs += red[w][0][nt][r][l];
          us += red[w][1][nt][r][l];
        }
        const int token = tok0 + nt * 8 + 2 * (l % 4) + (r & 1);
        if (token < cnt) {
          const int n = pair * 16 + l / 4 + (r >= 2 ? 8 : 0);
          uint16_t* out = static_cast<uint16_t*>(a.out);
          out[size_t(start + token) * out_ld + n] = f32_to_bf16_bits(silu(gs * ag) * (us * au));
        }
      }
    } else {
      const float ad = alpha_a * x_scale();
      for (int idx = threadIdx.x; idx < 2 * NT * 4 * 32; idx += KW * 32) {
        const int mt = idx / (NT * 128), nt = (idx / 128) % NT, r = (idx / 32) % 4, l = idx % 32;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < KW; ++w) s += red[w][mt][nt][r][l];
        const int token = tok0 + nt * 8 + 2 * (l % 4) + (r & 1);
        if (token < cnt) {
          const int n = pair * 32 + mt * 16 + l / 4 + (r >= 2 ? 8 : 0);
          const size_t o = size_t(start + token) * a.n + n;
          if constexpr (OUT_F32)
            static_cast<float*>(a.out)[o] = s * ad;
          else
            static_cast<uint16_t*>(a.out)[o] = f32_to_bf16_bits(s * ad);
        }
      }
    }
    __syncthreads();  // red is reused by the next token pass
  }
  return true;
}

// MINB: blocks per SM the register allocation must allow (0: no cap); without a cap the compiler
// hoists the late loads back up and spends the saved registers.
template <int NT, int KW, int U, bool LATE, int MINB, bool GATED, bool OUT_F32,
          int DIAG = kDecodeFull, bool SCALES_SMEM = false>
__global__ void __launch_bounds__(KW * 32, MINB > 0 ? MINB : 1)
    moe_decode_kernel(const GroupedGemmArgs a) {
  const uint64_t t_start = perf::stamp_time();
  uint64_t t_mid[kDecodeStamps] = {};
  // Launched as a programmatic dependent (GEMM2 after GEMM1), a block may start while the
  // previous grid still runs: it waits for that grid before reading activations (a no-op for a
  // normal launch).
  auto wait = [] { asm volatile("griddepcontrol.wait;" ::: "memory"); };
  decode_block<NT, KW, U, LATE, GATED, OUT_F32, DIAG, false, decltype(wait), SCALES_SMEM>(
      a, int(blockIdx.x), int(blockIdx.y), wait, t_mid);
  decode_block_stamp(a, GATED ? perf::kStampMoeGemm1 : perf::kStampMoeGemm2, t_start, t_mid);
}


// GEMM1 and GEMM2 of the default late configuration as one grid: blocks [0, B1) are GEMM1's
// (tile pair, slot) blocks, the rest GEMM2's. A GEMM1 block counts itself in on its slot once
// its act rows are written; a GEMM2 block issues its first weights, then waits until every GEMM1
// block of its slot is in, so GEMM2's weights stream while GEMM1's other experts finish instead
// of after the whole GEMM1 grid. No deadlock as long as the GPU starts a grid's blocks in index
// order (then every GEMM1 block is resident or done before any GEMM2 block waits): CUDA does not
// promise that order, but the hardware keeps it, and single-pass scans whose later blocks wait
// on earlier ones rely on the same. Handing out items by an atomic ticket instead (start order,
// no assumption) cost the whole gain on the H200 (bench/results/2026-12-01-session13-h200.md).
// done [2 * slots]: zero before the first launch; the last GEMM2 block of a slot zeroes its two
// counters.
__global__ void __launch_bounds__(kLateKWarps * 32, kLateBlocksPerSm)
    moe_decode_pair_kernel(const GroupedGemmArgs a1, const GroupedGemmArgs a2, uint32_t* done) {
  const int pairs1 = a1.n / 32, blocks1 = pairs1 * a1.num_slots;
  if (int(blockIdx.x) < blocks1) {
    const int slot = int(blockIdx.x) / pairs1;
    // x was written before this (normal) launch: nothing to wait for.
    uint64_t t_mid[kDecodeStamps] = {};  // unused: the pair kernel records no stamps
    if (decode_block<1, kLateKWarps, kLateChunks, true, true, false, kDecodeFull, false>(
            a1, int(blockIdx.x) % pairs1, slot, [] {}, t_mid)) {
      __threadfence();  // this thread's act stores, before the block counts in
      __syncthreads();
      if (threadIdx.x == 0) atomicAdd(done + slot, 1u);
    }
    return;
  }
  const int b = int(blockIdx.x) - blocks1, pairs2 = a2.n / 32;
  const int slot = b / pairs2;
  uint32_t* in1 = done + slot;
  uint32_t* in2 = done + a2.num_slots + slot;
  // Relaxed polls (an acquire load would invalidate the SM's L1, where the resident GEMM1 blocks
  // keep their activations), then one acquire fence per warp.
  auto wait_gemm1 = [in1, pairs1] {
    if (threadIdx.x % 32 == 0)
      while (ld_relaxed_gpu(in1) < uint32_t(pairs1)) __nanosleep(64);
    __syncwarp();
    fence_acq_rel_gpu();
  };
  uint64_t t_mid[kDecodeStamps] = {};
  if (decode_block<1, kLateKWarps, kLateChunks, true, false, true, kDecodeFull, true>(
          a2, b % pairs2, slot, wait_gemm1, t_mid)) {
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(in2, 1u) == uint32_t(pairs2 - 1)) {
      *in1 = 0;  // every GEMM1 and GEMM2 block of the slot is done with them
      *in2 = 0;
    }
  }
}

// GEMM1 of one token that routes it first (gemm1_routing.h): every block waits for the logits
// kernel, routes the token (sigmoid scoring: the block computes the scores and keys, warp 0 the
// top-k, as the token path's scored routing; softmax: warp 0 alone) and places the K selected
// experts in ascending order (slot s = row s); then it runs the default late configuration over
// its slot with the row mapping in shared memory. Block (0, 0) writes the T = 1 layout for GEMM2
// and the combine, and fences it before this block lets the next grid launch.
// kPerLane: routing scores per lane (E <= 32 * kPerLane).
// KW, MINB: the default late shape (MINB: routed_blocks_per_sm, 6..8), or the wide one
// (kLateWideKWarps) for small grids.
// FOLD: the router folded into o_proj (Gemm1Fold f; sigmoid only), in a kernel of its own
// (moe_decode_routed_fold_kernel) so that the others keep their registers and arguments.
template <bool kSoftmax, int kPerLane, bool SCALES_SMEM, int KW, int MINB, bool FOLD>
__device__ __forceinline__ void routed_gemm1_block(const GroupedGemmArgs& a, const Gemm1Routing& r,
                                                   const Gemm1Fold& f) {
  using namespace moe::cuda::detail;
  constexpr int kMaxE = 32 * kPerLane;
  __shared__ __align__(16) float keys[kMaxE];  // selection keys (route_token_regs' scratch)
  __shared__ float scores[kSoftmax ? 1 : kMaxE];
  __shared__ uint32_t group_keys[moe::kMaxGroups];
  __shared__ int32_t ids[moe::kMaxTopK];
  __shared__ float wts[moe::kMaxTopK];
  __shared__ int32_t slot_expert[moe::kMaxTopK + 1];  // slot -> expert
  __shared__ int32_t first_row[kMaxE + 1];            // expert -> row (selected experts only)
  __shared__ int32_t expert_rows[kMaxE + 1];          // expert -> 1 (selected experts only)
  __shared__ int32_t row_token[moe::kMaxTopK + 1];    // row -> 0
  const uint64_t t_start = perf::stamp_time();
  uint64_t t_mid[kDecodeStamps] = {};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int K = r.router.top_k, E = r.router.num_experts;
  // The shared expert's blocks (slot K) need no routing: they request their first weights before
  // the wait (in decode_block) and read x after it. !kSoftmax drops the branch at compile time
  // where gemm1_routed_starts_shared is false anyway (it spilled 16-20 bytes there).
  const bool shared_block = !kSoftmax && gemm1_routed_starts_shared(r) && int(blockIdx.y) == K;
  // The router fold (sigmoid only): 1/rms from the folded sum of squares, after the wait.
  static_assert(!(FOLD && kSoftmax), "the router fold takes sigmoid scoring only");
  constexpr bool fold = FOLD;
  // The sums are read through the L1 (__ldca; the wait makes o_proj's writes visible to every
  // load of this grid), so that the blocks of an SM share one L2 read of each line, and 1/rms
  // comes with the first logit sum instead of a round trip before it. Read through the L2 by
  // 792 blocks, 1/rms first, they took 2.3 us from the wait to the scores, 1.4 us now, against
  // 0.5 us for the token path's f32 logits (GLM-4.5-Air; bench/results/*-session51-h200.md).
  // Entry i of the sums over their copies, added in copy order, and 1/rms from entry E (the sum
  // of squares) added alongside: their loads in flight together.
  auto fold_sum = [&](int i, float& inv_rms) {
    double v = 0.0, q = 0.0;
    for (int c = 0; c < f.copies; ++c) {
      const double* row = f.sums + c * (E + 1);
      v += __ldca(row + i);
      q += __ldca(row + E);
    }
    inv_rms = rsqrtf(float(q) / float(a.k) + f.eps);
    return float(v);
  };
  __shared__ float inv_rms_s;  // the outputs' scale with the fold: 1/rms
  if (shared_block) {
    if (threadIdx.x == 0)
      slot_expert[K] = E, first_row[E] = K, expert_rows[E] = 1, row_token[K] = 0;
  } else {
    asm volatile("griddepcontrol.wait;" ::: "memory");  // the logits (and x, written before them)
    t_mid[kStampWaited] = perf::stamp_time();
    if constexpr (kSoftmax) {
      if (warp == 0)
        route_token_regs<true, kPerLane>(r.logits, r.bias, r.router, keys, ids, wts, lane);
    } else {
      // The one-token form of the tiny token path's block-wide scoring (token_path_tiny.cu),
      // indexed by expert: a shared helper over [T, E] needs i % E and q / n_group, ~4 KB more
      // code here.
      for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float lg;
        if constexpr (fold) {
          float inv_rms;
          lg = fold_sum(e, inv_rms) * inv_rms;
          if (e == 0) inv_rms_s = inv_rms;
          if (f.logits && blockIdx.x == 0 && blockIdx.y == 0) f.logits[e] = lg;
        } else {
          lg = __ldcg(r.logits + e);
        }
        const float sc = moe::math::sigmoid_f32(lg);
        scores[e] = sc;
        keys[e] = score_selection_key(sc, r.bias, e);
      }
      __syncthreads();
      const int ng = r.router.n_group;
      if (ng != 1) {  // the same in every thread
        for (int g = warp; g < ng; g += KW) {
          const uint32_t gk = group_order_key_warp(keys + g * (E / ng), E / ng, lane);
          if (lane == 0) group_keys[g] = gk;
        }
        __syncthreads();
      }
      t_mid[kStampScored] = perf::stamp_time();
      if (warp == 0)
        route_token_scored<kPerLane>(scores, keys, group_keys, r.router, ids, wts, lane);
    }
    if (warp == 0) {
      __syncwarp();
      const int id = lane < K ? ids[lane] : 0;
      int rank = 0;  // the K ids are distinct
      for (int i = 0; i < K; ++i) rank += ids[i] < id;
      if (lane < K) slot_expert[rank] = id, first_row[id] = rank, expert_rows[id] = 1;
      if (lane <= K) row_token[lane] = 0;
      if (lane == 0 && r.shared_slot) slot_expert[K] = E, first_row[E] = K, expert_rows[E] = 1;
      if (blockIdx.x == 0 && blockIdx.y == 0) {
        if (lane < K) {
          r.ids[lane] = id;
          r.weights[lane] = wts[lane];
          r.slot_of[lane] = rank;
          r.slots[rank] = id;
          r.offsets[id] = rank;
          r.row_count[id] = 1;
          r.row_token[lane] = 0;
        }
        if (lane == 0) {
          r.offsets[E] = K;
          if (r.shared_slot) r.slots[K] = E, r.row_count[E] = 1, r.row_token[K] = 0;
          if (r.dropped) *r.dropped = 0;
        }
        __threadfence();  // before any thread of this block triggers GEMM2's launch
      }
    }
  }
  __syncthreads();
  t_mid[kStampRouted] = perf::stamp_time();
  GroupedGemmArgs b = a;
  b.rows.expert_ids = slot_expert;
  b.rows.row_start = first_row;
  b.rows.row_count = expert_rows;
  b.rows.gather = row_token;
  b.wait_first = false;
  if constexpr (fold) {
    auto wait_x = [=] {  // routed blocks waited before routing
      if (!shared_block) return;
      asm volatile("griddepcontrol.wait;" ::: "memory");
      // One writer: lane 0 of the warp whose k range starts at chunk 0 (warps without chunks
      // never get here: at small k warp 0 may be one of them). Read after the epilogue's barrier.
      if (lane == 0 && warp * (a.k / kChunkK) / KW == 0) fold_sum(E, inv_rms_s);
    };
    auto x_scale = [] { return inv_rms_s; };
    decode_block<1, KW, kLateChunks, true, true, false, kDecodeFull, false, decltype(wait_x),
                 SCALES_SMEM>(b, int(blockIdx.x), int(blockIdx.y), wait_x, t_mid, x_scale);
  } else {
    auto wait_x = [shared_block] {
      if (shared_block) asm volatile("griddepcontrol.wait;" ::: "memory");
    };
    decode_block<1, KW, kLateChunks, true, true, false, kDecodeFull, false, decltype(wait_x),
                 SCALES_SMEM>(b, int(blockIdx.x), int(blockIdx.y), wait_x, t_mid);
  }
  decode_block_stamp(a, perf::kStampMoeGemm1, t_start, t_mid);
}

template <bool kSoftmax, int kPerLane, bool SCALES_SMEM, int KW, int MINB>
__global__ void __launch_bounds__(KW * 32, MINB)
    moe_decode_routed_kernel(const GroupedGemmArgs a, const Gemm1Routing r) {
  routed_gemm1_block<kSoftmax, kPerLane, SCALES_SMEM, KW, MINB, false>(a, r, Gemm1Fold{});
}
template <int kPerLane, bool SCALES_SMEM, int KW, int MINB>
__global__ void __launch_bounds__(KW * 32, MINB)
    moe_decode_routed_fold_kernel(const GroupedGemmArgs a, const Gemm1Routing r,
                                  const Gemm1Fold f) {
  routed_gemm1_block<false, kPerLane, SCALES_SMEM, KW, MINB, true>(a, r, f);
}

template <int NT, int KW, int U, bool LATE, int MINB, int DIAG = kDecodeFull>
cudaError_t launch_variant(const GroupedGemmArgs& args, cudaStream_t stream, int scales_smem = 0) {
  GroupedGemmArgs a = args;
  a.stamps = perf::block_stamp_buffer();
  if (a.stamps) a.stamp_launch = perf::next_block_stamp_launch();
  const dim3 grid{unsigned(a.n / 32), unsigned(a.num_slots), 1u};
  const dim3 block(KW * 32);
  // a.pdl: programmatic dependent launch (the kernel waits before reading activations).
  const KernelLaunch launch(grid, block, stream, a.pdl);
  // The kernel of a's output form (act bf16, y f32, y bf16), scales loaded or staged.
  auto go = [&]<bool SCALES_SMEM>() {
    if (a.gated)
      return launch(moe_decode_kernel<NT, KW, U, LATE, MINB, true, false, DIAG, SCALES_SMEM>, a);
    if (a.out_f32)
      return launch(moe_decode_kernel<NT, KW, U, LATE, MINB, false, true, DIAG, SCALES_SMEM>, a);
    return launch(moe_decode_kernel<NT, KW, U, LATE, MINB, false, false, DIAG, SCALES_SMEM>, a);
  };
  if constexpr (LATE && DIAG == kDecodeFull && NT == 1) {
    if (scales_smem < 0)
      scales_smem = decode_scales_in_smem(long(grid.x) * grid.y, MINB, current_device_sm_count(),
                                          a.k, KW);
    if (scales_smem > 0 && decode_warp_chunks(a.k, KW) > kScalesSmemMaxWarpChunks)
      return cudaErrorInvalidValue;  // the staging buffer holds kScalesSmemMaxWarpChunks chunks
    if (scales_smem > 0) return go.template operator()<true>();
  }
  return go.template operator()<false>();
}

// The original register-streaming shape (U = 4, activations with the weights), every NT.
template <int NT>
cudaError_t launch_classic(const GroupedGemmArgs& a, int k_warps, cudaStream_t stream) {
  switch (k_warps) {
    case 4: return launch_variant<NT, 4, 4, false, 0>(a, stream);
    case 8: return launch_variant<NT, 8, 4, false, 0>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

// Variant key: token tiles, k-warps, chunks per batch, blocks per SM.
constexpr int key(int nt, int kw, int u, int minb) { return ((nt * 16 + kw) * 16 + u) * 16 + minb; }

// The late-activation shapes that are instantiated (each costs compile time); minb 0 means 16/KW
// (128 registers per thread).
cudaError_t launch_late(const GroupedGemmArgs& a, const DecodeConfig& c, cudaStream_t stream) {
  if (c.k_warps <= 0) return cudaErrorInvalidValue;
  const int minb = c.min_blocks_per_sm > 0 ? c.min_blocks_per_sm : 16 / c.k_warps;
  const int k = key(c.token_tiles, c.k_warps, c.chunks_per_batch, minb);
  constexpr int kDefault = key(1, kLateKWarps, kLateChunks, kLateBlocksPerSm);
  if (c.diag == kDecodeLoadsOnly && k == kDefault)
    return launch_variant<1, kLateKWarps, kLateChunks, true, kLateBlocksPerSm, kDecodeLoadsOnly>(
        a, stream);
  if (c.diag == kDecodeLoadsOnly && k == key(1, 4, 8, 4))
    return launch_variant<1, 4, 8, true, 4, kDecodeLoadsOnly>(a, stream);
  if (c.diag == kDecodeNoDequant && k == kDefault)
    return launch_variant<1, kLateKWarps, kLateChunks, true, kLateBlocksPerSm, kDecodeNoDequant>(
        a, stream);
  if (c.diag != kDecodeFull) return cudaErrorInvalidValue;
  switch (k) {
    case key(1, 4, 4, 4): return launch_variant<1, 4, 4, true, 4>(a, stream, c.scales_smem);
    case key(1, 4, 4, 5): return launch_variant<1, 4, 4, true, 5>(a, stream, c.scales_smem);
    case key(1, 4, 4, 6): return launch_variant<1, 4, 4, true, 6>(a, stream, c.scales_smem);
    case key(1, 4, 2, 8): return launch_variant<1, 4, 2, true, 8>(a, stream, c.scales_smem);
    case key(1, kLateWideKWarps, 2, kLateWideBlocksPerSm):
      return launch_variant<1, kLateWideKWarps, 2, true, kLateWideBlocksPerSm>(a, stream,
                                                                              c.scales_smem);
    case key(1, kLateNarrowKWarps, 2, kLateNarrowMinBlocksPerSm):
      return launch_variant<1, kLateNarrowKWarps, 2, true, kLateNarrowMinBlocksPerSm>(
          a, stream, c.scales_smem);
    case key(1, kLateNarrowKWarps, 2, kLateNarrowBlocksPerSm):
      return launch_variant<1, kLateNarrowKWarps, 2, true, kLateNarrowBlocksPerSm>(a, stream,
                                                                                c.scales_smem);
    case key(1, 2, 8, 8): return launch_variant<1, 2, 8, true, 8>(a, stream, c.scales_smem);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_decode_pair(const GroupedGemmArgs& a1, const GroupedGemmArgs& a2,
                               uint32_t* done, cudaStream_t stream) {
  if (a1.num_slots != a2.num_slots || !a1.gated || a2.gated || !a2.out_f32 || done == nullptr)
    return cudaErrorInvalidValue;
  if (a1.num_slots <= 0) return cudaSuccess;
  const unsigned blocks = unsigned((a1.n / 32 + a2.n / 32) * a1.num_slots);
  // gemm1_pdl: GEMM2's blocks read the row mapping first too.
  GroupedGemmArgs b2 = a2;
  b2.wait_first = a1.wait_first;
  const KernelLaunch launch(dim3(blocks), dim3(kLateKWarps * 32), stream, a1.pdl);
  return launch(moe_decode_pair_kernel, a1, b2, done);
}

cudaError_t launch_decode_routed(const GroupedGemmArgs& args, const Gemm1Routing& r,
                                 cudaStream_t stream, const Gemm1Fold* fold) {
  GroupedGemmArgs a = args;
  a.stamps = perf::block_stamp_buffer();
  if (a.stamps) a.stamp_launch = perf::next_block_stamp_launch();
  const dim3 grid{unsigned(a.n / 32), unsigned(a.num_slots), 1u};
  const long blocks = long(grid.x) * grid.y;
  const int sms = current_device_sm_count();
  const bool softmax = r.router.scoring == moe::Scoring::Softmax;
  const bool narrow = r.router.num_experts <= 128;  // 4 routing scores per lane
  auto go = [&]<int KW, int MINB>() {
    const KernelLaunch launch(grid, dim3(KW * 32), stream, a.pdl);
    auto with = [&]<bool SCALES_SMEM>() {
      if (softmax && narrow)
        return launch(moe_decode_routed_kernel<true, 4, SCALES_SMEM, KW, MINB>, a, r);
      if (softmax) return launch(moe_decode_routed_kernel<true, 8, SCALES_SMEM, KW, MINB>, a, r);
      if (fold && narrow)
        return launch(moe_decode_routed_fold_kernel<4, SCALES_SMEM, KW, MINB>, a, r, *fold);
      if (fold) return launch(moe_decode_routed_fold_kernel<8, SCALES_SMEM, KW, MINB>, a, r, *fold);
      if (narrow) return launch(moe_decode_routed_kernel<false, 4, SCALES_SMEM, KW, MINB>, a, r);
      return launch(moe_decode_routed_kernel<false, 8, SCALES_SMEM, KW, MINB>, a, r);
    };
    return decode_scales_in_smem(blocks, MINB, sms, a.k, KW) ? with.template operator()<true>()
                                                             : with.template operator()<false>();
  };
  if (late_grid_takes_wide_shape(blocks, sms))
    return go.template operator()<kLateWideKWarps, kLateWideBlocksPerSm>();
  // The register bound admits as many blocks per SM as the grid needs in one wave, not 8 (72 or
  // 80 registers). GLM-4.5-Air's 792 blocks at 6 per SM: batch 1 -0.2..-0.7%, GLM-4.7's 864 at 7:
  // -3.9% (H200, bench/results/2026-12-04-session49-h200.md).
  switch (routed_blocks_per_sm(blocks, sms)) {
    case kRoutedMinBlocksPerSm:
      return go.template operator()<kLateKWarps, kRoutedMinBlocksPerSm>();
    case kRoutedMinBlocksPerSm + 1:
      return go.template operator()<kLateKWarps, kRoutedMinBlocksPerSm + 1>();
    default: return go.template operator()<kLateKWarps, kLateBlocksPerSm>();
  }
}

bool decode_scales_in_smem(long blocks, int blocks_per_sm, int sms, int k, int k_warps) {
  const long wave = long(blocks_per_sm) * sms;
  return blocks_per_sm > 0 && 2 * blocks >= wave && blocks <= wave && k_warps > 0 &&
         decode_warp_chunks(k, k_warps) <= kScalesSmemMaxWarpChunks;
}

DecodeConfig one_wave_late_config(const GroupedGemmArgs& a, DecodeConfig c,
                                  bool wide_small_grids) {
  const long blocks = long(a.n / 32) * a.num_slots, sms = current_device_sm_count();
  if (wide_small_grids && is_default_late(c) && late_grid_takes_wide_shape(blocks, int(sms))) {
    c.k_warps = kLateWideKWarps;
    c.min_blocks_per_sm = kLateWideBlocksPerSm;
    return c;
  }
  if (is_default_late(c) && blocks > kLateBlocksPerSm * sms &&
      blocks <= kLateNarrowBlocksPerSm * sms) {
    c.k_warps = kLateNarrowKWarps;
    // GLM-4.5-Air's 1152 blocks at 9 per SM: batch 1 -0.8..-1.3% (H200, session 49).
    c.min_blocks_per_sm = narrow_blocks_per_sm(blocks, int(sms));
  }
  return c;
}

int classic_decode_k_warps(const GroupedGemmArgs& a) {
  return (a.n / 32) * a.num_slots < 2 * current_device_sm_count() ? 8 : 4;
}

cudaError_t launch_decode(const GroupedGemmArgs& a, DecodeConfig cfg, cudaStream_t stream) {
  if (a.num_slots <= 0 || a.n <= 0) return cudaSuccess;
  if (cfg.late_x) return launch_late(a, cfg, stream);
  switch (cfg.token_tiles) {
    case 1: return launch_classic<1>(a, cfg.k_warps, stream);
    case 2: return launch_classic<2>(a, cfg.k_warps, stream);
    case 4: return launch_classic<4>(a, cfg.k_warps, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace tetra::moe_detail
