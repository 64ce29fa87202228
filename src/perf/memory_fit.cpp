#include "perf/memory_fit.h"

#include <cstdio>

#include "core/error.h"
#include "format/model_size.h"

namespace tetra {
namespace {

constexpr double kBf16Bytes = 2.0;

// How many ways one module kind is split under `plan` (ParallelPlan's comment says why).
double split_ways(ModuleKind kind, ParallelPlan plan) {
  switch (kind) {
    case ModuleKind::RoutedExpert:
      return plan.world();  // ep groups of experts, each expert split moe_tp ways
    case ModuleKind::Attention:
    case ModuleKind::DenseMlp:
    case ModuleKind::SharedExpert:
    case ModuleKind::Embedding:
    case ModuleKind::LmHead:
      return plan.tp;
    case ModuleKind::Indexer:  // small per-layer projections: counted as replicated (conservative)
    case ModuleKind::Router:
    case ModuleKind::Norm:
      return 1;
  }
  return 1;
}

}  // namespace

double kv_bytes_per_token(const ModelConfig& cfg, ParallelPlan plan) {
  double per_layer = 0;
  if (cfg.attention == AttentionKind::MLA) {
    per_layer = double(cfg.kv_lora_rank + cfg.qk_rope_head_dim) * kBf16Bytes;
  } else {
    // A GPU holds kv_heads / tp heads, at least one (tp beyond the kv heads replicates them).
    int64_t heads = cfg.num_key_value_heads / plan.tp;
    if (heads < 1) heads = 1;
    per_layer = 2.0 * double(heads * cfg.head_dim) * kBf16Bytes;  // K and V
  }
  double total = per_layer * double(cfg.num_layers);
  if (cfg.index_n_heads > 0) {
    for (int64_t layer = 0; layer < cfg.num_layers; ++layer)
      if (cfg.layer_has_indexer(layer)) total += double(cfg.index_head_dim) * kBf16Bytes;
  }
  return total;
}

MemoryNeed memory_need(const ModelConfig& cfg, const QuantConfig& quant, ParallelPlan plan) {
  TETRA_CHECK(plan.tp >= 1 && plan.ep >= 1, "tp ", plan.tp, " ep ", plan.ep);
  const ModelSize size = model_size(cfg, quant);
  MemoryNeed need;
  for (const auto& [kind, part] : size.total) need.weights_bytes += part.bytes / split_ways(kind, plan);
  need.kv_bytes = kv_bytes_per_token(cfg, plan) * double(kMinimalKvTokens);
  return need;
}

std::string format_gb(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}

std::string describe_fit(const MemoryFit& fit) {
  return str("weights ", format_gb(fit.need.weights_bytes), " + KV cache ",
             format_gb(fit.need.kv_bytes), " = ", format_gb(fit.need.total()), "; ",
             int(kUsableMemoryFraction * 100), "% of ", format_gb(double(fit.capacity_bytes)),
             " is ", format_gb(fit.usable_bytes()));
}

}  // namespace tetra
