// What a model asks of a MoE backend, read from config.json and the quant config alone (no
// tensor data): expert weight format, whether activation scales exist, the layer shape per GPU,
// the parallel split and the memory it needs. Backend declarations are checked against this.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "format/model_config.h"
#include "format/quant_config.h"
#include "perf/memory_fit.h"

namespace tetra {

enum class WeightFormat { BF16, NVFP4, FP8 };
enum class ActFormat { BF16, NVFP4 };  // BF16 activations = W4A16; NVFP4 activations = W4A4
enum class TokenLayout { Masked, Contiguous };
std::string_view weight_format_name(WeightFormat f);  // "BF16", "NVFP4", "FP8"
std::string_view act_format_name(ActFormat f);        // "BF16", "NVFP4"
std::string_view token_layout_name(TokenLayout l);    // "masked", "contiguous"
// "None (bf16)", "NVFP4", "W4A16_NVFP4", "FP8"
std::string quant_algo_label(QuantAlgo a);

struct MoeWorkload {
  std::string model_label;  // preset name or checkpoint directory
  std::string arch;         // HF architecture name
  QuantAlgo expert_algo = QuantAlgo::None;  // of the routed experts
  WeightFormat expert_weights = WeightFormat::BF16;
  bool has_input_scale = false;  // NVFP4 checkpoints carry input_scale; W4A16_NVFP4 do not
  int64_t hidden = 0, moe_intermediate = 0, experts = 0, top_k = 0;
  std::string activation = "silu";  // all four architectures: down(silu(gate) * up)
  ParallelPlan plan;
  int64_t moe_intermediate_per_gpu = 0;  // moe_intermediate / plan.moe_tp()
  // Problems no backend can fix (tp not dividing heads, experts in several formats...).
  std::vector<std::string> model_problems;
  // Weights + minimal KV cache. Not known (zeros) when the checkpoint has FP8 layers, which
  // Tetra cannot load or size; that is a model problem then.
  bool memory_known = false;
  MemoryNeed memory_per_gpu;      // at `plan`
  MemoryNeed memory_one_process;  // whole model, for the cpu backend
  // Asked by the runtime; nullopt / 0 = not constrained (what check assumes).
  std::optional<TokenLayout> layout;
  int64_t tokens_per_launch = 0;
};

// Divisibility of heads, kv heads, intermediate sizes and experts by the split; empty when the
// plan works for this model.
std::vector<std::string> parallel_problems(const ModelConfig& cfg, ParallelPlan plan);

MoeWorkload describe_workload(const ModelConfig& cfg, const QuantConfig& quant, ParallelPlan plan,
                              std::string model_label);

}  // namespace tetra
