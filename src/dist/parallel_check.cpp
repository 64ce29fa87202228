#include "dist/parallel_check.h"

#include <algorithm>

#include "core/error.h"
#include "dist/sharding_plan.h"
#include "moe/moe_workload.h"

namespace tetra::dist {

std::vector<std::string> new_sharding_problems(const ModelConfig& cfg, const QuantConfig& quant,
                                               ParallelPlan plan,
                                               const std::vector<std::string>& known) {
  std::vector<std::string> out;
  for (std::string& p : sharding_problems(cfg, quant, plan))
    if (std::find(known.begin(), known.end(), p) == known.end()) out.push_back(std::move(p));
  return out;
}

std::optional<std::string> gpu_count_problem(ParallelPlan plan, int visible_gpus) {
  if (plan.world() <= visible_gpus) return std::nullopt;
  return str("this machine has ", visible_gpus, " GPU", visible_gpus == 1 ? "" : "s", "; tp=",
             plan.tp, " ep=", plan.ep, " needs ", plan.world());
}

std::string split_summary(const ModelConfig& cfg, ParallelPlan plan) {
  if (plan.tp < 1 || plan.ep < 1 || !parallel_problems(cfg, plan).empty()) return "";
  const ShardingPlan sp(cfg, plan);
  const RankShards r0 = sp.rank(0);
  std::string out = str("per GPU: attention ", cfg.num_attention_heads / plan.tp, " of ",
                        cfg.num_attention_heads, " heads");
  if (cfg.attention == AttentionKind::MLA) {
    out += " (latent projections whole)";
  } else {
    const int64_t kv = cfg.num_key_value_heads;
    if (kv >= plan.tp)
      out += str(", ", kv / plan.tp, " of ", kv, " KV heads");
    else
      out += str(", 1 of ", kv, " KV heads (each on ", plan.tp / kv, " GPUs)");
  }
  if (cfg.num_dense_layers() > 0)
    out += str("; dense MLP ", cfg.intermediate_size / plan.tp, " of ", cfg.intermediate_size);
  const int64_t shared = cfg.moe_intermediate_size * cfg.n_shared_experts;
  if (shared > 0) out += str("; shared expert ", shared / plan.tp, " of ", shared);
  if (cfg.n_routed_experts > 0)
    out += str("; routed experts ", r0.experts.size, " of ", cfg.n_routed_experts,
               " x intermediate ", cfg.moe_intermediate_size / plan.moe_tp(), " of ",
               cfg.moe_intermediate_size);
  out += str("; vocab ", r0.vocab.size, " of ", cfg.vocab_size);
  return out;
}

}  // namespace tetra::dist
