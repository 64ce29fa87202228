#include "moe/moe_workload.h"

#include <set>

#include "core/error.h"
#include "format/model_layout.h"

namespace tetra {

std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return "BF16";
    case WeightFormat::NVFP4: return "NVFP4";
    case WeightFormat::FP8: return "FP8";
  }
  return "?";
}

std::string_view act_format_name(ActFormat f) {
  return f == ActFormat::BF16 ? "BF16" : "NVFP4";
}

std::string_view token_layout_name(TokenLayout l) {
  return l == TokenLayout::Masked ? "masked" : "contiguous";
}

std::string quant_algo_label(QuantAlgo a) {
  return a == QuantAlgo::None ? std::string("None (bf16)") : std::string(quant_algo_name(a));
}

namespace {

WeightFormat weight_format_of(QuantAlgo a) {
  switch (a) {
    case QuantAlgo::NVFP4:
    case QuantAlgo::W4A16_NVFP4: return WeightFormat::NVFP4;
    case QuantAlgo::FP8: return WeightFormat::FP8;
    case QuantAlgo::None: return WeightFormat::BF16;
  }
  return WeightFormat::BF16;
}

// "tp=3 does not divide 64 attention heads"
std::string not_dividing(std::string_view what, int ways, int64_t n, std::string_view of) {
  return str(what, "=", ways, " does not divide ", n, " ", of);
}

}  // namespace

std::vector<std::string> parallel_problems(const ModelConfig& cfg, ParallelPlan plan) {
  std::vector<std::string> out;
  if (plan.tp < 1 || plan.ep < 1) {
    out.push_back(str("tp and ep must be at least 1 (tp=", plan.tp, " ep=", plan.ep, ")"));
    return out;
  }
  const int world = plan.world();
  if (world % plan.tp != 0 || world % plan.ep != 0)
    out.push_back(str("tp=", plan.tp, " and ep=", plan.ep,
                      ": the smaller must divide the larger (GPUs = max(tp, ep))"));
  if (cfg.num_attention_heads % plan.tp != 0)
    out.push_back(not_dividing("tp", plan.tp, cfg.num_attention_heads, "attention heads"));
  if (cfg.attention == AttentionKind::GQA && cfg.num_key_value_heads > 0 &&
      cfg.num_key_value_heads % plan.tp != 0 && plan.tp % cfg.num_key_value_heads != 0)
    out.push_back(str("tp=", plan.tp, " neither divides nor is a multiple of ",
                      cfg.num_key_value_heads, " KV heads"));
  if (cfg.num_dense_layers() > 0 && cfg.intermediate_size % plan.tp != 0)
    out.push_back(not_dividing("tp", plan.tp, cfg.intermediate_size, "dense MLP intermediate"));
  const int64_t shared_width = cfg.moe_intermediate_size * cfg.n_shared_experts;
  if (shared_width > 0 && shared_width % plan.tp != 0)
    out.push_back(not_dividing("tp", plan.tp, shared_width, "shared-expert intermediate"));
  if (cfg.n_routed_experts > 0 && cfg.n_routed_experts % plan.ep != 0)
    out.push_back(not_dividing("ep", plan.ep, cfg.n_routed_experts, "routed experts"));
  const int moe_tp = plan.moe_tp();
  if (moe_tp > 1 && cfg.moe_intermediate_size % moe_tp != 0)
    out.push_back(str("GPUs per expert group (max(tp, ep) / ep = ", moe_tp, ") does not divide ",
                      cfg.moe_intermediate_size, " moe intermediate"));
  return out;
}

MoeWorkload describe_workload(const ModelConfig& cfg, const QuantConfig& quant, ParallelPlan plan,
                              std::string model_label) {
  MoeWorkload w;
  w.model_label = std::move(model_label);
  w.arch = std::string(arch_hf_name(cfg.arch));
  w.hidden = cfg.hidden_size;
  w.moe_intermediate = cfg.moe_intermediate_size;
  w.experts = cfg.n_routed_experts;
  w.top_k = cfg.num_experts_per_tok;
  w.plan = plan;
  w.model_problems = parallel_problems(cfg, plan);
  const int moe_tp = plan.tp >= 1 && plan.ep >= 1 ? plan.moe_tp() : 1;
  w.moe_intermediate_per_gpu = cfg.moe_intermediate_size / (moe_tp > 0 ? moe_tp : 1);

  // The experts' format, from the names the checkpoint would use (MIXED_PRECISION and exclude
  // patterns may treat layers differently). One backend runs every MoE layer.
  std::set<QuantAlgo> algos;
  for (int64_t layer = 0; layer < cfg.num_layers; ++layer) {
    if (!cfg.layer_is_moe[size_t(layer)]) continue;
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
      algos.insert(quant.algo_for(str("model.layers.", layer, ".mlp.experts.0.", proj)));
  }
  if (algos.empty()) algos.insert(quant.algo);
  w.expert_algo = *algos.begin();
  if (algos.size() > 1) {
    std::string list;
    for (QuantAlgo a : algos) list += (list.empty() ? "" : ", ") + quant_algo_label(a);
    w.model_problems.push_back(
        str("routed experts use more than one format (", list, "); one MoE backend runs them all"));
  }
  w.expert_weights = weight_format_of(w.expert_algo);
  w.has_input_scale = w.expert_algo == QuantAlgo::NVFP4;

  // FP8 layers: the loader refuses them, so the model cannot be sized or run.
  std::string fp8_module;
  int64_t fp8_count = 0;
  for (const LinearSpec& l : model_layout(cfg).linears) {
    if (linear_algo(l, quant) != QuantAlgo::FP8) continue;
    if (fp8_count++ == 0) fp8_module = l.module;
  }
  if (fp8_count > 0) {
    w.model_problems.push_back(str("checkpoint has ", fp8_count, " FP8 linear layers (e.g. ",
                                   fp8_module, "); Tetra loads NVFP4, W4A16_NVFP4 or unquantized"));
    return w;
  }
  w.memory_known = true;
  if (plan.tp >= 1 && plan.ep >= 1) w.memory_per_gpu = memory_need(cfg, quant, plan);
  w.memory_one_process = memory_need(cfg, quant, ParallelPlan{1, 1});
  return w;
}

}  // namespace tetra
