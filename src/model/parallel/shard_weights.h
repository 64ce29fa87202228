// One rank's part of a model's weights under a tensor/expert parallel split (dist/sharding_plan.h
// decides which rows/columns/experts each rank holds; this file cuts the host views).
//
//   - Row splits (Split::Out: q/k/v, gate/up) view the parent's bytes in place (rows are
//     contiguous); column splits (Split::In: o_proj, down_proj) are copied into buffers owned by
//     the result, row by row: BF16 [N, K] -> [N, cols]; NVFP4 weight [N, K/2] -> [N, cols/2]
//     bytes and weight_scale [N, K/16] -> [N, cols/16] (ModelOpt stores the scales linear,
//     row-major, so a column block of scales is a plain byte slice; cols % 16 == 0 is checked
//     by sharding_problems).
//   - A column-split layer's bias is added once: rank 0 of the sum keeps it, the others drop it.
//   - Every rank computes its share and the model's all_reduce sums ALL ranks. A weight that the
//     plan replicates over ranks whose outputs are summed (attention and dense MLP when
//     tp < world; a shared expert replica that is not `counted`) must contribute once: the
//     replicas beyond the first get an all-zero output projection (o_proj / down_proj), so
//     their partial is exactly 0. (The cost: replicated work, as replicated attention has.)
//   - Dense MLPs are split tp ways only when each slice is a multiple of 64 (the NVFP4 W4A16
//     linears read k in chunks of 64; GLM-4.5-Air's 10944 / 2 = 5472 is not): otherwise every
//     rank holds the whole dense MLP and ranks other than 0 get a zero down_proj (dense layers
//     are the first 1-3 of these models, so the replicated work is small).
//   - Routed experts: the rank's contiguous block [expert_begin, expert_begin + E/ep); the
//     router keeps all E rows.
//   - Embedding, final norm, norms, router and lm_head are whole on every rank (replicated:
//     the logits come from rank 0).
// Shape-only weights (data == nullptr, as bench::shape_only_weights makes) give shape-only
// shards, for prepare_random.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "dist/sharding_plan.h"
#include "model/model_weights.h"

namespace tetra::model::parallel {

struct RankWeights {
  ModelWeights weights;                    // views into the parent or into `owned`
  std::deque<std::vector<uint8_t>> owned;  // column-sliced / zeroed copies (deque: stable)
};

// The per-rank config: heads / tp, KV heads / tp (1 when tp > KV heads: replicated), dense and
// shared intermediates / tp, routed experts' intermediate / moe_tp, routed experts / ep.
ModelConfig rank_config(const ModelConfig& c, const dist::ShardingPlan& plan, int rank);

// Whether the dense MLPs are split tp ways (else replicated: see above).
bool dense_mlp_split(const ModelConfig& c, ParallelPlan plan);
// The sharding options a plan runs with: the shared expert is replicated instead of tp-split when
// its slices would not keep the 64-wide alignment the expert GEMMs read (small shared experts).
dist::ShardingOptions runnable_sharding(const ModelConfig& c, ParallelPlan plan,
                                        dist::ShardingOptions requested);

// Throws tetra::Error naming the tensor when a weight does not have the layout the plan assumes.
// The result points into `w` (and into itself): keep `w` alive, and the result where it is.
std::unique_ptr<RankWeights> shard_weights(const ModelWeights& w, const dist::ShardingPlan& plan,
                                           int rank);

}  // namespace tetra::model::parallel
