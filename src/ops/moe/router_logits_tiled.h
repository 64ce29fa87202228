// Router logits for many tokens (prefill, large batches): the same values as
// cuda::router_logits (bit-identical to router_logits_cpu), computed in block tiles of tokens x
// experts whose rows are staged through shared memory, so that each staged piece feeds several
// dot products. The MoE layer uses it from kRouterTiledMinLogits logits (T x E) up; below, the
// one-warp-per-logit kernel has more parallelism. Measured on the H200 (tests/gpu/
// bench_router_logits, session 26): at GLM-5, GLM-4.5-Air and Qwen3-30B-A3B router shapes the
// one-warp kernel is faster up to 6144 logits and even or slower from 8192.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace tetra::moe::cuda {

inline constexpr long kRouterTiledMinLogits = 8192;

// A block of 8 warps, 2 along tokens x 4 along experts, each computing a warp tile of
// warp_tokens x warp_experts logits: the block covers (2 * warp_tokens) x (4 * warp_experts).
struct RouterTileShape {
  int warp_tokens, warp_experts;
  int block_tokens() const { return 2 * warp_tokens; }
  int block_experts() const { return 4 * warp_experts; }
};
// The shapes the kernel is compiled for, smallest block tile first.
inline constexpr RouterTileShape kRouterTileShapes[] = {{2, 2}, {2, 4}, {4, 4}, {4, 8}};
inline constexpr int kRouterTileShapeCount = 4;

// Which of kRouterTileShapes router_logits_tiled runs for T tokens x E experts on `sms` SMs: the
// largest block tile that still gives at least two thirds of the SMs a block, else the smallest.
// A block's time grows with its warp tile's dot products, so below that the larger tile loses;
// measured (session 26) the rule picks the fastest shape or one within 2% of it at every row
// from 8192 logits.
int router_tile_for(int T, int E, int sms);

// Why router_logits_tiled cannot take these operands ("" when it can): H % 8 == 0 and 16-byte
// aligned x and gate rows.
std::string router_logits_tiled_unsupported_reason(const void* x, const uint16_t* w_gate, int H);

// x [T, H] (BF16 or F32), w_gate_bf16 [E, H] -> logits [T, E] float32. `shape` picks one of
// kRouterTileShapes (-1: router_tile_for on the current device; tests and benchmarks pin it).
// A plain launch: behind it the MoE layer's routing chain stays off PDL (moe_layer_cuda.h).
cudaError_t router_logits_tiled(const void* x, DType x_dtype, const uint16_t* w_gate_bf16, int T,
                                int H, int E, float* logits, cudaStream_t stream, int shape = -1);

}  // namespace tetra::moe::cuda
