// What `tetra check` says about a tensor/expert parallel split beyond the divisibility rules
// (moe/moe_workload.h parallel_problems): NVFP4 scale blocks cut by row splits, too few GPUs on
// this machine, and a one-line summary of what each GPU holds.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "format/model_config.h"
#include "format/quant_config.h"
#include "perf/memory_fit.h"

namespace tetra::dist {

// sharding_problems(cfg, quant, plan) that are not already in `known` (check lists each once).
std::vector<std::string> new_sharding_problems(const ModelConfig& cfg, const QuantConfig& quant,
                                               ParallelPlan plan,
                                               const std::vector<std::string>& known);

// "this machine has 2 GPUs; tp=8 ep=8 needs 8", or nullopt when visible_gpus is enough.
std::optional<std::string> gpu_count_problem(ParallelPlan plan, int visible_gpus);

// "per GPU: attention 32 of 64 heads (latent projections whole); dense MLP 6144 of 12288;
// shared expert 1024 of 2048; routed experts 32 of 256 x intermediate 2048 of 2048; vocab 77440
// of 154880". Empty when the split does not divide the model (the problems say why).
std::string split_summary(const ModelConfig& cfg, ParallelPlan plan);

}  // namespace tetra::dist
