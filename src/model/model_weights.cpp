#include "model/model_weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "model/attention_shapes.h"
#include "moe/moe_layer.h"

namespace tetra::model {
namespace {

// A 0-d or [1] F32 tensor's value.
float read_f32_scalar(const TensorView& v, const std::string& where) {
  if (v.dtype != DType::F32 || v.nbytes != 4)
    TETRA_FAIL("tensor ", v.name, " in ", where, " must be one F32 value, got ", dtype_name(v.dtype),
               " with ", v.nbytes, " bytes");
  float f;
  std::memcpy(&f, v.data, 4);
  return f;
}

// Index of the first Inf/NaN element of a BF16/F16/F32 tensor, or -1. Bit tests (exponent all
// ones), parallel over chunks: this reads every high-precision weight once at load.
int64_t first_non_finite(const TensorView& t) {
  const int64_t n = t.numel();
  std::vector<int64_t> found(size_t(hardware_threads()) + 1, -1);
  std::atomic<size_t> slot{0};
  parallel_for(n, 1 << 20, [&](int64_t b, int64_t e) {
    int64_t hit = -1;
    for (int64_t i = b; i < e && hit < 0; ++i) {
      if (t.dtype == DType::F32) {
        uint32_t u;
        std::memcpy(&u, t.data + 4 * i, 4);
        if ((u & 0x7f800000u) == 0x7f800000u) hit = i;
      } else {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        const uint16_t mask = t.dtype == DType::BF16 ? 0x7f80 : 0x7c00;
        if ((h & mask) == mask) hit = i;
      }
    }
    if (hit >= 0) found[std::min(slot++, found.size() - 1)] = hit;
  });
  int64_t first = -1;
  for (int64_t f : found)
    if (f >= 0 && (first < 0 || f < first)) first = f;
  return first;
}

class Loader {
 public:
  explicit Loader(const Checkpoint& ck) : ck_(ck), where_(ck.dir().string()) {}

  TensorView tensor(const std::string& name) const {
    if (!ck_.tensors().contains(name))
      TETRA_FAIL("checkpoint ", where_, " has no tensor ", name);
    const TensorView v = ck_.tensors().view(name);
    check_finite(v);
    return v;
  }
  void check_finite(const TensorView& v) const {
    if (!is_float_dtype(v.dtype)) return;
    const int64_t i = first_non_finite(v);
    if (i >= 0)
      TETRA_FAIL("tensor ", v.name, " in ", ck_.tensors().file_of(v.name).string(),
                 " holds a non-finite value at element ", i);
  }
  std::optional<TensorView> optional_tensor(const std::string& name) const {
    if (!ck_.tensors().contains(name)) return std::nullopt;
    return ck_.tensors().view(name);
  }

  LinearWeight linear(const std::string& module) const {
    const LinearTensors t = ck_.linear(module);
    LinearWeight w;
    w.module = module;
    w.out_features = t.spec->out_features;
    w.in_features = t.spec->in_features;
    w.quantized = t.quantized;
    w.weight = t.weight;
    w.bias = t.bias;
    if (t.bias) check_finite(*t.bias);
    if (t.spec->bias && !t.bias) TETRA_FAIL("checkpoint ", where_, " has no tensor ", module, ".bias");
    if (!t.quantized) {
      if (!is_float_dtype(t.weight.dtype))
        TETRA_FAIL("tensor ", t.weight.name, " in ", where_, " has dtype ", dtype_name(t.weight.dtype),
                   ", expected BF16, F16 or F32 (or U8 with weight_scale for NVFP4)");
      check_finite(t.weight);
      return w;
    }
    ck_.check_scales_finite(t);
    w.weight_scale = t.weight_scale;
    w.weight_scale_2 = read_f32_scalar(*t.weight_scale_2, where_);
    if (!std::isfinite(w.weight_scale_2) || w.weight_scale_2 <= 0.0f)
      TETRA_FAIL("tensor ", t.weight_scale_2->name, " in ", where_, " is ", w.weight_scale_2,
                 "; a global scale must be finite and > 0");
    if (t.input_scale) {
      const float s = read_f32_scalar(*t.input_scale, where_);
      if (!std::isfinite(s) || s <= 0.0f)
        TETRA_FAIL("tensor ", t.input_scale->name, " in ", where_, " is ", s,
                   "; an input scale must be finite and > 0");
      w.input_scale = s;
    }
    return w;
  }

  MlpWeights mlp(const std::string& prefix) const {
    return MlpWeights{linear(prefix + "gate_proj"), linear(prefix + "up_proj"),
                      linear(prefix + "down_proj")};
  }

 private:
  const Checkpoint& ck_;
  std::string where_;
};

}  // namespace

std::vector<std::string> runtime_unsupported_reasons(const ModelConfig& c) {
  std::vector<std::string> why;
  const double attention_factor = rope_attention_factor(c);
  if (std::abs(attention_factor - 1.0) > 1e-9)
    why.push_back(str("YaRN RoPE here scales cos/sin by ", attention_factor,
                      " (mscale / mscale_all_dim); the model runtime implements that factor only "
                      "when it is 1 (as in DeepSeek-V3's config)"));
  if (c.index_n_heads > 0) {
    if (c.q_lora_rank <= 0)
      why.push_back("a DSA indexer without q compression (q_lora_rank 0): its wq_b reads the q latent");
    if (c.num_layers > 0 && !c.layer_has_indexer(0))
      why.push_back("the first layer's indexer is \"shared\": there is no earlier selection to reuse");
  }
  if (c.attention == AttentionKind::GQA &&
      (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0))
    why.push_back(str("num_attention_heads (", c.num_attention_heads,
                      ") must be a multiple of num_key_value_heads (", c.num_key_value_heads, ")"));
  return why;
}

void check_runtime_supports(const ModelConfig& c, const std::string& source_label) {
  const std::vector<std::string> why = runtime_unsupported_reasons(c);
  if (!why.empty()) TETRA_FAIL(source_label, ": ", why.front());
}

ModelWeights ModelWeights::load(const Checkpoint& ck) {
  const ModelConfig& c = ck.config();
  check_runtime_supports(c, ck.dir().string());
  ck.validate();
  const Loader ld(ck);
  ModelWeights w;
  w.config = c;
  w.embedding = ld.tensor("model.embed_tokens.weight");
  w.final_norm = ld.tensor("model.norm.weight");
  if (c.tie_word_embeddings) {
    w.lm_head.module = "model.embed_tokens";
    w.lm_head.out_features = c.vocab_size;
    w.lm_head.in_features = c.hidden_size;
    w.lm_head.weight = w.embedding;
  } else {
    w.lm_head = ld.linear("lm_head");
  }
  for (int L = 0; L < int(c.num_layers); ++L) {
    const std::string p = "model.layers." + std::to_string(L) + ".";
    LayerWeights lw;
    lw.index = L;
    lw.input_norm = ld.tensor(p + "input_layernorm.weight");
    lw.post_attention_norm = ld.tensor(p + "post_attention_layernorm.weight");
    const std::string a = p + "self_attn.";
    if (c.attention == AttentionKind::MLA) {
      MlaWeights m;
      if (c.q_lora_rank > 0) {
        m.q_a = ld.linear(a + "q_a_proj");
        m.q_a_norm = ld.tensor(a + "q_a_layernorm.weight");
        lw.attn.q = ld.linear(a + "q_b_proj");
      } else {
        lw.attn.q = ld.linear(a + "q_proj");
      }
      m.kv_a = ld.linear(a + "kv_a_proj_with_mqa");
      m.kv_a_norm = ld.tensor(a + "kv_a_layernorm.weight");
      m.kv_b = ld.linear(a + "kv_b_proj");
      if (c.layer_has_indexer(L)) {
        const std::string i = a + "indexer.";
        m.indexer = IndexerWeights{ld.linear(i + "wq_b"), ld.linear(i + "wk"),
                                   ld.tensor(i + "k_norm.weight"), ld.tensor(i + "k_norm.bias"),
                                   ld.linear(i + "weights_proj")};
      }
      lw.attn.mla = std::move(m);
    } else {
      lw.attn.q = ld.linear(a + "q_proj");
      lw.attn.k = ld.linear(a + "k_proj");
      lw.attn.v = ld.linear(a + "v_proj");
    }
    lw.attn.o = ld.linear(a + "o_proj");
    if (c.use_qk_norm) {
      lw.attn.q_norm = ld.tensor(a + "q_norm.weight");
      lw.attn.k_norm = ld.tensor(a + "k_norm.weight");
    }
    lw.is_moe = c.layer_is_moe[size_t(L)];
    if (!lw.is_moe) {
      lw.dense = ld.mlp(p + "mlp.");
    } else {
      MoeWeights m;
      m.router = ld.tensor(p + "mlp.gate.weight");
      if (c.routing.has_correction_bias) {
        m.correction_bias = ld.tensor(p + "mlp.gate.e_score_correction_bias");
        if (m.correction_bias->dtype != DType::F32)
          TETRA_FAIL("tensor ", m.correction_bias->name, " in ", ck.dir().string(),
                     " must be F32, got ", dtype_name(m.correction_bias->dtype));
      }
      m.router_params = moe::router_params_of(c);
      m.experts.reserve(size_t(c.n_routed_experts));
      for (int e = 0; e < int(c.n_routed_experts); ++e)
        m.experts.push_back(ld.mlp(p + "mlp.experts." + std::to_string(e) + "."));
      if (c.n_shared_experts > 0) m.shared = ld.mlp(p + "mlp.shared_experts.");
      lw.moe = std::move(m);
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace tetra::model
