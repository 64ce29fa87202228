// config.json parsing: the real configs of the four architectures in both dialects, derived
// numbers, errors that name the key, and the JSON round trip.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>

#include "core/error.h"
#include "format/model_config.h"
#include "format/presets.h"

using namespace tetra;
using nlohmann::json;

namespace {

const std::string kConfigs = std::string(TETRA_TEST_DATA_DIR) + "/configs/";

json fixture(const std::string& name) {
  std::ifstream in(kConfigs + name);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return json::parse(in);
}

ModelConfig parse_fixture(const std::string& name) {
  return parse_model_config(fixture(name), name);
}

// Runs fn, expects a tetra::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg;
    return;
  }
  ADD_FAILURE() << "expected a tetra::Error";
}

int count_moe(const ModelConfig& c) {
  int n = 0;
  for (bool m : c.layer_is_moe) n += m;
  return n;
}

}  // namespace

TEST(ModelConfig, Glm5) {
  const ModelConfig c = parse_fixture("glm5.json");
  EXPECT_EQ(c.arch, Arch::GlmMoeDsa);
  EXPECT_EQ(c.model_type, "glm_moe_dsa");
  EXPECT_EQ(c.torch_dtype, "bfloat16");  // spelled "dtype" in this file
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_layers, 78);
  ASSERT_EQ(c.layer_is_moe.size(), 78u);
  EXPECT_FALSE(c.layer_is_moe[0]);
  EXPECT_FALSE(c.layer_is_moe[2]);
  EXPECT_TRUE(c.layer_is_moe[3]);
  EXPECT_TRUE(c.layer_is_moe[77]);
  EXPECT_EQ(count_moe(c), 75);
  EXPECT_EQ(c.num_dense_layers(), 3);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.vocab_size, 154880);
  EXPECT_EQ(c.max_position_embeddings, 202752);
  EXPECT_EQ(c.attention, AttentionKind::MLA);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.q_lora_rank, 2048);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 192);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 256);
  EXPECT_EQ(c.head_dim, 256);  // q/k head dim, not the config's "head_dim": 64
  EXPECT_EQ(c.index_n_heads, 32);
  EXPECT_EQ(c.index_head_dim, 128);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_TRUE(c.indexer_types.empty());
  EXPECT_TRUE(c.layer_has_indexer(0) && c.layer_has_indexer(77));
  EXPECT_TRUE(c.indexer_rope_interleave);
  EXPECT_EQ(c.routing.scoring, RouterScoring::Sigmoid);
  EXPECT_EQ(c.routing.topk_method, "noaux_tc");
  EXPECT_EQ(c.routing.n_group, 1);
  EXPECT_EQ(c.routing.topk_group, 1);
  EXPECT_TRUE(c.routing.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routing.routed_scaling_factor, 2.5);
  EXPECT_TRUE(c.routing.has_correction_bias);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);  // from rope_parameters
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_TRUE(c.rope.interleave);
  EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
}

TEST(ModelConfig, Glm5ExplicitLayerTypesAndIndexShare) {
  const ModelConfig base = parse_fixture("glm5.json");
  const ModelConfig c = parse_fixture("glm5-indexshare.json");
  EXPECT_EQ(c.layer_is_moe, base.layer_is_moe);  // mlp_layer_types == first_k_dense_replace 3
  ASSERT_EQ(c.indexer_types.size(), 78u);
  for (int L : {0, 1, 2, 6, 10, 74}) EXPECT_TRUE(c.layer_has_indexer(L)) << L;
  for (int L : {3, 4, 5, 7, 77}) EXPECT_FALSE(c.layer_has_indexer(L)) << L;
}

TEST(ModelConfig, Glm45Air) {
  const ModelConfig c = parse_fixture("glm4.5-air.json");
  EXPECT_EQ(c.arch, Arch::Glm4Moe);
  EXPECT_EQ(c.attention, AttentionKind::GQA);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_layers, 46);
  EXPECT_EQ(c.num_dense_layers(), 1);
  EXPECT_FALSE(c.layer_is_moe[0]);
  EXPECT_TRUE(c.layer_is_moe[1]);
  EXPECT_EQ(c.intermediate_size, 10944);
  EXPECT_EQ(c.num_attention_heads, 96);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.use_qk_norm);
  EXPECT_EQ(c.n_routed_experts, 128);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.vocab_size, 151552);
  EXPECT_DOUBLE_EQ(c.rope.partial_rotary_factor, 0.5);
  EXPECT_FALSE(c.rope.interleave);  // NeoX rotate-half
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_EQ(c.routing.scoring, RouterScoring::Sigmoid);  // implied: glm4_moe configs omit it
  EXPECT_TRUE(c.routing.has_correction_bias);
  EXPECT_DOUBLE_EQ(c.routing.routed_scaling_factor, 1.0);
  EXPECT_EQ(c.index_n_heads, 0);
}

TEST(ModelConfig, Glm47) {
  const ModelConfig c = parse_fixture("glm4.7.json");
  EXPECT_EQ(c.arch, Arch::Glm4Moe);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.num_layers, 92);
  EXPECT_EQ(c.num_dense_layers(), 3);
  EXPECT_EQ(c.n_routed_experts, 160);
  EXPECT_EQ(c.moe_intermediate_size, 1536);
  EXPECT_TRUE(c.use_qk_norm);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_DOUBLE_EQ(c.routing.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfig, DeepseekV3) {
  const ModelConfig c = parse_fixture("deepseek-v3.json");
  EXPECT_EQ(c.arch, Arch::DeepseekV3);
  EXPECT_EQ(c.attention, AttentionKind::MLA);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_layers, 61);
  EXPECT_EQ(c.num_dense_layers(), 3);
  EXPECT_EQ(c.intermediate_size, 18432);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.head_dim, 192);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.routing.n_group, 8);
  EXPECT_EQ(c.routing.topk_group, 4);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000);
  EXPECT_DOUBLE_EQ(c.rope.factor, 40);
  EXPECT_EQ(c.rope.original_max_position, 4096);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1);
  EXPECT_DOUBLE_EQ(c.rope.mscale, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 1.0);
  EXPECT_TRUE(c.rope.interleave);  // DeepSeek's default when the key is absent
  EXPECT_EQ(c.index_n_heads, 0);
}

TEST(ModelConfig, DeepseekV3NewDialectMeansTheSame) {
  // dtype vs torch_dtype, rope_parameters vs rope_theta+rope_scaling, mlp_layer_types vs
  // first_k_dense_replace: the same model either way.
  EXPECT_EQ(parse_fixture("deepseek-v3-new-dialect.json"), parse_fixture("deepseek-v3.json"));
}

TEST(ModelConfig, Qwen3) {
  const ModelConfig c = parse_fixture("qwen3-30b-a3b.json");
  EXPECT_EQ(c.arch, Arch::Qwen3Moe);
  EXPECT_EQ(c.attention, AttentionKind::GQA);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_layers, 48);
  EXPECT_EQ(count_moe(c), 48);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.n_routed_experts, 128);  // spelled num_experts
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.n_shared_experts, 0);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_TRUE(c.use_qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.routing.scoring, RouterScoring::Softmax);
  EXPECT_FALSE(c.routing.has_correction_bias);
  EXPECT_DOUBLE_EQ(c.routing.routed_scaling_factor, 1.0);
  EXPECT_TRUE(c.routing.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_FALSE(c.rope.interleave);
}

TEST(ModelConfig, UnknownKeysAreIgnored) {
  json j = fixture("glm4.5-air.json");
  j["some_future_key"] = {{"nested", {1, 2, 3}}};
  j["quantization_config"] = {{"quant_method", "modelopt"}};
  EXPECT_EQ(parse_model_config(j, "x"), parse_fixture("glm4.5-air.json"));
}

TEST(ModelConfig, MissingKeyIsNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"glm5.json", "hidden_size"},          {"glm5.json", "index_topk"},
      {"glm5.json", "q_lora_rank"},          {"deepseek-v3.json", "kv_lora_rank"},
      {"deepseek-v3.json", "n_group"},       {"glm4.5-air.json", "first_k_dense_replace"},
      {"glm4.5-air.json", "num_key_value_heads"}, {"qwen3-30b-a3b.json", "norm_topk_prob"},
      {"qwen3-30b-a3b.json", "num_experts"}, {"qwen3-30b-a3b.json", "rms_norm_eps"},
  };
  for (const auto& [file, key] : cases) {
    json j = fixture(file);
    ASSERT_TRUE(j.contains(key)) << file << " " << key;
    j.erase(key);
    expect_error([&] { parse_model_config(j, "dir/" + file); }, {"dir/" + file, key, "missing"});
  }
}

TEST(ModelConfig, MissingRopeThetaIsNamedInBothDialects) {
  json a = fixture("glm5.json");
  a["rope_parameters"].erase("rope_theta");
  expect_error([&] { parse_model_config(a, "a.json"); }, {"a.json", "rope_theta"});
  json b = fixture("glm4.5-air.json");
  b.erase("rope_theta");
  expect_error([&] { parse_model_config(b, "b.json"); }, {"b.json", "rope_theta"});
}

TEST(ModelConfig, UnknownArchitectureListsTheSupportedOnes) {
  const json llama = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                      {"hidden_size", 4096}};
  expect_error([&] { parse_model_config(llama, "llama/config.json"); },
               {"llama/config.json", "LlamaForCausalLM", "GlmMoeDsaForCausalLM",
                "Glm4MoeForCausalLM", "DeepseekV3ForCausalLM", "Qwen3MoeForCausalLM"});
  expect_error([&] { parse_model_config(json::object(), "empty.json"); },
               {"empty.json", "architectures", "Qwen3MoeForCausalLM"});
  // The two keys disagreeing is refused rather than guessed.
  json mixed = fixture("qwen3-30b-a3b.json");
  mixed["model_type"] = "deepseek_v3";
  expect_error([&] { parse_model_config(mixed, "m.json"); }, {"Qwen3MoeForCausalLM", "deepseek_v3"});
}

TEST(ModelConfig, ModelTypeAloneIsEnough) {
  json j = fixture("glm4.7.json");
  j.erase("architectures");
  EXPECT_EQ(parse_model_config(j, "x").arch, Arch::Glm4Moe);
}

TEST(ModelConfig, BadValuesAreRefusedWithTheKey) {
  struct Case {
    std::string file;
    std::function<void(json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"glm5.json", [](json& j) { j["hidden_size"] = "6144"; }, {"hidden_size", "integer"}},
      {"glm5.json", [](json& j) { j["hidden_size"] = 61.5; }, {"hidden_size", "integer"}},
      {"glm5.json", [](json& j) { j["tie_word_embeddings"] = 1; }, {"tie_word_embeddings"}},
      {"glm5.json", [](json& j) { j["hidden_act"] = "gelu"; }, {"hidden_act", "gelu"}},
      {"glm5.json", [](json& j) { j["q_lora_rank"] = nullptr; }, {"q_lora_rank"}},
      {"glm5.json", [](json& j) { j["indexer_types"] = {"full", "shared"}; },
       {"indexer_types", "78"}},
      {"glm5.json", [](json& j) { j["indexer_types"] = json::array(); for (int i = 0; i < 78; ++i) j["indexer_types"].push_back("shared"); },
       {"indexer_types", "shared"}},
      {"glm5.json", [](json& j) { j["rope_parameters"]["rope_type"] = "llama3"; }, {"llama3"}},
      {"glm5-indexshare.json", [](json& j) { j["mlp_layer_types"][5] = "moe"; },
       {"mlp_layer_types", "moe"}},
      {"deepseek-v3.json", [](json& j) { j["scoring_func"] = "softmax"; }, {"scoring_func"}},
      {"deepseek-v3.json", [](json& j) { j["topk_method"] = "greedy"; }, {"topk_method"}},
      {"deepseek-v3.json", [](json& j) { j["n_group"] = 7; }, {"n_group"}},
      {"deepseek-v3.json", [](json& j) { j["topk_group"] = 9; }, {"topk_group"}},
      {"deepseek-v3.json", [](json& j) { j["rope_scaling"].erase("factor"); }, {"factor"}},
      {"deepseek-v3.json", [](json& j) { j["num_experts_per_tok"] = 300; }, {"num_experts_per_tok"}},
      {"glm4.5-air.json", [](json& j) { j["num_key_value_heads"] = 7; }, {"num_key_value_heads"}},
      {"glm4.5-air.json", [](json& j) { j["partial_rotary_factor"] = 0.3; }, {"partial_rotary_factor"}},
      {"qwen3-30b-a3b.json", [](json& j) { j["decoder_sparse_step"] = 0; }, {"decoder_sparse_step"}},
  };
  for (const auto& c : cases) {
    json j = fixture(c.file);
    c.edit(j);
    try {
      parse_model_config(j, c.file);
      ADD_FAILURE() << c.file << ": expected an error mentioning " << c.parts[0];
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(c.file), std::string::npos) << msg;
      for (const auto& p : c.parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
    }
  }
}

// Sizes beyond any model are refused with the key and the limit, before anything is sized from
// them: a hostile config used to reach std::bad_alloc (10^12 layers) or overflow int64 in the
// roofline's arithmetic (hidden_size 2^40). The limits themselves still parse.
TEST(ModelConfig, OversizeValuesAreRefusedWithTheLimit) {
  struct Case {
    std::string file, key;
    int64_t value;
    std::string expect;  // part of the message
  };
  const std::vector<Case> cases = {
      {"glm4.5-air.json", "num_hidden_layers", int64_t(1) << 39, "at most 1024"},
      {"glm4.5-air.json", "num_hidden_layers", 1025, "at most 1024"},
      {"glm4.5-air.json", "hidden_size", 65536 * 2, "at most 65536"},
      {"glm4.5-air.json", "vocab_size", (int64_t(1) << 22) + 1, "at most 4194304"},
      {"glm4.5-air.json", "vocab_size", int64_t(1) << 62, "out of range"},
      {"glm4.5-air.json", "max_position_embeddings", (int64_t(1) << 30) + 1, "at most"},
      {"glm4.5-air.json", "moe_intermediate_size", (int64_t(1) << 20) + 1, "at most"},
      {"glm4.5-air.json", "intermediate_size", int64_t(1) << 41, "out of range"},
      {"glm4.5-air.json", "n_routed_experts", 4097, "at most 4096"},
      {"glm4.5-air.json", "n_shared_experts", 65, "at most 64"},
      {"glm4.5-air.json", "head_dim", 8192, "at most 4096"},
      {"deepseek-v3.json", "kv_lora_rank", 65537, "at most 65536"},
      {"deepseek-v3.json", "qk_nope_head_dim", int64_t(1) << 40, "head_dim"},
      {"qwen3-30b-a3b.json", "num_experts", 4096, "expert instances"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key + " = " + std::to_string(c.value));
    json j = fixture(c.file);
    j[c.key] = c.value;
    if (c.key == "num_experts") j["num_hidden_layers"] = 257;  // 257 x 4096 > 2^20
    expect_error([&] { parse_model_config(j, c.file); }, {c.file, c.expect});
  }
  json big = fixture("glm4.5-air.json");  // every limit at once, and an unsigned 2^64 - 1
  big["num_hidden_layers"] = kMaxLayers;
  big["first_k_dense_replace"] = kMaxLayers - 255;  // 255 MoE layers x 4096 experts: under 2^20
  big["hidden_size"] = kMaxHidden;
  big["vocab_size"] = kMaxVocab;
  big["n_routed_experts"] = kMaxExperts;
  big["n_group"] = 1;
  const ModelConfig c = parse_model_config(big, "big");
  EXPECT_EQ(c.num_layers, kMaxLayers);
  EXPECT_EQ(c.num_moe_layers() * (c.n_routed_experts + c.n_shared_experts), 255 * 4097);
  big["vocab_size"] = std::numeric_limits<uint64_t>::max();
  expect_error([&] { parse_model_config(big, "big"); }, {"vocab_size", "out of range"});
}

TEST(ModelConfig, ContextLimitFollowsYarn) {
  EXPECT_EQ(parse_fixture("glm4.5-air.json").context_limit(),
            parse_fixture("glm4.5-air.json").max_position_embeddings);
  json j = fixture("deepseek-v3.json");  // YaRN: factor 40 over 4096 original positions
  j["max_position_embeddings"] = 4096;
  EXPECT_EQ(parse_model_config(j, "deepseek-v3.json").context_limit(), 40 * 4096);
  j["max_position_embeddings"] = 200000;  // the longer of the two
  EXPECT_EQ(parse_model_config(j, "deepseek-v3.json").context_limit(), 200000);
}

TEST(ModelConfig, HeadDimDefaultsToHiddenOverHeads) {
  json j = fixture("qwen3-30b-a3b.json");
  j.erase("head_dim");
  EXPECT_EQ(parse_model_config(j, "x").head_dim, 2048 / 32);
}

TEST(ModelConfig, QwenSparseStepAndMlpOnlyLayers) {
  json j = fixture("qwen3-30b-a3b.json");
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  // transformers: sparse iff not in mlp_only_layers and (i + 1) % step == 0.
  const std::vector<bool> want = {false, true, false, false, false, true};
  EXPECT_EQ(parse_model_config(j, "x").layer_is_moe, want);
}

TEST(ModelConfig, MoeLayerFreq) {
  json j = fixture("deepseek-v3.json");
  j["num_hidden_layers"] = 6;
  j["first_k_dense_replace"] = 1;
  j["moe_layer_freq"] = 2;
  const std::vector<bool> want = {false, false, true, false, true, false};
  EXPECT_EQ(parse_model_config(j, "x").layer_is_moe, want);
}

TEST(ModelConfig, IndexerScheduleFromPatternOrFrequency) {
  json j = fixture("glm5.json");
  j["num_hidden_layers"] = 6;
  j["index_topk_pattern"] = "FFSSFS";
  const std::vector<std::string> from_pattern = {"full", "full", "shared", "shared", "full", "shared"};
  EXPECT_EQ(parse_model_config(j, "x").indexer_types, from_pattern);
  j.erase("index_topk_pattern");
  j["index_topk_freq"] = 2;
  j["index_skip_topk_offset"] = 2;
  // full iff max(i - offset + 1, 0) % freq == 0: i=0 (0), 1 (0), 2 (1), 3 (2), 4 (3), 5 (4).
  const std::vector<std::string> from_freq = {"full", "full", "shared", "full", "shared", "full"};
  EXPECT_EQ(parse_model_config(j, "x").indexer_types, from_freq);
}

TEST(ModelConfig, NoQueryCompressionForPlainMla) {
  json j = fixture("deepseek-v3.json");
  j["q_lora_rank"] = nullptr;  // DeepSeek-V2-Lite style
  const ModelConfig c = parse_model_config(j, "x");
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(parse_model_config(model_config_to_json(c), "rt"), c);
}

TEST(ModelConfig, LoadFromDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / "tetra_test_model_config";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  expect_error([&] { load_model_config(dir); }, {"config.json"});
  std::filesystem::copy_file(kConfigs + "glm5.json", dir / "config.json");
  EXPECT_EQ(load_model_config(dir), parse_fixture("glm5.json"));
  {
    std::ofstream bad(dir / "config.json", std::ios::trunc);
    bad << "{\"hidden_size\": 12,";
  }
  expect_error([&] { load_model_config(dir); }, {(dir / "config.json").string(), "JSON"});
  std::filesystem::remove_all(dir);
}

TEST(ModelConfig, RoundTripEveryFixtureAndPreset) {
  std::vector<std::pair<std::string, ModelConfig>> all;
  for (const char* f : {"glm5.json", "glm5-indexshare.json", "glm4.5-air.json", "glm4.7.json",
                        "deepseek-v3.json", "deepseek-v3-new-dialect.json", "qwen3-30b-a3b.json"})
    all.emplace_back(f, parse_fixture(f));
  for (const auto& name : preset_names()) all.emplace_back(name, preset_config(name));
  for (const auto& [name, c] : all) {
    const json j = model_config_to_json(c);
    EXPECT_EQ(parse_model_config(j, name + " (written)"), c) << name << "\n" << j.dump(2);
    // The architecture is written the way checkpoints spell it.
    EXPECT_EQ(j.at("architectures")[0], std::string(arch_hf_name(c.arch))) << name;
  }
}

TEST(ModelConfig, RoundTripKeepsAnIrregularLayerPattern) {
  ModelConfig c = parse_fixture("deepseek-v3.json");
  c.layer_is_moe[10] = false;  // not a dense prefix: must be written as mlp_layer_types
  const json j = model_config_to_json(c);
  EXPECT_TRUE(j.contains("mlp_layer_types"));
  EXPECT_EQ(parse_model_config(j, "x"), c);
}

TEST(ModelConfig, ArchitectureNames) {
  EXPECT_EQ(supported_architectures(),
            (std::vector<std::string>{"GlmMoeDsaForCausalLM", "Glm4MoeForCausalLM",
                                      "DeepseekV3ForCausalLM", "Qwen3MoeForCausalLM"}));
  for (Arch a : {Arch::GlmMoeDsa, Arch::Glm4Moe, Arch::DeepseekV3, Arch::Qwen3Moe}) {
    EXPECT_EQ(arch_from_name(arch_hf_name(a)), a);
    EXPECT_EQ(arch_from_name(arch_model_type(a)), a);
  }
  EXPECT_FALSE(arch_from_name("MixtralForCausalLM").has_value());
}
