// Internal: the kernel configurations of the W4A16 MoE GEMMs and their launchers, so the
// heuristic (w4a16_moe.cu) and the benchmark can name a configuration explicitly.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <ostream>

#include "ops/moe/w4a16_moe.h"

namespace tetra {
struct Gemm1Routing;  // gemm1_routing.h
struct Gemm1Fold;
}

namespace tetra::moe_detail {

// Several plain matrices over the same x (q, k and v) as one launch of the wgmma kernel: output
// rows [n_begin, n_end) of segment i are the rows of its own matrix (w, s, alpha), written as
// bf16(bf16(acc * alpha) + bias) to out [rows, n_end - n_begin]. Segment ends are multiples of 16
// (a warp's weight tile); a block's 256 rows may span segments. One expert (num_slots 1); the
// GroupedGemmArgs' w, s, alpha0 and out are then unused. A kernel parameter of its own, so the
// other kernels' GroupedGemmArgs stay as small as they were.
struct OutSegment {
  int n_end = 0;
  const uint8_t* w = nullptr;      // [n/16][K/64][32][16] of this segment's matrix
  const uint8_t* s = nullptr;      // [n/16][K/64][32][2]
  const float* alpha = nullptr;    // [1]
  const uint16_t* bias = nullptr;  // [n] bf16, or null
  uint16_t* out = nullptr;         // [rows, n] bf16
};
inline constexpr int kMaxOutSegments = 3;
struct OutSegments {
  int count = 0;  // 0: the plain output (a.w, a.s, a.alpha0, a.out)
  OutSegment seg[kMaxOutSegments];
};

// One grouped GEMM as the kernels see it: packed weights W [E][N/16][K/64][32][16] times rows of
// x [.., K] bf16, written to out [total_rows, N_out].
struct GroupedGemmArgs {
  const uint8_t* w = nullptr;      // [E][N/16][K/64][32][16]
  const uint8_t* s = nullptr;      // [E][N/16][K/64][32][2]
  const float* alpha0 = nullptr;   // [E] gate (gated) or down alpha
  const float* alpha1 = nullptr;   // [E] up alpha (gated only)
  const uint16_t* x = nullptr;     // [.., K] bf16
  void* out = nullptr;             // gated: bf16 [total_rows, N/2]; else [total_rows, N] f32/bf16
  MoeRows rows;
  int n = 0;                       // packed rows (2I for gated, H for down)
  int k = 0;
  int num_slots = 0;               // grid.y for decode; slots scanned by the tiled kernel
  int total_rows = 0;
  bool gated = false;
  bool out_f32 = false;
  bool pdl = false;                // launch as a programmatic dependent (see MoeGemmProblem)
  bool wait_first = false;         // decode kernel: wait for the previous kernel before any read
  unsigned long long* stamps = nullptr;  // decode kernel: perf/block_stamps.h (nullptr: none)
  int stamp_launch = 0;
};

// Diagnostic modes of the late decode kernel, to place its time (tests/gpu/bench_w4a16_moe):
// the same grid, blocks and weight loads, with less work per chunk. Instantiated for the default
// configuration (n8 kw4 u2 b8) and, loads only, for a 4x deeper queue (u8 b4).
enum DecodeDiag {
  kDecodeFull = 0,
  kDecodeLoadsOnly = 1,  // weight and scale loads kept live by an XOR: no activations, no math
  kDecodeNoDequant = 2,  // activation loads and MMAs on the raw words: no dequantize, no scale
};

// The default late decode configuration (decode_config in w4a16_moe.cu): 8 rows per pass, 4
// k-warps, 2-chunk batches, a register cap for 8 blocks per SM. The pair kernel and the
// diagnostics are built for it alone.
inline constexpr int kLateKWarps = 4, kLateChunks = 2, kLateBlocksPerSm = 8;
// Its 3-warp variant, 10 blocks per SM under the same 64-register cap (9 at 72 registers where
// the grid needs no more in one wave: one_wave_late_config).
inline constexpr int kLateNarrowKWarps = 3, kLateNarrowBlocksPerSm = 10;
// Its wide variant (w4a16_decode.cu): 8 k-warps per block (4 blocks per SM under the same cap),
// twice the weight bytes in flight per block, for grids that fill at most 4 blocks per SM: small
// experts, whose default grid leaves each SM ~12 warps and too few loads in flight. Taken by the
// routed GEMM1 (Qwen3-30B-A3B's 384 blocks at one token: batch 1 -2.6..-3.4%,
// bench/results/2026-12-02-session34-h200.md; GLM-4.5-Air's 792 blocks would take two waves) and
// by a programmatic-dependent GEMM2 with MoeGemmProblem::gemm2_wide (one_wave_late_config;
// Qwen3's 512 blocks, bench/results/2026-12-02-session35-h200.md).
inline constexpr int kLateWideKWarps = 8, kLateWideBlocksPerSm = 4;
inline bool late_grid_takes_wide_shape(long blocks, int sms) {
  return blocks <= long(kLateWideBlocksPerSm) * sms;
}
// A register bound that admits no more blocks per SM than a one-wave grid needs, so that blocks
// launched beside a running grid cannot pile onto a few SMs: the grid's per-SM count, clamped to
// the instantiated bounds [lo, hi].
inline int one_wave_blocks_per_sm(long blocks, int sms, int lo, int hi) {
  const long per_sm = (blocks + sms - 1) / std::max(sms, 1);
  return int(std::clamp(per_sm, long(lo), long(hi)));
}
// The routed GEMM1's default shape (w4a16_decode.cu, launch_decode_routed): 6..8 per SM (8 beyond
// one wave).
inline constexpr int kRoutedMinBlocksPerSm = 6;
inline int routed_blocks_per_sm(long blocks, int sms) {
  return one_wave_blocks_per_sm(blocks, sms, kRoutedMinBlocksPerSm, kLateBlocksPerSm);
}
// The one-wave 3-warp GEMM2 (one_wave_late_config): 9 where 9 per SM hold its grid, else 10.
inline constexpr int kLateNarrowMinBlocksPerSm = 9;
inline int narrow_blocks_per_sm(long blocks, int sms) {
  return one_wave_blocks_per_sm(blocks, sms, kLateNarrowMinBlocksPerSm, kLateNarrowBlocksPerSm);
}

// The wgmma kernel's shape (0 = the launcher's choice).
struct WgmmaConfig {
  // k split over a thread-block cluster of this many blocks (1, 2, 4 or 8); each block
  // multiplies its share of the 64-k chunks and rank 0 sums the partials in rank order over
  // distributed shared memory (deterministic). 0: wgmma_k_split() picks.
  int k_split = 0;
  // 32 (two blocks per SM), 64 or 128 tokens; 0: the smallest of them that holds the rows per
  // slot on average.
  int token_tile = 0;
};

struct DecodeConfig {
  int token_tiles = 1;  // n8 tiles of tokens per pass (1, 2 or 4)
  int k_warps = 4;      // warps splitting k inside a block (4 or 8)
  int tiled_blocks_per_sm = 2;  // tiled kernel only: 2 caps registers at 128 for two blocks/SM
  // Decode, late activations (read right before their MMA, fewer registers): off = the classic
  // kernel (4 chunks per batch, activations loaded with the weights).
  bool late_x = false;
  int chunks_per_batch = 4;     // late_x: 64-k chunks per warp load batch
  int min_blocks_per_sm = 0;    // late_x: register cap for this many blocks per SM (0: 16 / k_warps)
  int diag = 0;                 // late_x: a DecodeDiag mode (benchmarks only; results meaningless)
  // late_x, 8 rows per pass: each warp's scale pieces as 2-byte loads beside every weight batch
  // (0) or its whole k range of them copied into shared memory first, 16 bytes per cp.async (1);
  // -1 picks by decode_scales_in_smem. Same bits either way.
  int scales_smem = -1;
  WgmmaConfig wgmma;  // the wgmma kernel only
};
inline std::ostream& operator<<(std::ostream& os, const DecodeConfig& c) {
  os << "decode(n" << 8 * c.token_tiles << ",kw" << c.k_warps;
  if (c.late_x) os << ",late,u" << c.chunks_per_batch << ",b" << c.min_blocks_per_sm;
  if (c.late_x && c.scales_smem >= 0) os << (c.scales_smem ? ",scales-smem" : ",scales-ld");
  return os << ")";
}
// Whether c is the default late configuration (kLate* above), the one the pair kernel runs.
inline bool is_default_late(const DecodeConfig& c) {
  return c.late_x && c.token_tiles == 1 && c.k_warps == kLateKWarps &&
         c.chunks_per_batch == kLateChunks && c.min_blocks_per_sm == kLateBlocksPerSm &&
         c.diag == kDecodeFull;
}

cudaError_t launch_decode(const GroupedGemmArgs& a, DecodeConfig cfg, cudaStream_t stream);
// The default late configuration c, or its 3-warp variant where only that one runs a's grid in
// one wave on this device; with wide_small_grids, the wide shape (kLateWideKWarps at
// kLateWideBlocksPerSm) where a's grid fits that many blocks per SM.
DecodeConfig one_wave_late_config(const GroupedGemmArgs& a, DecodeConfig c,
                                  bool wide_small_grids = false);
// Whether the late kernel stages its scales in shared memory (DecodeConfig::scales_smem = -1):
// for grids of half a wave to one wave (blocks per SM between half and all of blocks_per_sm)
// whose warps' k ranges fit the staging buffer (kScalesSmemMaxWarpChunks chunks). Measured on the
// H200 (bench/results/2026-12-01-session24-h200.md): GLM-4.5-Air decode batch 1 -1.5% (GEMM1 at
// 6 of 8 blocks per SM, GEMM2 at 8.7 of 10), while Qwen3-30B-A3B's one-token grids (2.9 and 3.9
// blocks per SM) ran 1.1% slower with it: the copy's round trip before the first multiply costs
// where few blocks share an SM, the many 64-byte scale requests where many do.
inline constexpr int kScalesSmemMaxWarpChunks = 32;
// The most 64-k chunks one of k_warps warps takes of k (the decode kernel splits k by chunks).
inline constexpr int decode_warp_chunks(int k, int k_warps) {
  return (k / 64 + k_warps - 1) / k_warps;
}
bool decode_scales_in_smem(long blocks, int blocks_per_sm, int sms, int k, int k_warps);
// k-warps for the classic decode kernel on a's grid: 8 under two blocks per SM (more bytes in
// flight per SM where blocks are few: a dense linear, a shared expert's own launch), else 4.
int classic_decode_k_warps(const GroupedGemmArgs& a);
// GEMM1 of one token routed by its own blocks (gemm1_routing.h), default late configuration.
cudaError_t launch_decode_routed(const GroupedGemmArgs& a, const Gemm1Routing& r,
                                 cudaStream_t stream, const Gemm1Fold* fold = nullptr);
// GEMM1 (a1, gated) and GEMM2 (a2, f32 out) of the default late configuration in one grid, GEMM2's
// blocks waiting per slot on counters (done [2 * num_slots], zero between launches).
cudaError_t launch_decode_pair(const GroupedGemmArgs& a1, const GroupedGemmArgs& a2,
                               uint32_t* done, cudaStream_t stream);
cudaError_t launch_tiled(const GroupedGemmArgs& a, int blocks_per_sm, cudaStream_t stream);
// w4a16_wgmma.cu. Returns cudaErrorInvalidValue for a k_split or token_tile it does not build.
cudaError_t launch_wgmma(const GroupedGemmArgs& a, cudaStream_t stream, WgmmaConfig cfg = {},
                         const OutSegments& segments = {});
// The k split for a wgmma grid of `blocks` blocks (an upper bound of those with work) of `chunks`
// 64-k chunks each: doubled from 1 while the split grid still has at most one block per SM of the
// device's `sms` and every block keeps at least kWgmmaMinSplitChunks chunks (the pipeline is 4
// stages of 2), up to clusters of 4 for the one-block-per-SM tile and 8 for the two-per-SM one.
// Measured on the H200 (bench/results/2026-12-01-session25-h200.md): more blocks than SMs, or
// clusters of 8 of the large tile, ran slower (GLM-4.5-Air o_proj at 64 rows 55 us at S = 4, 86
// at 8). A dense linear of 16..255 rows gives the kernel only N / 256 column blocks: GLM-4.5-Air's
// q/k/v 56, o_proj 16.
inline constexpr int kWgmmaMinSplitChunks = 8;
int wgmma_k_split(long blocks, int blocks_per_sm, int sms, int chunks);

// The public launchers with an explicit decode configuration (benchmarks sweep these).
// decode_cfg == nullptr: the heuristic's choice.
cudaError_t gemm1_with(const MoeGemmProblem& p, const MoeWeightsDevice& w, const MoeRows& rows,
                       const uint16_t* x, uint16_t* act, cudaStream_t stream, MoeKernel kernel,
                       const DecodeConfig* decode_cfg);
cudaError_t gemm2_with(const MoeGemmProblem& p, const MoeWeightsDevice& w, const MoeRows& rows,
                       const uint16_t* act, void* y, bool y_f32, cudaStream_t stream,
                       MoeKernel kernel, const DecodeConfig* decode_cfg);

}  // namespace tetra::moe_detail
