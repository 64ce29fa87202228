// Presets: the real models' numbers (checked against the fixture config files and the
// publishers' parameter counts), tiny versions that keep every feature, with_num_layers.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <fstream>
#include <set>
#include <string>

#include "core/error.h"
#include "format/model_layout.h"
#include "format/model_size.h"
#include "format/presets.h"

using namespace tetra;

namespace {

ModelConfig parse_fixture(const std::string& name) {
  std::ifstream in(std::string(TETRA_TEST_DATA_DIR) + "/configs/" + name);
  EXPECT_TRUE(in.good()) << name;
  return parse_model_config(nlohmann::json::parse(in), name);
}

QuantConfig nvfp4_modelopt_style() {
  QuantConfig q;
  q.algo = QuantAlgo::NVFP4;
  q.exclude = {"lm_head", "*.mlp.gate"};
  return q;
}

// |got / want - 1| <= tol
void expect_near_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::fabs(got / want - 1.0), tol) << what << ": " << got / 1e9 << "B vs " << want / 1e9 << "B";
}

}  // namespace

TEST(Presets, Names) {
  EXPECT_EQ(preset_names(),
            (std::vector<std::string>{"glm5", "glm4.5-air", "glm4.7", "deepseek-v3", "qwen3-30b-a3b",
                                      "tiny-glm5", "tiny-glm4.5-air", "tiny-glm4.7",
                                      "tiny-deepseek-v3", "tiny-qwen3-30b-a3b"}));
}

TEST(Presets, UnknownNameListsThePresets) {
  try {
    preset_config("glm6");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("glm6"), std::string::npos) << msg;
    for (const auto& n : preset_names()) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

// Hugging Face's spellings find the presets; every preset stays reachable by its own name and no
// two collide once case, hyphens and underscores are set aside.
TEST(Presets, NamesAsUsersWriteThem) {
  EXPECT_EQ(preset_config("GLM-4.5-Air").num_layers, preset_config("glm4.5-air").num_layers);
  EXPECT_EQ(preset_config("Qwen3-30B-A3B").n_routed_experts, preset_config("qwen3-30b-a3b").n_routed_experts);
  EXPECT_EQ(preset_config("DeepSeek-V3").hidden_size, preset_config("deepseek-v3").hidden_size);
  EXPECT_EQ(preset_config("GLM-5").num_layers, preset_config("glm5").num_layers);
  EXPECT_NE(preset_config("tiny_GLM5").num_layers, preset_config("glm5").num_layers);
  EXPECT_THROW(preset_config("glm-4.5"), Error);
  std::set<std::string> keys;
  for (const auto& n : preset_names()) {
    std::string k;
    for (char c : n)
      if (c != '-' && c != '_') k += char(std::tolower(static_cast<unsigned char>(c)));
    EXPECT_TRUE(keys.insert(k).second) << n;
  }
}

TEST(Presets, RealPresetsMatchTheRealConfigFiles) {
  EXPECT_EQ(preset_config("glm5"), parse_fixture("glm5.json"));
  EXPECT_EQ(preset_config("glm4.5-air"), parse_fixture("glm4.5-air.json"));
  EXPECT_EQ(preset_config("glm4.7"), parse_fixture("glm4.7.json"));
  EXPECT_EQ(preset_config("deepseek-v3"), parse_fixture("deepseek-v3.json"));
  EXPECT_EQ(preset_config("qwen3-30b-a3b"), parse_fixture("qwen3-30b-a3b.json"));
}

// Published sizes. Totals exclude the MTP layer. Publishers count "active" differently, so
// each comparison states the convention: Zhipu leaves embeddings and lm_head out (GLM-5:
// 40B, GLM-4.5-Air: 12B, GLM-4.7: 32B); DeepSeek counts them as we do (37B); Qwen counts the
// whole embedding table (3.3B).
TEST(Presets, SizesMatchPublishedParameterCounts) {
  struct Case {
    std::string preset;
    double total, active;
    enum { Zhipu, DeepSeek, Qwen } convention;
  };
  for (const Case& k : {Case{"glm5", 744e9, 40e9, Case::Zhipu},
                        Case{"glm4.5-air", 106e9, 12e9, Case::Zhipu},
                        Case{"glm4.7", 355e9, 32e9, Case::Zhipu},
                        Case{"deepseek-v3", 671e9, 37e9, Case::DeepSeek},
                        Case{"qwen3-30b-a3b", 30.5e9, 3.3e9, Case::Qwen}}) {
    const ModelConfig c = preset_config(k.preset);
    const ModelSize s = model_size(c, QuantConfig{});
    expect_near_rel(static_cast<double>(s.total_all.params), k.total, 0.02, k.preset + " total");
    double active = static_cast<double>(s.active_all.params);
    const double embed_row = static_cast<double>(s.active.at(ModuleKind::Embedding).params);
    const double embed_all = static_cast<double>(s.total.at(ModuleKind::Embedding).params);
    if (k.convention == Case::Zhipu)
      active -= embed_row + static_cast<double>(s.active.at(ModuleKind::LmHead).params);
    if (k.convention == Case::Qwen) active += embed_all - embed_row;
    expect_near_rel(active, k.active, 0.03, k.preset + " active");
  }
}

TEST(Presets, Nvfp4CheckpointSizesMatchModelsMd) {
  // MODELS.md: GLM-5 NVFP4 (experts + most linears) ~420 GB; GLM-4.5-Air NVFP4 ~60 GB.
  expect_near_rel(model_size(preset_config("glm5"), nvfp4_modelopt_style()).total_all.bytes,
                  420e9, 0.05, "glm5 nvfp4 bytes");
  expect_near_rel(model_size(preset_config("glm4.5-air"), nvfp4_modelopt_style()).total_all.bytes,
                  60e9, 0.05, "glm4.5-air nvfp4 bytes");
  // Quantized experts cost 0.5625 bytes per weight plus 8 bytes of scalars per linear.
  const ModelSize s = model_size(preset_config("deepseek-v3"), nvfp4_modelopt_style());
  const auto& e = s.total.at(ModuleKind::RoutedExpert);
  const double linears = 58.0 * 256 * 3;
  EXPECT_DOUBLE_EQ(e.bytes, 0.5625 * static_cast<double>(e.params) + 8 * linears);
}

TEST(Presets, TinyPresetsKeepTheFeatures) {
  for (const std::string real : {"glm5", "glm4.5-air", "glm4.7", "deepseek-v3", "qwen3-30b-a3b"}) {
    SCOPED_TRACE(real);
    const ModelConfig r = preset_config(real);
    const ModelConfig t = preset_config("tiny-" + real);
    EXPECT_EQ(t.arch, r.arch);
    EXPECT_EQ(t.model_type, r.model_type);
    EXPECT_EQ(t.attention, r.attention);
    EXPECT_EQ(t.attention_bias, r.attention_bias);
    EXPECT_EQ(t.use_qk_norm, r.use_qk_norm);
    EXPECT_EQ(t.tie_word_embeddings, r.tie_word_embeddings);
    EXPECT_EQ(t.rope.type, r.rope.type);
    EXPECT_EQ(t.rope.partial_rotary_factor, r.rope.partial_rotary_factor);
    EXPECT_EQ(t.rope.interleave, r.rope.interleave);
    EXPECT_EQ(t.indexer_rope_interleave, r.indexer_rope_interleave);
    EXPECT_EQ(t.routing.scoring, r.routing.scoring);
    EXPECT_EQ(t.routing.topk_method, r.routing.topk_method);
    EXPECT_EQ(t.routing.has_correction_bias, r.routing.has_correction_bias);
    EXPECT_EQ(t.routing.norm_topk_prob, r.routing.norm_topk_prob);
    EXPECT_EQ(t.routing.routed_scaling_factor, r.routing.routed_scaling_factor);
    EXPECT_EQ(t.routing.n_group > 1, r.routing.n_group > 1);
    EXPECT_EQ(t.n_shared_experts > 0, r.n_shared_experts > 0);
    EXPECT_EQ(t.q_lora_rank > 0, r.q_lora_rank > 0);
    EXPECT_EQ(t.index_n_heads > 0, r.index_n_heads > 0);
    EXPECT_EQ(t.num_key_value_heads < t.num_attention_heads,
              r.num_key_value_heads < r.num_attention_heads);
    EXPECT_EQ(t.num_attention_heads * t.head_dim == t.hidden_size,
              r.num_attention_heads * r.head_dim == r.hidden_size);
    // Dense first layer exactly when the real model has dense layers; MoE after it.
    EXPECT_EQ(t.layer_is_moe[0], r.layer_is_moe[0]);
    EXPECT_TRUE(t.layer_is_moe.back());
    EXPECT_GE(t.num_layers, 2);
    EXPECT_LE(t.num_layers, 3);
    EXPECT_GE(t.n_routed_experts, 8);
    EXPECT_LE(t.n_routed_experts, 16);
    EXPECT_GE(t.num_experts_per_tok, 2);
    EXPECT_LE(t.num_experts_per_tok, 4);
    for (int64_t d : {t.hidden_size, t.intermediate_size, t.moe_intermediate_size, t.vocab_size,
                      t.head_dim})
      EXPECT_EQ(d % 16, 0) << d;
    if (t.attention == AttentionKind::MLA) {
      for (int64_t d : {t.q_lora_rank, t.kv_lora_rank, t.qk_nope_head_dim, t.qk_rope_head_dim,
                        t.v_head_dim})
        EXPECT_EQ(d % 16, 0) << d;
    }
    if (t.index_n_heads > 0) {
      EXPECT_EQ(t.index_head_dim % 16, 0);
      EXPECT_GT(t.index_head_dim, t.qk_rope_head_dim);
    }
    for (const auto& l : model_layout(t).linears) {
      if (!l.quantizable) continue;
      EXPECT_EQ(l.in_features % 16, 0) << l.module;
      EXPECT_EQ(l.out_features % 16, 0) << l.module;
    }
    // Small enough for a test checkpoint, in BF16 and in NVFP4.
    EXPECT_LT(model_size(t, QuantConfig{}).total_all.bytes, 2e6);
    EXPECT_LT(model_size(t, nvfp4_modelopt_style()).total_all.bytes, 2e6);
  }
  const ModelConfig ds = preset_config("tiny-deepseek-v3");
  EXPECT_EQ(ds.routing.n_group, 4);
  EXPECT_EQ(ds.routing.topk_group, 2);
}

TEST(Presets, WithNumLayersKeepsTheDenseFirstPattern) {
  const ModelConfig glm5 = preset_config("glm5");  // 3 dense + 75 MoE
  const ModelConfig five = with_num_layers(glm5, 5);
  EXPECT_EQ(five.num_layers, 5);
  EXPECT_EQ(five.layer_is_moe, (std::vector<bool>{false, false, false, true, true}));
  EXPECT_EQ(with_num_layers(glm5, 2).layer_is_moe, (std::vector<bool>{false, false}));
  // Everything else is unchanged, and the result is a valid config.
  ModelConfig back = five;
  back.num_layers = glm5.num_layers;
  back.layer_is_moe = glm5.layer_is_moe;
  EXPECT_EQ(back, glm5);
  EXPECT_EQ(parse_model_config(model_config_to_json(five), "x"), five);
  // Growing copies the last layer.
  const ModelConfig grown = with_num_layers(preset_config("tiny-glm5"), 5);
  EXPECT_EQ(grown.layer_is_moe, (std::vector<bool>{false, true, true, true, true}));
  EXPECT_EQ(model_layout(grown).linears.back().module, "lm_head");
  // The index-share schedule is cut or extended with it.
  ModelConfig shared = preset_config("tiny-glm5");
  shared.indexer_types = {"full", "full", "shared"};
  EXPECT_EQ(with_num_layers(shared, 2).indexer_types, (std::vector<std::string>{"full", "full"}));
  EXPECT_EQ(with_num_layers(shared, 4).indexer_types,
            (std::vector<std::string>{"full", "full", "shared", "shared"}));
  EXPECT_THROW(with_num_layers(glm5, 0), Error);
}
