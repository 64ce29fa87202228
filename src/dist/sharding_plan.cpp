#include "dist/sharding_plan.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "moe/moe_workload.h"

namespace tetra::dist {
namespace {

// "model.layers.3.self_attn.q_proj" -> "q_proj"
std::string_view last_part(const std::string& module) {
  const size_t dot = module.rfind('.');
  return dot == std::string::npos ? std::string_view(module)
                                  : std::string_view(module).substr(dot + 1);
}

IndexRange whole(int64_t n) { return {0, n}; }

// Slice `slice` of `ways` equal slices of n (n % ways == 0, checked by parallel_problems).
IndexRange equal_slice(int64_t n, int ways, int slice) {
  const int64_t size = n / ways;
  return {size * slice, size};
}

std::string join_problems(const std::vector<std::string>& p) {
  std::string out;
  for (const std::string& s : p) out += "\n  - " + s;
  return out;
}

}  // namespace

const char* split_name(Split s) {
  switch (s) {
    case Split::Whole: return "whole";
    case Split::Out: return "out";
    case Split::In: return "in";
  }
  return "?";
}

RankCoords rank_coords(ParallelPlan plan, int rank) {
  TETRA_CHECK(rank >= 0 && rank < plan.world(), "rank ", rank, " of ", plan.world());
  RankCoords c;
  c.rank = rank;
  c.tp_rank = rank % plan.tp;
  c.tp_group = rank / plan.tp;
  c.moe_tp_rank = rank % plan.moe_tp();
  c.ep_rank = rank / plan.moe_tp();
  return c;
}

ShardingPlan::ShardingPlan(const ModelConfig& cfg, ParallelPlan plan, ShardingOptions options)
    : cfg_(cfg), plan_(plan), options_(options) {
  const std::vector<std::string> problems = parallel_problems(cfg, plan);
  if (!problems.empty())
    TETRA_FAIL("cannot split ", arch_hf_name(cfg.arch), " at tp=", plan.tp, " ep=", plan.ep, ":",
               join_problems(problems));
  layout_ = model_layout(cfg_);
}

LinearShard ShardingPlan::mlp_shard(const LinearSpec& s, int64_t width, int ways, int slice) const {
  LinearShard sh;
  sh.spec = &s;
  sh.rows = whole(s.out_features);
  sh.cols = whole(s.in_features);
  if (ways == 1) return sh;
  if (last_part(s.module) == "down_proj") {
    sh.split = Split::In;
    sh.cols = equal_slice(width, ways, slice);
  } else {  // gate_proj, up_proj
    sh.split = Split::Out;
    sh.rows = equal_slice(width, ways, slice);
  }
  return sh;
}

LinearShard ShardingPlan::attention_shard(const LinearSpec& s, const RankCoords& c) const {
  LinearShard sh;
  sh.spec = &s;
  sh.rows = whole(s.out_features);
  sh.cols = whole(s.in_features);
  const int tp = plan_.tp;
  if (tp == 1) return sh;
  const std::string_view name = last_part(s.module);
  const int64_t heads = cfg_.num_attention_heads / tp;  // q heads per rank
  const int64_t first_head = heads * c.tp_rank;
  auto out_heads = [&](int64_t first, int64_t n, int64_t rows_per_head) {
    sh.split = Split::Out;
    sh.rows = {first * rows_per_head, n * rows_per_head};
  };
  if (cfg_.attention == AttentionKind::GQA) {
    const int64_t hd = cfg_.head_dim, kv = cfg_.num_key_value_heads;
    if (name == "q_proj") {
      out_heads(first_head, heads, hd);
    } else if (name == "k_proj" || name == "v_proj") {
      if (kv >= tp)
        out_heads(kv / tp * c.tp_rank, kv / tp, hd);
      else  // tp / kv ranks share each KV head: the one their q heads belong to
        out_heads(c.tp_rank / (tp / kv), 1, hd);
    } else if (name == "o_proj") {
      sh.split = Split::In;
      sh.cols = {first_head * hd, heads * hd};
    } else {
      TETRA_FAIL("sharding: unexpected attention linear ", s.module);
    }
    return sh;
  }
  // MLA
  const int64_t qk_head = cfg_.qk_nope_head_dim + cfg_.qk_rope_head_dim;
  if (name == "q_a_proj" || name == "kv_a_proj_with_mqa") return sh;  // latents: whole
  if (name == "q_b_proj" || name == "q_proj")
    out_heads(first_head, heads, qk_head);
  else if (name == "kv_b_proj")
    out_heads(first_head, heads, cfg_.qk_nope_head_dim + cfg_.v_head_dim);
  else if (name == "o_proj") {
    sh.split = Split::In;
    sh.cols = {first_head * cfg_.v_head_dim, heads * cfg_.v_head_dim};
  } else {
    TETRA_FAIL("sharding: unexpected MLA linear ", s.module);
  }
  return sh;
}

LinearShard ShardingPlan::shard(const LinearSpec& s, int r) const {
  const RankCoords c = rank_coords(plan_, r);
  switch (s.kind) {
    case ModuleKind::Attention: return attention_shard(s, c);
    case ModuleKind::DenseMlp: return mlp_shard(s, cfg_.intermediate_size, plan_.tp, c.tp_rank);
    case ModuleKind::SharedExpert: {
      const int64_t width = cfg_.moe_intermediate_size * cfg_.n_shared_experts;
      if (!options_.shared_expert_tp) {
        LinearShard sh = mlp_shard(s, width, 1, 0);
        sh.counted = c.rank == 0;  // every rank computes it; one adds it to the sum
        return sh;
      }
      LinearShard sh = mlp_shard(s, width, plan_.tp, c.tp_rank);
      sh.counted = c.tp_group == 0;  // tp-sliced replicas beyond the first group add nothing
      return sh;
    }
    case ModuleKind::RoutedExpert: {
      LinearShard sh = mlp_shard(s, cfg_.moe_intermediate_size, plan_.moe_tp(), c.moe_tp_rank);
      sh.held = ranges(r).experts.contains(s.expert);
      sh.counted = sh.held;
      return sh;
    }
    case ModuleKind::LmHead: {
      LinearShard sh;
      sh.spec = &s;
      sh.cols = whole(s.in_features);
      sh.rows = ranges(r).vocab;
      sh.split = plan_.tp > 1 ? Split::Out : Split::Whole;
      return sh;
    }
    case ModuleKind::Indexer:
    case ModuleKind::Router:
    case ModuleKind::Embedding:
    case ModuleKind::Norm: {
      LinearShard sh;
      sh.spec = &s;
      sh.rows = whole(s.out_features);
      sh.cols = whole(s.in_features);
      return sh;
    }
  }
  TETRA_FAIL("sharding: unknown module kind for ", s.module);
}

RankShards ShardingPlan::rank(int r) const {
  RankShards out = ranges(r);
  out.linears.reserve(layout_.linears.size());
  for (const LinearSpec& s : layout_.linears) out.linears.push_back(shard(s, r));
  return out;
}

RankShards ShardingPlan::ranges(int r) const {
  RankShards out;
  out.coords = rank_coords(plan_, r);
  if (cfg_.n_routed_experts > 0)
    out.experts = equal_slice(cfg_.n_routed_experts, plan_.ep, out.coords.ep_rank);
  const int64_t block = (cfg_.vocab_size + plan_.tp - 1) / plan_.tp;
  const int64_t begin = std::min(cfg_.vocab_size, block * out.coords.tp_rank);
  out.vocab = {begin, std::min(block, cfg_.vocab_size - begin)};
  return out;
}

std::vector<std::string> sharding_problems(const ModelConfig& cfg, const QuantConfig& quant,
                                           ParallelPlan plan) {
  std::vector<std::string> out = parallel_problems(cfg, plan);
  if (!out.empty()) return out;  // shards are not defined until the split divides
  const ShardingPlan sp(cfg, plan);
  std::set<std::string> seen;  // one line per kind of linear, not per layer and expert
  for (const LinearSpec& s : sp.layout().linears) {
    if (linear_algo(s, quant) == QuantAlgo::None) continue;
    // Rank 0's slice has the size of every rank's (equal slices).
    const LinearShard sh = sp.shard(s, 0);
    if (sh.split != Split::In || sh.cols.size % 16 == 0) continue;
    const std::string what = str(module_kind_name(s.kind), " ", last_part(s.module));
    if (!seen.insert(what).second) continue;
    out.push_back(str(what, ": each GPU's slice of its ", s.in_features, " input features is ",
                      sh.cols.size, ", not a multiple of the 16-value NVFP4 scale block"));
  }
  return out;
}

}  // namespace tetra::dist
