// The one-launch token path for a handful of tokens (used by small_token_path when it fits):
// T*top_k <= kTinyThreads pairs, H % 8 == 0 and 16-byte aligned x / gate rows.
//  - logits: blocks of a few experts (at least 4, at most one block per SM); all of a block's
//    gate rows and token rows are copied to shared memory at once (cp.async, every load in
//    flight), then one warp per (token, expert) runs router_dot from shared memory (the same
//    code, the same bits);
//  - the last block routes with one warp per token (scores in registers, redux argmax; at few
//    tokens with sigmoid scoring the whole block first computes the scores, selection keys and
//    group keys, which one warp would otherwise run as long serial chains), then
//    builds the layout and the row bookkeeping in shared memory: one thread per pair, ranks by
//    __match_any_sync and per-warp tallies, one packed block scan for offsets and active slots,
//    the dropped count by __syncthreads_count. Nothing is read back from global memory.
// Same outputs as the general one-launch kernel (token_path.cu) and the separate ops.
#pragma once
#include <cuda_runtime.h>

#include "ops/moe/token_path.h"

namespace tetra::moe::cuda::detail {

inline constexpr int kTinyThreads = 512;  // = the most pairs; 16 warps route up to 16 tokens at once
// The folded RMSNorm (SmallTokenPath::pre_norm_weight): each thread holds up to 2 16-byte pieces
// of the norm weight in registers.
inline constexpr int kTinyPreNormPieces = 2;
inline constexpr int kTinyPreNormMaxH = kTinyPreNormPieces * kTinyThreads * 8;

// Sets the kernels' dynamic shared memory limit to what the device allows (call outside capture).
void tiny_token_path_setup();
// Whether the tiny path takes these arguments (setup done, sizes and alignment as above, and the
// layout and RowsPrep pointers the same buffers).
bool tiny_token_path_fits(const SmallTokenPath& a, int T);
// The layout builder's outputs (layout_device.cuh) of a token path: its layout buffers, local
// experts a.rows.E of a.router.num_experts from a.expert_begin, masked when a.rows.max_m > 0.
struct LayoutOut;
LayoutOut layout_out_of(const SmallTokenPath& a);
cudaError_t tiny_token_path(const SmallTokenPath& a, int T, cudaStream_t stream);
// The same launch, writing phase stamps for profiling to stamps [16] (device): [i] globaltimer ns
// and [8 + i] clock64 at i = 0 block 0 starts, 1 its gate/token rows are in shared memory, 2 its
// logits are written, 3 the last block knows it is last, 4 routing done, 5 layout counts, offsets
// and slots written, 6 done; [7] the last block's index. (0-2 on block 0's SM, 3-6 on the last.)
cudaError_t tiny_token_path_profiled(const SmallTokenPath& a, int T, cudaStream_t stream,
                                     unsigned long long* stamps);

}  // namespace tetra::moe::cuda::detail
