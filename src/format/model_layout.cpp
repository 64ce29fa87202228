#include "format/model_layout.h"

#include "core/error.h"

namespace tetra {
namespace {

// Builds the layout of one model, layer by layer, in checkpoint order.
class LayoutBuilder {
 public:
  explicit LayoutBuilder(const ModelConfig& c) : c_(c) {}

  ModelLayout build() {
    tensor("model.embed_tokens.weight", DType::BF16, {c_.vocab_size, c_.hidden_size},
           ModuleKind::Embedding, -1);
    for (int L = 0; L < static_cast<int>(c_.num_layers); ++L) {
      const std::string p = "model.layers." + std::to_string(L) + ".";
      norm(p + "input_layernorm.weight", c_.hidden_size, L);
      if (c_.attention == AttentionKind::MLA) mla(p + "self_attn.", L);
      else gqa(p + "self_attn.", L);
      norm(p + "post_attention_layernorm.weight", c_.hidden_size, L);
      if (c_.layer_is_moe[static_cast<size_t>(L)]) moe(p + "mlp.", L);
      else mlp(p + "mlp.", c_.intermediate_size, ModuleKind::DenseMlp, L, -1);
    }
    norm("model.norm.weight", c_.hidden_size, -1);
    if (!c_.tie_word_embeddings)
      linear("lm_head", ModuleKind::LmHead, -1, -1, c_.vocab_size, c_.hidden_size, false, "",
             false);
    return std::move(out_);
  }

 private:
  void tensor(std::string name, DType dt, std::vector<int64_t> shape, ModuleKind kind, int layer,
              int expert = -1) {
    out_.others.push_back({std::move(name), dt, std::move(shape), kind, layer, expert});
  }
  void norm(const std::string& name, int64_t dim, int layer) {
    tensor(name, DType::BF16, {dim}, ModuleKind::Norm, layer);
  }
  void linear(const std::string& module, ModuleKind kind, int layer, int expert, int64_t out,
              int64_t in, bool bias, const std::string& group, bool quantizable) {
    out_.linears.push_back({module, kind, layer, expert, out, in, bias, group, quantizable});
    if (bias) tensor(module + ".bias", DType::BF16, {out}, kind, layer, expert);
  }

  void gqa(const std::string& p, int L) {
    const int64_t q_out = c_.num_attention_heads * c_.head_dim;
    const int64_t kv_out = c_.num_key_value_heads * c_.head_dim;
    const std::string qkv = p + "qkv_proj";
    const bool b = c_.attention_bias;
    linear(p + "q_proj", ModuleKind::Attention, L, -1, q_out, c_.hidden_size, b, qkv, true);
    linear(p + "k_proj", ModuleKind::Attention, L, -1, kv_out, c_.hidden_size, b, qkv, true);
    linear(p + "v_proj", ModuleKind::Attention, L, -1, kv_out, c_.hidden_size, b, qkv, true);
    // GLM-4.x never biases o_proj; Qwen3-MoE ties it to attention_bias like q/k/v.
    const bool o_bias = c_.arch == Arch::Qwen3Moe && b;
    linear(p + "o_proj", ModuleKind::Attention, L, -1, c_.hidden_size, q_out, o_bias, "", true);
    if (c_.use_qk_norm) {
      norm(p + "q_norm.weight", c_.head_dim, L);
      norm(p + "k_norm.weight", c_.head_dim, L);
    }
  }

  void mla(const std::string& p, int L) {
    const int64_t h = c_.num_attention_heads;
    const int64_t qk_head = c_.qk_nope_head_dim + c_.qk_rope_head_dim;
    const bool b = c_.attention_bias;  // on q_a, kv_a and o only (as transformers builds it)
    const bool indexer = c_.layer_has_indexer(L);
    // Linears reading the normed hidden state share one s2; with an indexer, q_b_proj and
    // indexer.wq_b both read the normed q latent and share another.
    const std::string from_hidden = p + "hidden_in_proj";
    const std::string from_q_latent = indexer ? p + "q_latent_in_proj" : "";
    if (c_.q_lora_rank > 0) {
      linear(p + "q_a_proj", ModuleKind::Attention, L, -1, c_.q_lora_rank, c_.hidden_size, b,
             from_hidden, true);
      norm(p + "q_a_layernorm.weight", c_.q_lora_rank, L);
      linear(p + "q_b_proj", ModuleKind::Attention, L, -1, h * qk_head, c_.q_lora_rank, false,
             from_q_latent, true);
    } else {
      linear(p + "q_proj", ModuleKind::Attention, L, -1, h * qk_head, c_.hidden_size, false,
             from_hidden, true);
    }
    linear(p + "kv_a_proj_with_mqa", ModuleKind::Attention, L, -1,
           c_.kv_lora_rank + c_.qk_rope_head_dim, c_.hidden_size, b, from_hidden, true);
    norm(p + "kv_a_layernorm.weight", c_.kv_lora_rank, L);
    linear(p + "kv_b_proj", ModuleKind::Attention, L, -1,
           h * (c_.qk_nope_head_dim + c_.v_head_dim), c_.kv_lora_rank, false, "", true);
    linear(p + "o_proj", ModuleKind::Attention, L, -1, c_.hidden_size, h * c_.v_head_dim, b, "",
           true);
    if (indexer) {
      const std::string ip = p + "indexer.";
      linear(ip + "wq_b", ModuleKind::Indexer, L, -1, c_.index_n_heads * c_.index_head_dim,
             c_.q_lora_rank, false, from_q_latent, true);
      linear(ip + "wk", ModuleKind::Indexer, L, -1, c_.index_head_dim, c_.hidden_size, false,
             from_hidden, true);
      // LayerNorm (not RMSNorm): weight and bias.
      tensor(ip + "k_norm.weight", DType::BF16, {c_.index_head_dim}, ModuleKind::Indexer, L);
      tensor(ip + "k_norm.bias", DType::BF16, {c_.index_head_dim}, ModuleKind::Indexer, L);
      linear(ip + "weights_proj", ModuleKind::Indexer, L, -1, c_.index_n_heads, c_.hidden_size,
             false, "", false);
    }
  }

  void mlp(const std::string& p, int64_t width, ModuleKind kind, int L, int expert) {
    const std::string gate_up = p + "gate_up_proj";
    linear(p + "gate_proj", kind, L, expert, width, c_.hidden_size, false, gate_up, true);
    linear(p + "up_proj", kind, L, expert, width, c_.hidden_size, false, gate_up, true);
    linear(p + "down_proj", kind, L, expert, c_.hidden_size, width, false, "", true);
  }

  void moe(const std::string& p, int L) {
    linear(p + "gate", ModuleKind::Router, L, -1, c_.n_routed_experts, c_.hidden_size, false, "",
           false);
    if (c_.routing.has_correction_bias)  // float32 in the reference and in real checkpoints
      tensor(p + "gate.e_score_correction_bias", DType::F32, {c_.n_routed_experts},
             ModuleKind::Router, L);
    for (int e = 0; e < static_cast<int>(c_.n_routed_experts); ++e)
      mlp(p + "experts." + std::to_string(e) + ".", c_.moe_intermediate_size,
          ModuleKind::RoutedExpert, L, e);
    if (c_.n_shared_experts > 0)
      mlp(p + "shared_experts.", c_.moe_intermediate_size * c_.n_shared_experts,
          ModuleKind::SharedExpert, L, -1);
  }

  const ModelConfig& c_;
  ModelLayout out_;
};

}  // namespace

std::string_view module_kind_name(ModuleKind k) {
  switch (k) {
    case ModuleKind::Embedding: return "embedding";
    case ModuleKind::Attention: return "attention";
    case ModuleKind::Indexer: return "indexer";
    case ModuleKind::DenseMlp: return "dense_mlp";
    case ModuleKind::SharedExpert: return "shared_expert";
    case ModuleKind::RoutedExpert: return "routed_expert";
    case ModuleKind::Router: return "router";
    case ModuleKind::Norm: return "norm";
    case ModuleKind::LmHead: return "lm_head";
  }
  return "?";
}

ModelLayout model_layout(const ModelConfig& c) {
  TETRA_CHECK_EQ(static_cast<int64_t>(c.layer_is_moe.size()), c.num_layers,
                 "layer_is_moe must have one entry per layer");
  return LayoutBuilder(c).build();
}

QuantAlgo linear_algo(const LinearSpec& l, const QuantConfig& quant) {
  return l.quantizable ? quant.algo_for(l.module) : QuantAlgo::None;
}

std::vector<TensorSpec> linear_tensors(const LinearSpec& l, QuantAlgo algo,
                                       DType high_precision) {
  const int64_t n = l.out_features, k = l.in_features;
  auto spec = [&](const char* suffix, DType dt, std::vector<int64_t> shape) {
    return TensorSpec{l.module + suffix, dt, std::move(shape), l.kind, l.layer, l.expert};
  };
  switch (algo) {
    case QuantAlgo::None:
      return {spec(".weight", high_precision, {n, k})};
    case QuantAlgo::FP8:
      TETRA_FAIL(l.module, " is FP8-quantized; Tetra loads NVFP4, W4A16_NVFP4 or unquantized "
                           "weights");
    case QuantAlgo::NVFP4:
    case QuantAlgo::W4A16_NVFP4:
      break;
  }
  if (k % 16 != 0)
    TETRA_FAIL(l.module, " has in_features ", k,
               ", not a multiple of the NVFP4 block (16); it cannot be quantized");
  std::vector<TensorSpec> out = {
      spec(".weight", DType::U8, {n, k / 2}),          // [N, K/2] e2m1 pairs, low nibble = even k
      spec(".weight_scale", DType::F8_E4M3, {n, k / 16}),  // [N, K/16] e4m3 block scales
      spec(".weight_scale_2", DType::F32, {}),         // [] weight global scale
  };
  if (algo == QuantAlgo::NVFP4) out.push_back(spec(".input_scale", DType::F32, {}));
  return out;
}

std::vector<TensorSpec> expected_tensors(const ModelLayout& layout, const QuantConfig& quant,
                                         DType high_precision) {
  std::vector<TensorSpec> out;
  out.reserve(layout.linears.size() * 4 + layout.others.size());
  for (const auto& l : layout.linears)
    for (auto& t : linear_tensors(l, linear_algo(l, quant), high_precision))
      out.push_back(std::move(t));
  for (auto t : layout.others) {
    if (t.dtype == DType::BF16) t.dtype = high_precision;
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace tetra
