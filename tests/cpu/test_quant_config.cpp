// Quantization configs (hf_quant_config.json and config.json quantization_config), which
// modules they quantize, their JSON round trips, and the wildcard patterns they use.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "format/quant_config.h"
#include "format/wildcard.h"

using namespace tetra;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kConfigs = std::string(TETRA_TEST_DATA_DIR) + "/configs/";

json fixture(const std::string& name) {
  std::ifstream in(kConfigs + name);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return json::parse(in);
}

// A fresh model folder holding the given files (name in folder -> JSON content).
class TempModelDir {
 public:
  explicit TempModelDir(const std::string& tag)
      : path_(fs::temp_directory_path() / ("tetra_test_quant_" + tag)) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempModelDir() { fs::remove_all(path_); }
  void write(const std::string& file, const json& j) const {
    std::ofstream(path_ / file) << j.dump(2);
  }
  void write_text(const std::string& file, const std::string& text) const {
    std::ofstream(path_ / file) << text;
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

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

}  // namespace

TEST(Wildcard, Basics) {
  EXPECT_TRUE(wildcard_match("lm_head", "lm_head"));
  EXPECT_FALSE(wildcard_match("lm_head", "lm_head2"));
  EXPECT_FALSE(wildcard_match("lm_head", "model.lm_head"));  // whole-name match, not substring
  EXPECT_TRUE(wildcard_match("*.mlp.gate", "model.layers.12.mlp.gate"));
  EXPECT_FALSE(wildcard_match("*.mlp.gate", "model.layers.12.mlp.gate_proj"));
  EXPECT_TRUE(wildcard_match("model.layers.0.self_attn*", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(wildcard_match("model.layers.0.self_attn*", "model.layers.0.self_attn"));
  EXPECT_FALSE(wildcard_match("model.layers.0.self_attn*", "model.layers.10.self_attn.q_proj"));
  EXPECT_TRUE(wildcard_match("model.layers.*.mlp.experts.*.down_proj",
                             "model.layers.3.mlp.experts.255.down_proj"));
  EXPECT_FALSE(wildcard_match("model.layers.*.mlp.experts.*.down_proj",
                              "model.layers.3.mlp.shared_experts.down_proj"));
}

TEST(Wildcard, EdgeCases) {
  EXPECT_TRUE(wildcard_match("", ""));
  EXPECT_FALSE(wildcard_match("", "a"));
  EXPECT_TRUE(wildcard_match("*", ""));
  EXPECT_TRUE(wildcard_match("*", "model.layers.1.anything"));
  EXPECT_TRUE(wildcard_match("**", "x"));
  EXPECT_FALSE(wildcard_match("a*", ""));
  EXPECT_FALSE(wildcard_match("abc", "ab"));
  EXPECT_FALSE(wildcard_match("ab", "abc"));
  // '*' crosses dots: "model.layers.1*" also matches layer 10..19 (ModelOpt relies on the
  // trailing dot or digits to be precise, as in "model.layers.61*" for the MTP layer).
  EXPECT_TRUE(wildcard_match("model.layers.1*", "model.layers.12.mlp"));
  EXPECT_FALSE(wildcard_match("model.layers.1.*", "model.layers.12.mlp"));
  // Backtracking: the first '*' must not swallow the match of the rest.
  EXPECT_TRUE(wildcard_match("a*b*c", "axxbyybzc"));
  EXPECT_TRUE(wildcard_match("a*bc", "abcbc"));
  EXPECT_FALSE(wildcard_match("a*b*c", "acb"));
  EXPECT_TRUE(wildcard_match("*a", "aaaa"));
  EXPECT_FALSE(wildcard_match("*ab", "aaaa"));
  // Only '*' is special.
  EXPECT_FALSE(wildcard_match("model.layers.?.mlp", "model.layers.1.mlp"));
  EXPECT_TRUE(wildcard_match("model.layers.?.mlp", "model.layers.?.mlp"));
  EXPECT_FALSE(wildcard_match("model.layers.1.mlp", "modelxlayers.1.mlp"));  // '.' is literal
}

TEST(Wildcard, ModuleAncestors) {
  EXPECT_TRUE(wildcard_match_module("model.layers.3.self_attn", "model.layers.3.self_attn.q_proj"));
  EXPECT_TRUE(wildcard_match_module("model.layers.*.mlp", "model.layers.7.mlp.experts.1.up_proj"));
  EXPECT_FALSE(wildcard_match_module("model.layers.3.self", "model.layers.3.self_attn.q_proj"));
  EXPECT_FALSE(wildcard_match_module("*.mlp.gate", "model.layers.3.mlp.gate_proj"));
  EXPECT_TRUE(wildcard_match_module("lm_head", "lm_head"));
}

TEST(QuantConfig, ModelOptNvfp4WithAttentionExcluded) {
  TempModelDir dir("r1");
  dir.write("hf_quant_config.json", fixture("quant-deepseek-r1-fp4.hf_quant_config.json"));
  const QuantConfig q = load_quant_config(dir.path());
  EXPECT_EQ(q.algo, QuantAlgo::NVFP4);
  EXPECT_FALSE(q.mixed);
  EXPECT_EQ(q.kv_cache_quant_algo, "FP8");
  EXPECT_EQ(q.group_size, 16);
  EXPECT_EQ(q.producer, "modelopt");
  EXPECT_EQ(q.producer_version, "0.23.0");
  EXPECT_EQ(q.exclude.size(), 63u);
  EXPECT_TRUE(q.quantized());
  EXPECT_EQ(q.algo_for("model.layers.5.self_attn.q_a_proj"), QuantAlgo::None);
  EXPECT_EQ(q.algo_for("model.layers.60.self_attn.o_proj"), QuantAlgo::None);
  EXPECT_EQ(q.algo_for("model.layers.5.mlp.experts.3.gate_proj"), QuantAlgo::NVFP4);
  EXPECT_EQ(q.algo_for("model.layers.5.mlp.shared_experts.down_proj"), QuantAlgo::NVFP4);
  EXPECT_EQ(q.algo_for("model.layers.0.mlp.gate_proj"), QuantAlgo::NVFP4);  // dense MLP
  EXPECT_EQ(q.algo_for("model.layers.61.mlp.experts.0.up_proj"), QuantAlgo::None);  // MTP layer
  EXPECT_EQ(q.algo_for("lm_head"), QuantAlgo::None);
}

TEST(QuantConfig, WeightOnly) {
  TempModelDir dir("w4a16");
  dir.write("hf_quant_config.json", fixture("quant-w4a16.hf_quant_config.json"));
  const QuantConfig q = load_quant_config(dir.path());
  EXPECT_EQ(q.algo, QuantAlgo::W4A16_NVFP4);
  EXPECT_EQ(q.kv_cache_quant_algo, "");  // null
  EXPECT_EQ(q.algo_for("model.layers.3.mlp.gate"), QuantAlgo::None);  // router
  EXPECT_EQ(q.algo_for("model.layers.3.mlp.gate_proj"), QuantAlgo::W4A16_NVFP4);
  EXPECT_EQ(q.algo_for("model.layers.3.self_attn.k_proj"), QuantAlgo::W4A16_NVFP4);
}

TEST(QuantConfig, MixedPrecision) {
  TempModelDir dir("mixed");
  dir.write("hf_quant_config.json", fixture("quant-mixed.hf_quant_config.json"));
  const QuantConfig q = load_quant_config(dir.path());
  EXPECT_TRUE(q.mixed);
  EXPECT_EQ(q.algo, QuantAlgo::None);
  EXPECT_EQ(q.quantized_layers.size(), 4u);
  EXPECT_TRUE(q.quantized());
  EXPECT_EQ(q.algo_for("model.layers.0.mlp.gate_proj"), QuantAlgo::W4A16_NVFP4);  // exact key
  EXPECT_EQ(q.algo_for("model.layers.2.mlp.experts.9.down_proj"), QuantAlgo::NVFP4);  // pattern key
  EXPECT_EQ(q.algo_for("model.layers.1.mlp.experts.3.up_proj"), QuantAlgo::None);  // excluded
  EXPECT_EQ(q.algo_for("model.layers.1.mlp.experts.30.up_proj"), QuantAlgo::NVFP4);
  EXPECT_EQ(q.algo_for("model.layers.0.self_attn.q_proj"), QuantAlgo::None);  // not listed
  EXPECT_EQ(q.algo_for("lm_head"), QuantAlgo::None);
  // A parent module listed whole covers its linears.
  QuantConfig parent = q;
  parent.quantized_layers = {{"model.layers.4.mlp.shared_experts", QuantAlgo::W4A16_NVFP4}};
  EXPECT_EQ(parent.algo_for("model.layers.4.mlp.shared_experts.down_proj"), QuantAlgo::W4A16_NVFP4);
  EXPECT_EQ(parent.algo_for("model.layers.4.mlp.shared_experts_x.down_proj"), QuantAlgo::None);
}

TEST(QuantConfig, ConfigJsonOnly) {
  TempModelDir dir("cfg");
  dir.write("config.json", fixture("quant-glm4.5-air-nvfp4.config.json"));
  const QuantConfig q = load_quant_config(dir.path());
  EXPECT_EQ(q.algo, QuantAlgo::NVFP4);
  EXPECT_EQ(q.kv_cache_quant_algo, "FP8");  // from kv_cache_scheme {num_bits 8, float}
  EXPECT_EQ(q.group_size, 16);              // from config_groups
  EXPECT_EQ(q.producer, "modelopt");
  EXPECT_EQ(q.producer_version, "0.31.0");
  EXPECT_EQ(q.exclude, (std::vector<std::string>{"lm_head", "model.layers.0.self_attn*",
                                                 "model.layers.46*", "*.mlp.gate"}));
  EXPECT_EQ(q.algo_for("model.layers.0.self_attn.q_proj"), QuantAlgo::None);
  EXPECT_EQ(q.algo_for("model.layers.1.self_attn.q_proj"), QuantAlgo::NVFP4);
  EXPECT_EQ(q.algo_for("model.layers.1.mlp.gate"), QuantAlgo::None);
}

TEST(QuantConfig, BothFilesAgreeingUsesTheModelOptFile) {
  TempModelDir dir("both");
  dir.write("hf_quant_config.json", fixture("quant-deepseek-r1-fp4.hf_quant_config.json"));
  json cfg = fixture("deepseek-v3.json");
  cfg["quantization_config"] = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"},
                                {"ignore", {"lm_head"}}};
  dir.write("config.json", cfg);
  const QuantConfig q = load_quant_config(dir.path());
  EXPECT_EQ(q.algo, QuantAlgo::NVFP4);
  EXPECT_EQ(q.exclude.size(), 63u);
}

TEST(QuantConfig, BothFilesDisagreeingIsAnError) {
  TempModelDir dir("disagree");
  dir.write("hf_quant_config.json", fixture("quant-deepseek-r1-fp4.hf_quant_config.json"));
  dir.write("config.json", fixture("deepseek-v3.json"));  // native FP8 quantization_config
  expect_error([&] { load_quant_config(dir.path()); },
               {"hf_quant_config.json", "NVFP4", "config.json", "FP8"});
}

TEST(QuantConfig, NativeFp8IsRecognised) {
  TempModelDir dir("fp8");
  dir.write("config.json", fixture("deepseek-v3.json"));
  const QuantConfig q = load_quant_config(dir.path());
  EXPECT_EQ(q.algo, QuantAlgo::FP8);
  EXPECT_TRUE(q.quantized());
}

TEST(QuantConfig, NothingMeansUnquantized) {
  TempModelDir empty("none");
  EXPECT_EQ(load_quant_config(empty.path()), QuantConfig{});
  TempModelDir plain("plain");
  plain.write("config.json", fixture("glm4.5-air.json"));
  const QuantConfig q = load_quant_config(plain.path());
  EXPECT_EQ(q.algo, QuantAlgo::None);
  EXPECT_FALSE(q.quantized());
  EXPECT_EQ(q.algo_for("model.layers.1.mlp.experts.0.up_proj"), QuantAlgo::None);
}

TEST(QuantConfig, AlgorithmInferredFromConfigGroups) {
  json qc = fixture("quant-glm4.5-air-nvfp4.config.json")["quantization_config"];
  qc.erase("quant_algo");
  EXPECT_EQ(parse_quant_config(nullptr, json{{"quantization_config", qc}}).algo, QuantAlgo::NVFP4);
  qc["config_groups"]["group_0"].erase("input_activations");
  EXPECT_EQ(parse_quant_config(nullptr, json{{"quantization_config", qc}}).algo,
            QuantAlgo::W4A16_NVFP4);
}

TEST(QuantConfig, UnsupportedIsRefusedByName) {
  expect_error([&] {
    parse_quant_config(nullptr, json{{"quantization_config", {{"quant_method", "gptq"}, {"bits", 4}}}},
                       "h", "m/config.json");
  }, {"m/config.json", "gptq"});
  json hf = fixture("quant-w4a16.hf_quant_config.json");
  hf["quantization"]["quant_algo"] = "INT4_AWQ";
  expect_error([&] { parse_quant_config(hf, nullptr, "m/hf_quant_config.json"); },
               {"m/hf_quant_config.json", "INT4_AWQ"});
  hf["quantization"]["quant_algo"] = "NVFP4";
  hf["quantization"]["group_size"] = 32;
  expect_error([&] { parse_quant_config(hf, nullptr, "m/hf_quant_config.json"); },
               {"group_size", "32"});
  expect_error([&] { parse_quant_config(json{{"producer", "x"}}, nullptr, "m/hf_quant_config.json"); },
               {"m/hf_quant_config.json", "quantization"});
  json mixed = fixture("quant-mixed.hf_quant_config.json");
  mixed["quantization"]["quantized_layers"]["model.layers.0.mlp.up_proj"]["quant_algo"] = "W4A8_AWQ";
  expect_error([&] { parse_quant_config(mixed, nullptr, "m/hf_quant_config.json"); },
               {"model.layers.0.mlp.up_proj", "W4A8_AWQ"});
}

TEST(QuantConfig, MalformedFileNamesThePath) {
  TempModelDir dir("malformed");
  dir.write_text("hf_quant_config.json", "{\"quantization\": ");
  expect_error([&] { load_quant_config(dir.path()); },
               {(dir.path() / "hf_quant_config.json").string(), "JSON"});
}

TEST(QuantConfig, RoundTripsThroughBothFormats) {
  QuantConfig nvfp4;
  nvfp4.algo = QuantAlgo::NVFP4;
  nvfp4.kv_cache_quant_algo = "FP8";
  nvfp4.producer = "tetra";
  nvfp4.producer_version = "0.1.0";
  nvfp4.exclude = {"lm_head", "*.mlp.gate", "model.layers.0.self_attn*"};

  QuantConfig w4a16;
  w4a16.algo = QuantAlgo::W4A16_NVFP4;
  w4a16.producer = "modelopt";
  w4a16.exclude = {"lm_head"};

  QuantConfig mixed;
  mixed.mixed = true;
  mixed.quantized_layers = {{"model.layers.1.mlp.experts.0.gate_proj", QuantAlgo::NVFP4},
                            {"model.layers.1.mlp.experts.0.up_proj", QuantAlgo::NVFP4},
                            {"model.layers.0.mlp.down_proj", QuantAlgo::W4A16_NVFP4}};
  mixed.exclude = {"lm_head"};
  mixed.kv_cache_quant_algo = "NVFP4";

  for (const QuantConfig& q : {nvfp4, w4a16, mixed}) {
    const json hf = quant_config_to_hf_json(q);
    EXPECT_EQ(parse_quant_config(hf, nullptr), q) << hf.dump(2);
    const json cfg = {{"quantization_config", quant_config_to_config_json(q)}};
    EXPECT_EQ(parse_quant_config(nullptr, cfg), q) << cfg.dump(2);
    // Both written together must be accepted as agreeing.
    EXPECT_EQ(parse_quant_config(hf, cfg), q);
  }
  EXPECT_TRUE(quant_config_to_config_json(QuantConfig{}).is_null());
}

TEST(QuantConfig, WrittenFilesHaveModelOptShape) {
  QuantConfig q;
  q.algo = QuantAlgo::W4A16_NVFP4;
  q.exclude = {"lm_head"};
  const json hf = quant_config_to_hf_json(q);
  EXPECT_EQ(hf["quantization"]["quant_algo"], "W4A16_NVFP4");
  EXPECT_EQ(hf["quantization"]["group_size"], 16);
  EXPECT_TRUE(hf["quantization"]["kv_cache_quant_algo"].is_null());
  EXPECT_EQ(hf["quantization"]["exclude_modules"], json({"lm_head"}));
  const json cfg = quant_config_to_config_json(q);
  EXPECT_EQ(cfg["quant_method"], "modelopt");
  EXPECT_EQ(cfg["quant_algo"], "W4A16_NVFP4");
  EXPECT_EQ(cfg["ignore"], json({"lm_head"}));
  EXPECT_EQ(cfg["config_groups"]["group_0"]["weights"]["num_bits"], 4);
  EXPECT_EQ(cfg["config_groups"]["group_0"]["weights"]["group_size"], 16);
  EXPECT_FALSE(cfg["config_groups"]["group_0"].contains("input_activations"));  // weight-only
  q.algo = QuantAlgo::NVFP4;
  EXPECT_EQ(quant_config_to_config_json(q)["config_groups"]["group_0"]["input_activations"]["num_bits"], 4);
}

TEST(QuantConfig, AlgoNames) {
  EXPECT_EQ(quant_algo_name(QuantAlgo::NVFP4), "NVFP4");
  EXPECT_EQ(quant_algo_name(QuantAlgo::W4A16_NVFP4), "W4A16_NVFP4");
  EXPECT_EQ(quant_algo_name(QuantAlgo::FP8), "FP8");
  EXPECT_EQ(quant_algo_name(QuantAlgo::None), "NONE");
}
