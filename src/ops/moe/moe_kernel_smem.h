// Dynamic shared memory of the MoE kernels' launches, for the host: each kernel file sizes its
// launches with these (or checks its own layout against them), and tests/cpu/test_moe_kernel_smem
// adds every kernel's static shared memory (from ptxas) to check the need that the cuda backends
// declare (moe/backend_caps.cpp). The BF16 GEMMs' figure is kMoeBf16SmemBytes (bf16_moe.h).
#pragma once
#include <algorithm>
#include <cstddef>

namespace tetra::moe_smem {

// w4a16_tiled.cu: 4 stages x (8 weight tiles x (512 B + 64 B of scales) + 128 tokens x 144 B).
inline constexpr int kTiled = 4 * (8 * (512 + 64) + 128 * 144);  // 92,160 B

// w4a16_wgmma.cu, token tile of 32, 64 or 128 tokens: 4 stages x 2 chunks x (16 weight tiles x
// (512 + 64) B + the tokens' 8 k groups of 16 B, group stride tokens x 16 + 16 B, in 128 B lines).
// 107,520 / 140,288 / 205,824 B.
constexpr int wgmma(int token_tile) {
  const int group_stride = token_tile * 16 + 16;
  const int x_bytes = (7 * group_stride + token_tile * 16 + 127) / 128 * 128;
  return 4 * 2 * (16 * (512 + 64) + x_bytes);
}

// router_logits_tiled.cu: stages x 32 lanes' 16 B pieces of the block's x rows (2 x warp_tokens,
// x_bytes / 2 pieces per 8 values) and gate rows (4 x warp_experts).
constexpr int router_tiled(int x_bytes, int warp_tokens, int warp_experts, int stages) {
  return stages * 32 * 16 * (2 * warp_tokens * (x_bytes / 2) + 4 * warp_experts);
}

// routing.cu: 4 warps per block, E float selection keys each.
constexpr size_t route(int experts) { return size_t(4) * experts * sizeof(float); }

// The layout builders (layout.cu, and the general token path's layout phase): per expert a count
// and a base (int32) and 32 warps' tallies (bytes); 32 warp sums (int32).
constexpr size_t layout(int experts) { return size_t(experts) * 8 + 32 * 4 + size_t(32) * experts; }
// layout.cu's count kernel (large inputs, step 1): one int32 count per expert.
constexpr size_t layout_count(int experts) { return size_t(experts) * 4; }

// token_path.cu, the general one-launch kernel: its routing warps keep E_global float selection
// keys each, as many warps (1..32) as fit this budget; the layout phase reuses the same bytes.
inline constexpr size_t kTokenPathRouteBudget = 96 * 1024;
constexpr int token_path_route_warps(int E_global) {
  return int(std::clamp<size_t>(kTokenPathRouteBudget / (size_t(E_global) * sizeof(float)), 1, 32));
}
constexpr size_t token_path(int E_global, int E_local) {
  return std::max(size_t(token_path_route_warps(E_global)) * E_global * sizeof(float),
                  layout(E_local));
}

}  // namespace tetra::moe_smem
