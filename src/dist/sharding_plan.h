// Which part of every weight each GPU holds under a tensor/expert parallel split (ParallelPlan,
// perf/memory_fit.h: world = max(tp, ep) ranks). Pure bookkeeping: no GPU, no tensor data.
//
// Rules (Megatron-style, the layout vLLM/SGLang use for these models):
// - Attention, tp ways by heads. GQA q_proj/k_proj/v_proj: a block of output rows per rank (q by
//   its heads; k/v by its KV heads, and when tp > KV heads each KV head is replicated on the
//   tp / kv ranks whose q heads use it); o_proj: the matching block of input columns. MLA:
//   q_a_proj and kv_a_proj_with_mqa replicated (the latents are small and shared by all heads);
//   q_b_proj (or q_proj) and kv_b_proj split by heads; o_proj by input columns. The GLM-5 DSA
//   indexer is replicated (memory_fit counts it so too).
// - Dense MLP and the shared expert: gate/up by output rows, down by input columns (tp ways);
//   the shared expert may instead be replicated (ShardingOptions).
// - Routed experts: ep contiguous blocks of experts; within a block, each expert's intermediate
//   is split moe_tp = world / ep ways like an MLP.
// - Router, norms: replicated. lm_head and the embedding: vocabulary rows in tp blocks (the last
//   one shorter when tp does not divide the vocabulary).
// Row-split (Split::In) outputs are partial sums: the all-reduce after attention runs over the
// rank's tp group; the one after an MoE block over all ranks, where routed partials, the shared
// expert's partials (counted once per tp group replica set) add up to the layer's output.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "format/model_config.h"
#include "format/model_layout.h"
#include "format/quant_config.h"
#include "perf/memory_fit.h"

namespace tetra::dist {

// Where one rank sits. rank = tp_group * tp + tp_rank = ep_rank * moe_tp + moe_tp_rank.
struct RankCoords {
  int rank = 0;
  int tp_rank = 0;      // which tp slice of attention / dense / shared weights
  int tp_group = 0;     // which replica of those slices (always 0 when tp == world)
  int ep_rank = 0;      // which block of routed experts
  int moe_tp_rank = 0;  // which slice of each held expert's intermediate
};
RankCoords rank_coords(ParallelPlan plan, int rank);

// [begin, begin + size)
struct IndexRange {
  int64_t begin = 0, size = 0;
  int64_t end() const { return begin + size; }
  bool contains(int64_t i) const { return i >= begin && i < end(); }
  friend bool operator==(const IndexRange&, const IndexRange&) = default;
};

enum class Split {
  Whole,  // the whole weight (on every rank that holds it)
  Out,         // a block of output features (rows of W [out, in]); outputs are complete
  In,          // a block of input features (columns of W); outputs are partial sums
};
const char* split_name(Split s);  // "whole", "out", "in"

// One linear on one rank: the rank holds W[rows, cols] of W [out_features, in_features] (and the
// same rows of a bias). `held` false: nothing of it (a routed expert of another EP block).
// `counted` false: the rank computes it but must leave its result out of the all-reduce (a
// replica whose twin on another rank already contributes).
struct LinearShard {
  const LinearSpec* spec = nullptr;  // into the plan's layout
  Split split = Split::Whole;
  IndexRange rows, cols;
  bool held = true;
  bool counted = true;
};

struct ShardingOptions {
  bool shared_expert_tp = true;  // false: every rank holds the whole shared expert
};

struct RankShards {
  RankCoords coords;
  IndexRange experts;  // routed experts held (empty without MoE layers)
  IndexRange vocab;    // rows of embed_tokens and lm_head held
  std::vector<LinearShard> linears;  // one per linear of the layout, same order
};

// Every reason `plan` cannot split this model, empty when it can: the divisibility rules of
// parallel_problems (moe/moe_workload.h) plus, for quantized linears, row-split slices that must
// hold whole NVFP4 blocks (16 input features share a scale).
std::vector<std::string> sharding_problems(const ModelConfig& cfg, const QuantConfig& quant,
                                           ParallelPlan plan);

class ShardingPlan {
 public:
  // Throws tetra::Error listing every problem (sharding_problems without quantization).
  // Shards point into layout(): keep the plan alive while using them.
  ShardingPlan(const ModelConfig& cfg, ParallelPlan plan, ShardingOptions options = {});

  ParallelPlan plan() const { return plan_; }
  int world() const { return plan_.world(); }
  const ModelLayout& layout() const { return layout_; }
  RankShards rank(int r) const;
  // The shard of one linear (an entry of layout().linears) on rank r.
  LinearShard shard(const LinearSpec& spec, int r) const;

 private:
  RankShards ranges(int r) const;  // coords, experts and vocab; no linears
  LinearShard attention_shard(const LinearSpec& s, const RankCoords& c) const;
  LinearShard mlp_shard(const LinearSpec& s, int64_t width, int ways, int slice) const;

  ModelConfig cfg_;
  ParallelPlan plan_;
  ShardingOptions options_;
  ModelLayout layout_;
};

}  // namespace tetra::dist
