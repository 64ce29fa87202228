// Router logits for many tokens (prefill, large batches): the same values as
// cuda::router_logits (bit-identical to router_logits_cpu), computed in warp tiles of tokens x
// experts so that each load feeds several dot products. The MoE layer uses it from
// kRouterTiledMinTokens tokens up; below, the one-warp-per-logit kernel has more parallelism.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace tetra::moe::cuda {

inline constexpr int kRouterTiledMinTokens = 32;

// Why router_logits_tiled cannot take these operands ("" when it can): H % 8 == 0 and 16-byte
// aligned x and gate rows.
std::string router_logits_tiled_unsupported_reason(const void* x, const uint16_t* w_gate, int H);

// x [T, H] (BF16 or F32), w_gate_bf16 [E, H] -> logits [T, E] float32.
cudaError_t router_logits_tiled(const void* x, DType x_dtype, const uint16_t* w_gate_bf16, int T,
                                int H, int E, float* logits, cudaStream_t stream);

}  // namespace tetra::moe::cuda
