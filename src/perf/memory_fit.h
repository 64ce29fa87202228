// Does the model fit? Weights held by one GPU at a given tensor/expert parallel split, plus a
// minimal KV cache, against that GPU's memory. `tetra check` prints it; backends refuse on it.
#pragma once
#include <cstdint>
#include <string>

#include "format/model_config.h"
#include "format/quant_config.h"

namespace tetra {

// The smallest useful cache: one sequence of this many tokens in BF16.
constexpr int64_t kMinimalKvTokens = 4096;
// Share of device memory weights + cache may take; the rest is left for activations,
// workspaces and the CUDA context.
constexpr double kUsableMemoryFraction = 0.9;

// How the model is split. world = max(tp, ep) GPUs; attention, dense MLPs, shared experts and
// the vocabulary are split tp ways; routed experts ep ways, and each expert's intermediate
// dimension world/ep ways (so every GPU holds 1/world of the routed experts).
struct ParallelPlan {
  int tp = 1, ep = 1;
  int world() const { return tp > ep ? tp : ep; }
  int moe_tp() const { return world() / ep; }
};

struct MemoryNeed {
  double weights_bytes = 0;  // held by one GPU
  double kv_bytes = 0;       // one GPU's share of kMinimalKvTokens tokens of cache, BF16
  double total() const { return weights_bytes + kv_bytes; }
};

// Per GPU under `plan`; plan {1, 1} is the whole model in one process.
MemoryNeed memory_need(const ModelConfig& cfg, const QuantConfig& quant, ParallelPlan plan);

// KV cache bytes per token per GPU, all layers: MLA keeps the latent + rope key (kv_lora_rank +
// qk_rope_head_dim, not split by tp); GQA keeps K and V for the GPU's kv heads; the GLM-5 DSA
// indexer adds one index_head_dim key per indexer layer.
double kv_bytes_per_token(const ModelConfig& cfg, ParallelPlan plan);

struct MemoryFit {
  MemoryNeed need;
  int64_t capacity_bytes = 0;
  double usable_bytes() const { return capacity_bytes * kUsableMemoryFraction; }
  bool fits() const { return need.total() <= usable_bytes(); }
};

// "12.3 GB": decimal gigabytes with one decimal, how check reports memory.
std::string format_gb(double bytes);
// "weights 420.1 GB + KV cache 1.2 GB = 421.3 GB; 90% of 150.1 GB is 135.1 GB"
std::string describe_fit(const MemoryFit& fit);

}  // namespace tetra
