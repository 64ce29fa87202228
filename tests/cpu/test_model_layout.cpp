// Model layouts: exact HF tensor names, dtypes and shapes (BF16 and NVFP4), fuse groups,
// per-architecture differences, and the parameter/byte counts built on them.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "core/error.h"
#include "format/model_layout.h"
#include "format/model_size.h"
#include "format/presets.h"

using namespace tetra;

namespace {

struct Entry {
  DType dtype;
  std::vector<int64_t> shape;
};

std::map<std::string, Entry> by_name(const std::vector<TensorSpec>& tensors) {
  std::map<std::string, Entry> m;
  for (const auto& t : tensors) {
    EXPECT_TRUE(m.emplace(t.name, Entry{t.dtype, t.shape}).second) << "duplicate " << t.name;
  }
  return m;
}

void expect_tensor(const std::map<std::string, Entry>& m, const std::string& name, DType dt,
                   std::vector<int64_t> shape) {
  auto it = m.find(name);
  ASSERT_NE(it, m.end()) << "missing " << name;
  EXPECT_EQ(it->second.dtype, dt) << name << " is " << dtype_name(it->second.dtype);
  EXPECT_EQ(it->second.shape, shape) << name;
}

const LinearSpec& find_linear(const ModelLayout& l, const std::string& module) {
  for (const auto& s : l.linears)
    if (s.module == module) return s;
  throw std::runtime_error("no linear " + module);
}

QuantConfig nvfp4(std::vector<std::string> exclude = {"lm_head"}) {
  QuantConfig q;
  q.algo = QuantAlgo::NVFP4;
  q.exclude = std::move(exclude);
  return q;
}

}  // namespace

TEST(ModelLayout, Bf16NamesDtypesShapesGlm47) {
  // tiny-glm4.7: hidden 64, 3 layers (layer 0 dense), 4 heads / 2 KV heads of 64, q/k/v bias,
  // q/k norm, 16 experts of width 64, 1 shared expert, dense width 128, vocab 512.
  const ModelConfig c = preset_config("tiny-glm4.7");
  const auto m = by_name(expected_tensors(model_layout(c), QuantConfig{}));
  const auto bf = DType::BF16;
  expect_tensor(m, "model.embed_tokens.weight", bf, {512, 64});
  expect_tensor(m, "model.norm.weight", bf, {64});
  expect_tensor(m, "lm_head.weight", bf, {512, 64});
  for (int L = 0; L < 3; ++L) {
    const std::string p = "model.layers." + std::to_string(L) + ".";
    expect_tensor(m, p + "input_layernorm.weight", bf, {64});
    expect_tensor(m, p + "post_attention_layernorm.weight", bf, {64});
    expect_tensor(m, p + "self_attn.q_proj.weight", bf, {256, 64});
    expect_tensor(m, p + "self_attn.q_proj.bias", bf, {256});
    expect_tensor(m, p + "self_attn.k_proj.weight", bf, {128, 64});
    expect_tensor(m, p + "self_attn.k_proj.bias", bf, {128});
    expect_tensor(m, p + "self_attn.v_proj.weight", bf, {128, 64});
    expect_tensor(m, p + "self_attn.v_proj.bias", bf, {128});
    expect_tensor(m, p + "self_attn.o_proj.weight", bf, {64, 256});
    EXPECT_FALSE(m.count(p + "self_attn.o_proj.bias"));  // GLM never biases o_proj
    expect_tensor(m, p + "self_attn.q_norm.weight", bf, {64});
    expect_tensor(m, p + "self_attn.k_norm.weight", bf, {64});
  }
  expect_tensor(m, "model.layers.0.mlp.gate_proj.weight", bf, {128, 64});
  expect_tensor(m, "model.layers.0.mlp.up_proj.weight", bf, {128, 64});
  expect_tensor(m, "model.layers.0.mlp.down_proj.weight", bf, {64, 128});
  EXPECT_FALSE(m.count("model.layers.0.mlp.gate.weight"));
  for (int L = 1; L < 3; ++L) {
    const std::string p = "model.layers." + std::to_string(L) + ".mlp.";
    EXPECT_FALSE(m.count(p + "gate_proj.weight"));
    expect_tensor(m, p + "gate.weight", bf, {16, 64});
    expect_tensor(m, p + "gate.e_score_correction_bias", DType::F32, {16});
    for (int e : {0, 7, 15}) {
      const std::string ep = p + "experts." + std::to_string(e) + ".";
      expect_tensor(m, ep + "gate_proj.weight", bf, {64, 64});
      expect_tensor(m, ep + "up_proj.weight", bf, {64, 64});
      expect_tensor(m, ep + "down_proj.weight", bf, {64, 64});
    }
    EXPECT_FALSE(m.count(p + "experts.16.gate_proj.weight"));
    expect_tensor(m, p + "shared_experts.gate_proj.weight", bf, {64, 64});
    expect_tensor(m, p + "shared_experts.up_proj.weight", bf, {64, 64});
    expect_tensor(m, p + "shared_experts.down_proj.weight", bf, {64, 64});
  }
  // 3 global; per layer 2 norms + 4 attention weights + 3 biases + 2 q/k norms = 11;
  // dense MLP 3; MoE router 2 + 16 experts * 3 + shared 3.
  EXPECT_EQ(m.size(), 3u + 3 * 11 + 3 + 2 * (2 + 16 * 3 + 3));
}

TEST(ModelLayout, Nvfp4MlaShapes) {
  // tiny-deepseek-v3: 4 heads, q_lora 32, kv_lora 32, nope 32, rope 16, v 32.
  const ModelConfig c = preset_config("tiny-deepseek-v3");
  const auto m = by_name(expected_tensors(model_layout(c), nvfp4()));
  const auto u8 = DType::U8, f8 = DType::F8_E4M3, f32 = DType::F32, bf = DType::BF16;
  const std::string a = "model.layers.1.self_attn.";
  auto expect_fp4 = [&](const std::string& module, int64_t n, int64_t k) {
    expect_tensor(m, module + ".weight", u8, {n, k / 2});
    expect_tensor(m, module + ".weight_scale", f8, {n, k / 16});
    expect_tensor(m, module + ".weight_scale_2", f32, {});
    expect_tensor(m, module + ".input_scale", f32, {});
  };
  expect_fp4(a + "q_a_proj", 32, 64);
  expect_fp4(a + "q_b_proj", 4 * (32 + 16), 32);
  expect_fp4(a + "kv_a_proj_with_mqa", 32 + 16, 64);
  expect_fp4(a + "kv_b_proj", 4 * (32 + 32), 32);
  expect_fp4(a + "o_proj", 64, 4 * 32);
  expect_tensor(m, a + "q_a_layernorm.weight", bf, {32});
  expect_tensor(m, a + "kv_a_layernorm.weight", bf, {32});
  EXPECT_FALSE(m.count(a + "q_proj.weight"));
  EXPECT_FALSE(m.count(a + "indexer.wk.weight"));  // DeepSeek-V3 has no DSA indexer
  expect_fp4("model.layers.0.mlp.gate_proj", 128, 64);
  expect_fp4("model.layers.1.mlp.experts.3.gate_proj", 64, 64);
  expect_fp4("model.layers.1.mlp.experts.3.down_proj", 64, 64);
  expect_fp4("model.layers.2.mlp.shared_experts.up_proj", 64, 64);
  // Never quantized: router, its bias, embeddings, lm_head (excluded), norms.
  expect_tensor(m, "model.layers.1.mlp.gate.weight", bf, {16, 64});
  expect_tensor(m, "model.layers.1.mlp.gate.e_score_correction_bias", f32, {16});
  EXPECT_FALSE(m.count("model.layers.1.mlp.gate.weight_scale"));
  expect_tensor(m, "lm_head.weight", bf, {512, 64});
  expect_tensor(m, "model.embed_tokens.weight", bf, {512, 64});
}

TEST(ModelLayout, WeightOnlyHasNoInputScales) {
  QuantConfig q;
  q.algo = QuantAlgo::W4A16_NVFP4;
  for (const auto& t : expected_tensors(model_layout(preset_config("tiny-qwen3-30b-a3b")), q)) {
    EXPECT_EQ(t.name.find("input_scale"), std::string::npos) << t.name;
  }
  const auto m = by_name(expected_tensors(model_layout(preset_config("tiny-qwen3-30b-a3b")), q));
  expect_tensor(m, "model.layers.0.mlp.experts.0.up_proj.weight_scale_2", DType::F32, {});
  expect_tensor(m, "model.layers.0.self_attn.q_proj.weight", DType::U8, {256, 32});
  // lm_head is never quantized, even when nothing excludes it.
  expect_tensor(m, "lm_head.weight", DType::BF16, {512, 64});
}

TEST(ModelLayout, ExcludedModulesStayHighPrecision) {
  const ModelConfig c = preset_config("tiny-glm4.5-air");
  const auto m = by_name(expected_tensors(model_layout(c),
                                          nvfp4({"lm_head", "model.layers.1.self_attn*"}),
                                          DType::F16));
  expect_tensor(m, "model.layers.1.self_attn.q_proj.weight", DType::F16, {256, 64});
  expect_tensor(m, "model.layers.1.self_attn.q_proj.bias", DType::F16, {256});
  expect_tensor(m, "model.layers.2.self_attn.q_proj.weight", DType::U8, {256, 32});
  expect_tensor(m, "model.layers.2.self_attn.q_proj.bias", DType::F16, {256});  // biases stay
  expect_tensor(m, "model.layers.1.mlp.gate.e_score_correction_bias", DType::F32, {16});
  expect_tensor(m, "model.norm.weight", DType::F16, {64});
}

TEST(ModelLayout, RealGlm5ExpertShapesAndNoMtpLayer) {
  // MODELS.md: GLM-5 NVFP4 expert gate.weight uint8 [2048, 3072], gate.weight_scale [2048, 384].
  const ModelConfig c = preset_config("glm5");
  const auto tensors = expected_tensors(model_layout(c), nvfp4({"lm_head", "*.mlp.gate"}));
  const auto m = by_name(tensors);
  expect_tensor(m, "model.layers.3.mlp.experts.255.gate_proj.weight", DType::U8, {2048, 3072});
  expect_tensor(m, "model.layers.3.mlp.experts.255.gate_proj.weight_scale", DType::F8_E4M3,
                {2048, 384});
  expect_tensor(m, "model.layers.77.self_attn.indexer.wq_b.weight", DType::U8, {32 * 128, 1024});
  expect_tensor(m, "model.layers.77.self_attn.indexer.weights_proj.weight", DType::BF16, {32, 6144});
  expect_tensor(m, "model.layers.77.self_attn.indexer.k_norm.bias", DType::BF16, {128});
  for (const auto& t : tensors)
    ASSERT_NE(t.name.rfind("model.layers.78.", 0), 0u) << "MTP tensor listed: " << t.name;
}

TEST(ModelLayout, IndexerOnlyOnLayersThatRunIt) {
  ModelConfig c = preset_config("tiny-glm5");
  c.indexer_types = {"full", "shared", "full"};
  const auto m = by_name(expected_tensors(model_layout(c), QuantConfig{}));
  for (const char* leaf : {"wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias",
                           "weights_proj.weight"}) {
    EXPECT_TRUE(m.count(std::string("model.layers.0.self_attn.indexer.") + leaf)) << leaf;
    EXPECT_FALSE(m.count(std::string("model.layers.1.self_attn.indexer.") + leaf)) << leaf;
    EXPECT_TRUE(m.count(std::string("model.layers.2.self_attn.indexer.") + leaf)) << leaf;
  }
  expect_tensor(m, "model.layers.0.self_attn.indexer.wq_b.weight", DType::BF16, {4 * 32, 32});
  expect_tensor(m, "model.layers.0.self_attn.indexer.wk.weight", DType::BF16, {32, 64});
  expect_tensor(m, "model.layers.0.self_attn.indexer.weights_proj.weight", DType::BF16, {4, 64});
}

TEST(ModelLayout, QwenDifferences) {
  const auto m = by_name(expected_tensors(model_layout(preset_config("tiny-qwen3-30b-a3b")),
                                          QuantConfig{}));
  expect_tensor(m, "model.layers.0.self_attn.q_norm.weight", DType::BF16, {64});
  expect_tensor(m, "model.layers.0.mlp.gate.weight", DType::BF16, {16, 64});  // all layers MoE
  EXPECT_FALSE(m.count("model.layers.0.mlp.gate.e_score_correction_bias"));
  EXPECT_FALSE(m.count("model.layers.0.mlp.shared_experts.gate_proj.weight"));
  EXPECT_FALSE(m.count("model.layers.0.self_attn.q_proj.bias"));
  EXPECT_FALSE(m.count("model.layers.0.self_attn.o_proj.bias"));
}

TEST(ModelLayout, TiedEmbeddingsHaveNoLmHead) {
  ModelConfig c = preset_config("tiny-qwen3-30b-a3b");
  c.tie_word_embeddings = true;
  const auto m = by_name(expected_tensors(model_layout(c), QuantConfig{}));
  EXPECT_FALSE(m.count("lm_head.weight"));
  EXPECT_TRUE(m.count("model.embed_tokens.weight"));
}

TEST(ModelLayout, FuseGroups) {
  const ModelLayout glm5 = model_layout(preset_config("tiny-glm5"));
  const std::string a = "model.layers.1.self_attn.";
  const auto& q_a = find_linear(glm5, a + "q_a_proj");
  const auto& kv_a = find_linear(glm5, a + "kv_a_proj_with_mqa");
  const auto& wk = find_linear(glm5, a + "indexer.wk");
  const auto& q_b = find_linear(glm5, a + "q_b_proj");
  const auto& wq_b = find_linear(glm5, a + "indexer.wq_b");
  EXPECT_FALSE(q_a.fuse_group.empty());
  EXPECT_EQ(q_a.fuse_group, kv_a.fuse_group);  // both read the normed hidden state
  EXPECT_EQ(q_a.fuse_group, wk.fuse_group);
  EXPECT_FALSE(q_b.fuse_group.empty());
  EXPECT_EQ(q_b.fuse_group, wq_b.fuse_group);  // both read the normed q latent
  EXPECT_NE(q_b.fuse_group, q_a.fuse_group);
  EXPECT_EQ(find_linear(glm5, a + "kv_b_proj").fuse_group, "");
  EXPECT_EQ(find_linear(glm5, a + "o_proj").fuse_group, "");
  EXPECT_NE(q_a.fuse_group, find_linear(glm5, "model.layers.2.self_attn.q_a_proj").fuse_group);
  const auto& g0 = find_linear(glm5, "model.layers.1.mlp.experts.0.gate_proj");
  EXPECT_FALSE(g0.fuse_group.empty());
  EXPECT_EQ(g0.fuse_group, find_linear(glm5, "model.layers.1.mlp.experts.0.up_proj").fuse_group);
  EXPECT_NE(g0.fuse_group, find_linear(glm5, "model.layers.1.mlp.experts.1.gate_proj").fuse_group);
  EXPECT_EQ(find_linear(glm5, "model.layers.1.mlp.experts.0.down_proj").fuse_group, "");
  const auto& sg = find_linear(glm5, "model.layers.1.mlp.shared_experts.gate_proj");
  EXPECT_EQ(sg.fuse_group, find_linear(glm5, "model.layers.1.mlp.shared_experts.up_proj").fuse_group);
  EXPECT_NE(sg.fuse_group, g0.fuse_group);
  const auto& dg = find_linear(glm5, "model.layers.0.mlp.gate_proj");
  EXPECT_EQ(dg.fuse_group, find_linear(glm5, "model.layers.0.mlp.up_proj").fuse_group);

  const ModelLayout glm47 = model_layout(preset_config("tiny-glm4.7"));
  const std::string g = "model.layers.2.self_attn.";
  const auto& q = find_linear(glm47, g + "q_proj");
  EXPECT_FALSE(q.fuse_group.empty());
  EXPECT_EQ(q.fuse_group, find_linear(glm47, g + "k_proj").fuse_group);
  EXPECT_EQ(q.fuse_group, find_linear(glm47, g + "v_proj").fuse_group);
  EXPECT_EQ(find_linear(glm47, g + "o_proj").fuse_group, "");

  // DeepSeek-V3 has no indexer: q_b_proj is alone. Without q compression, q_proj joins kv_a.
  const ModelLayout ds = model_layout(preset_config("tiny-deepseek-v3"));
  EXPECT_EQ(find_linear(ds, a + "q_b_proj").fuse_group, "");
  ModelConfig plain = preset_config("tiny-deepseek-v3");
  plain.q_lora_rank = 0;
  const ModelLayout pl = model_layout(plain);
  EXPECT_EQ(find_linear(pl, a + "q_proj").fuse_group,
            find_linear(pl, a + "kv_a_proj_with_mqa").fuse_group);
}

TEST(ModelLayout, QuantizableAndKinds) {
  const ModelLayout l = model_layout(preset_config("tiny-glm5"));
  const std::string a = "model.layers.1.self_attn.";
  EXPECT_FALSE(find_linear(l, "model.layers.1.mlp.gate").quantizable);
  EXPECT_EQ(find_linear(l, "model.layers.1.mlp.gate").kind, ModuleKind::Router);
  EXPECT_FALSE(find_linear(l, "lm_head").quantizable);
  EXPECT_EQ(find_linear(l, "lm_head").kind, ModuleKind::LmHead);
  EXPECT_FALSE(find_linear(l, a + "indexer.weights_proj").quantizable);
  EXPECT_TRUE(find_linear(l, a + "indexer.wq_b").quantizable);
  EXPECT_EQ(find_linear(l, a + "indexer.wq_b").kind, ModuleKind::Indexer);
  EXPECT_TRUE(find_linear(l, a + "kv_b_proj").quantizable);
  const auto& e = find_linear(l, "model.layers.2.mlp.experts.9.down_proj");
  EXPECT_EQ(e.kind, ModuleKind::RoutedExpert);
  EXPECT_EQ(e.layer, 2);
  EXPECT_EQ(e.expert, 9);
  EXPECT_EQ(e.out_features, 64);
  EXPECT_EQ(e.in_features, 64);
  EXPECT_EQ(find_linear(l, "model.layers.2.mlp.shared_experts.down_proj").expert, -1);
  EXPECT_EQ(find_linear(l, "model.layers.0.mlp.down_proj").kind, ModuleKind::DenseMlp);
  EXPECT_EQ(module_kind_name(ModuleKind::RoutedExpert), "routed_expert");
}

TEST(ModelLayout, UnquantizableShapesAndFp8AreRefused) {
  ModelConfig c = preset_config("tiny-glm4.5-air");
  c.moe_intermediate_size = 24;  // down_proj in_features 24: not a multiple of 16
  EXPECT_NO_THROW(expected_tensors(model_layout(c), QuantConfig{}));
  try {
    expected_tensors(model_layout(c), nvfp4());
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("down_proj"), std::string::npos) << msg;
    EXPECT_NE(msg.find("24"), std::string::npos) << msg;
  }
  QuantConfig fp8;
  fp8.algo = QuantAlgo::FP8;
  try {
    expected_tensors(model_layout(preset_config("tiny-glm4.5-air")), fp8);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FP8"), std::string::npos) << e.what();
  }
}

TEST(ModelSize, TinyCountsByHand) {
  // tiny-glm4.7, every number written out from the config (see Bf16NamesDtypesShapesGlm47).
  const ModelConfig c = preset_config("tiny-glm4.7");
  const int64_t embed = 512 * 64, lm_head = 512 * 64, final_norm = 64;
  const int64_t attn = (256 * 64 + 256) + (128 * 64 + 128) * 2 + 64 * 256 + 64 * 2 + 64 * 2;
  const int64_t dense = 3 * 128 * 64;
  const int64_t router = 16 * 64;
  const int64_t expert = 3 * 64 * 64;
  const int64_t shared = 3 * 64 * 64;
  const int64_t total = embed + lm_head + final_norm + 3 * attn + dense + 2 * (router + 16 * expert + shared);
  const int64_t active = total - embed + 64 - 2 * 16 * expert + 2 * 4 * expert;

  const ModelSize s = model_size(c, QuantConfig{});
  EXPECT_EQ(s.total_all.params, total);
  EXPECT_EQ(s.active_all.params, active);
  EXPECT_EQ(s.total.at(ModuleKind::RoutedExpert).params, 2 * 16 * expert);
  EXPECT_EQ(s.active.at(ModuleKind::RoutedExpert).params, 2 * 4 * expert);
  EXPECT_EQ(s.active.at(ModuleKind::Embedding).params, 64);
  EXPECT_EQ(s.total.at(ModuleKind::LmHead).params, lm_head);
  // BF16: 2 bytes per parameter, plus the F32 correction biases (16 per MoE layer).
  EXPECT_DOUBLE_EQ(s.total_all.bytes, 2.0 * total + 2 * 16 * 4);
  EXPECT_DOUBLE_EQ(s.total.at(ModuleKind::Router).bytes, 2 * (2.0 * router + 16 * 4));
}

TEST(ModelSize, Nvfp4BytesByHand) {
  const ModelConfig c = preset_config("tiny-glm4.7");
  const ModelSize bf = model_size(c, QuantConfig{});
  const ModelSize fp4 = model_size(c, nvfp4());
  // One expert linear [64, 64]: packed 64*64/2 + scales 64*64/16 + s2 + input_scale.
  const double gate_up = 64 * 64 / 2.0 + 64 * 64 / 16.0 + 4 + 4;
  const double down = 64 * 64 / 2.0 + 64 * 64 / 16.0 + 4 + 4;  // [64, 64]
  const double one_expert = 2 * gate_up + down;
  EXPECT_DOUBLE_EQ(fp4.total.at(ModuleKind::RoutedExpert).bytes, 2 * 16 * one_expert);
  EXPECT_DOUBLE_EQ(fp4.active.at(ModuleKind::RoutedExpert).bytes, 2 * 4 * one_expert);
  // Parameters do not depend on how they are stored; lm_head and router stay BF16.
  EXPECT_EQ(fp4.total_all.params, bf.total_all.params);
  EXPECT_DOUBLE_EQ(fp4.total.at(ModuleKind::LmHead).bytes, bf.total.at(ModuleKind::LmHead).bytes);
  EXPECT_DOUBLE_EQ(fp4.total.at(ModuleKind::Router).bytes, bf.total.at(ModuleKind::Router).bytes);
  // W4A16: the same minus one 4-byte input_scale per quantized linear.
  QuantConfig w4a16 = nvfp4();
  w4a16.algo = QuantAlgo::W4A16_NVFP4;
  EXPECT_DOUBLE_EQ(model_size(c, w4a16).total.at(ModuleKind::RoutedExpert).bytes,
                   2 * 16 * (one_expert - 3 * 4));
}

TEST(ModelSize, TiedEmbeddingIsReadInFull) {
  ModelConfig c = preset_config("tiny-qwen3-30b-a3b");
  c.tie_word_embeddings = true;
  const ModelSize s = model_size(c, QuantConfig{});
  EXPECT_EQ(s.active.at(ModuleKind::Embedding).params, 512 * 64);
  EXPECT_EQ(s.total.count(ModuleKind::LmHead), 0u);
}
