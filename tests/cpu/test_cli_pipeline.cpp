// End to end through the real `tetra` binary and real files: make-model -> quantize -> inspect,
// with the bytes of the result checked against the NVFP4 reference and the ModelOpt grouping rule.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "core/half.h"
#include "format/nvfp4.h"
#include "format/safetensors_checkpoint.h"

namespace fs = std::filesystem;
using tetra::test::run_tetra;
using tetra::test::TempDir;

namespace {

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

float bf16_amax(const tetra::TensorView& v) {
  float m = 0;
  const auto* p = reinterpret_cast<const uint16_t*>(v.data);
  for (int64_t i = 0; i < v.numel(); ++i) m = std::max(m, std::fabs(tetra::bf16_to_float(p[i])));
  return m;
}

float read_f32(const tetra::TensorView& v) {
  float f;
  std::memcpy(&f, v.data, 4);
  return f;
}

class Pipeline : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("pipeline");
    auto r = run_tetra("make-model --preset tiny-glm5 --dtype bf16 --seed 7 " + bf16().string());
    ASSERT_EQ(r.code, 0) << r.output;
    std::ofstream(bf16() / "tokenizer.json") << "{\"model\": {}}";
    r = run_tetra("quantize --device cpu --quiet " + bf16().string() + " " + fp4().string());
    ASSERT_EQ(r.code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static fs::path bf16() { return dir_->path() / "bf16"; }
  static fs::path fp4() { return dir_->path() / "fp4"; }
  static TempDir* dir_;
};
TempDir* Pipeline::dir_ = nullptr;

}  // namespace

TEST_F(Pipeline, QuantConfigIsModelOptShaped) {
  const auto hf = read_json(fp4() / "hf_quant_config.json");
  EXPECT_EQ(hf["producer"]["name"], "modelopt");
  EXPECT_EQ(hf["quantization"]["quant_algo"], "W4A16_NVFP4");
  EXPECT_EQ(hf["quantization"]["group_size"], 16);
  const auto cfg = read_json(fp4() / "config.json");
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "modelopt");
  EXPECT_EQ(cfg["architectures"][0], "GlmMoeDsaForCausalLM");
  EXPECT_TRUE(fs::exists(fp4() / "tokenizer.json")) << "other files must be copied";
}

TEST_F(Pipeline, ExpertsShareOneGlobalScaleAcrossGateAndUp) {
  const auto in = tetra::SafetensorsCheckpoint::open(bf16());
  const auto out = tetra::SafetensorsCheckpoint::open(fp4());
  // layer 0 is dense in every tiny preset; find the first MoE layer's expert 1
  std::string base;
  for (int layer = 0; layer < 8 && base.empty(); ++layer) {
    const std::string b = "model.layers." + std::to_string(layer) + ".mlp.experts.1.";
    if (in.contains(b + "gate_proj.weight")) base = b;
  }
  ASSERT_FALSE(base.empty());
  const float amax = std::max(bf16_amax(in.view(base + "gate_proj.weight")),
                              bf16_amax(in.view(base + "up_proj.weight")));
  const float s2 = amax / 2688.0f;
  EXPECT_EQ(read_f32(out.view(base + "gate_proj.weight_scale_2")), s2);
  EXPECT_EQ(read_f32(out.view(base + "up_proj.weight_scale_2")), s2);
  // down_proj has its own scale
  EXPECT_EQ(read_f32(out.view(base + "down_proj.weight_scale_2")),
            bf16_amax(in.view(base + "down_proj.weight")) / 2688.0f);
  for (const char* proj : {"gate_proj", "up_proj"}) {
    const auto w = in.view(base + proj + ".weight");
    const int64_t rows = w.shape[0], cols = w.shape[1];
    std::vector<uint8_t> packed(rows * cols / 2), scales(rows * cols / 16);
    tetra::nvfp4::quantize_weight(w.data, tetra::DType::BF16, rows, cols, s2, packed.data(), scales.data());
    const auto q = out.view(base + proj + ".weight");
    const auto s = out.view(base + proj + ".weight_scale");
    EXPECT_EQ(q.dtype, tetra::DType::U8);
    EXPECT_EQ(s.dtype, tetra::DType::F8_E4M3);
    ASSERT_EQ(q.nbytes, packed.size());
    ASSERT_EQ(s.nbytes, scales.size());
    EXPECT_EQ(0, std::memcmp(q.data, packed.data(), packed.size())) << proj;
    EXPECT_EQ(0, std::memcmp(s.data, scales.data(), scales.size())) << proj;
  }
}

TEST_F(Pipeline, HighPrecisionTensorsAreCopiedUnchanged) {
  const auto in = tetra::SafetensorsCheckpoint::open(bf16());
  const auto out = tetra::SafetensorsCheckpoint::open(fp4());
  int checked = 0;
  for (const std::string& name : in.names()) {
    const bool keep = name.find("norm") != std::string::npos || name == "lm_head.weight" ||
                      name == "model.embed_tokens.weight" ||
                      name.find("mlp.gate.") != std::string::npos;
    if (!keep) continue;
    const auto a = in.view(name), b = out.view(name);
    ASSERT_EQ(a.dtype, b.dtype) << name;
    ASSERT_EQ(a.nbytes, b.nbytes) << name;
    EXPECT_EQ(0, std::memcmp(a.data, b.data, a.nbytes)) << name;
    ++checked;
  }
  EXPECT_GT(checked, 5);
  EXPECT_FALSE(out.contains("model.layers.1.mlp.gate.weight_scale"));
}

TEST_F(Pipeline, InspectReportsFp4ModulesAndActiveBytes) {
  const auto r = run_tetra("inspect --json " + fp4().string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["architecture"], "GlmMoeDsaForCausalLM");
  EXPECT_EQ(j["quantization"]["algo"], "W4A16_NVFP4");
  EXPECT_GT(j["linear_modules"]["routed_expert"]["fp4"].get<int>(), 0);
  EXPECT_EQ(j["linear_modules"]["routed_expert"]["high_precision"].get<int>(), 0);
  EXPECT_EQ(j["linear_modules"]["router"]["fp4"].get<int>(), 0);
  EXPECT_TRUE(j["problems"].empty());
  const double active = j["active_per_token"]["bytes"], total = j["total"]["bytes"];
  EXPECT_GT(active, 0);
  EXPECT_LT(active, total);
  // the config-derived total and the bytes in the files agree within the scalar scales
  EXPECT_NEAR(j["files"]["bytes"].get<double>(), total, 0.01 * total);
  const auto text = run_tetra("inspect " + fp4().string());
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.output.find("active/token"), std::string::npos) << text.output;
  // GLM-5 runs (MLA + DSA indexer), on the cpu and the cuda backend.
  EXPECT_TRUE(j["runtime"]["reasons"].empty()) << j["runtime"].dump();
  EXPECT_TRUE(j["runtime"]["cuda_reasons"].empty()) << j["runtime"].dump();
  EXPECT_NE(text.output.find("runtime       generate/serve support it"), std::string::npos)
      << text.output;
}

TEST_F(Pipeline, ExcludeKeepsModulesHighPrecisionAndRecordsThem) {
  const fs::path out = dir_->path() / "excl";
  auto r = run_tetra("quantize --quiet --device cpu --exclude '*.shared_experts.*' " +
                     bf16().string() + " " + out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ck = tetra::SafetensorsCheckpoint::open(out);
  int shared = 0;
  for (const std::string& name : ck.names())
    if (name.find("shared_experts") != std::string::npos) {
      EXPECT_NE(ck.view(name).dtype, tetra::DType::U8) << name;
      ++shared;
    }
  EXPECT_GT(shared, 0);
  const auto hf = read_json(out / "hf_quant_config.json");
  const auto& ex = hf["quantization"]["exclude_modules"];
  EXPECT_NE(std::find(ex.begin(), ex.end(), "*.shared_experts.*"), ex.end()) << ex.dump();
  r = run_tetra("inspect " + out.string());
  EXPECT_EQ(r.code, 0) << r.output;
}

TEST_F(Pipeline, ShardsAtTheSizeLimit) {
  const fs::path out = dir_->path() / "sharded";
  auto r = run_tetra("quantize --quiet --device cpu --max-shard-size 100KB " + bf16().string() +
                     " " + out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  int shards = 0;
  for (const auto& e : fs::directory_iterator(out)) shards += e.path().extension() == ".safetensors";
  EXPECT_GT(shards, 2);
  r = run_tetra("inspect --json " + out.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["files"]["count"].get<int>(), shards);
}

TEST_F(Pipeline, RefusesAlreadyQuantizedInput) {
  const auto r = run_tetra("quantize --quiet " + fp4().string() + " " + (dir_->path() / "x").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("already quantized"), std::string::npos) << r.output;
}

TEST(MakeModel, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir dir("seeds");
  for (const char* s : {"a 3", "b 3", "c 4"}) {
    std::string name(1, s[0]);
    auto r = run_tetra(std::string("make-model --preset tiny-qwen3-30b-a3b --seed ") + (s + 2) +
                       " " + (dir.path() / name).string());
    ASSERT_EQ(r.code, 0) << r.output;
  }
  auto bytes = [&](const char* n) {
    std::ifstream in(dir.path() / n / "model.safetensors", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes("a"), bytes("b"));
  EXPECT_NE(bytes("a"), bytes("c"));
}

TEST(MakeModel, EveryTinyPresetInBothDtypesValidates) {
  TempDir dir("presets");
  for (const char* preset : {"tiny-glm5", "tiny-glm4.5-air", "tiny-glm4.7", "tiny-deepseek-v3",
                             "tiny-qwen3-30b-a3b"}) {
    for (const char* dtype : {"bf16", "nvfp4"}) {
      const fs::path out = dir.path() / (std::string(preset) + "-" + dtype);
      auto r = run_tetra(std::string("make-model --preset ") + preset + " --dtype " + dtype + " " +
                         out.string());
      ASSERT_EQ(r.code, 0) << r.output;
      r = run_tetra("inspect --json " + out.string());
      ASSERT_EQ(r.code, 0) << preset << " " << dtype << ": " << r.output;
      const auto j = nlohmann::json::parse(r.output);
      EXPECT_TRUE(j["problems"].empty()) << preset;
      EXPECT_LT(j["files"]["bytes"].get<double>(), 4e6) << preset << " tiny presets must stay tiny";
    }
  }
}

TEST(Cli, BadInputGivesOneClearLine) {
  struct Case {
    std::string args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"inspect /nonexistent/dir", "not found"},
      {"make-model --preset no-such-model /tmp/x", "tiny-glm5"},
      {"make-model --preset tiny-glm5 --dtype fp8 /tmp/x", "fp8"},
      {"make-model --preset tiny-glm5 --layers 0 /tmp/x", "layers"},
      {"quantize --frobnicate a b", "frobnicate"},
      {"quantize --device tpu a b", "tpu"},
      {"quantize --max-shard-size 5XB a b", "5XB"},
      {"nosuchcommand", "nosuchcommand"},
  };
  for (const Case& c : cases) {
    const auto r = run_tetra(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
  }
  for (const char* sub : {"inspect", "quantize", "make-model", "check", "demo"}) {
    const auto r = run_tetra(std::string(sub) + " --help");
    EXPECT_EQ(r.code, 0) << sub;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << sub;
  }
}

TEST(Quantize, NanWeightIsRefusedNamingTheTensor) {
  TempDir dir("nan");
  auto r = run_tetra("make-model --preset tiny-qwen3-30b-a3b " + (dir.path() / "a").string());
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string victim = "model.layers.0.self_attn.o_proj.weight";
  // Poke a bf16 NaN into the victim tensor on disk.
  const auto file = dir.path() / "a" / "model.safetensors";
  size_t at = 0;
  {
    const auto ck = tetra::SafetensorsCheckpoint::open(dir.path() / "a");
    std::ifstream in(file, std::ios::binary);
    std::string all(std::istreambuf_iterator<char>(in), {});
    const auto v = ck.view(victim);
    const std::string needle(reinterpret_cast<const char*>(v.data), 64);
    at = all.find(needle);
    ASSERT_NE(at, std::string::npos);
  }
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(at + 10));
    const uint16_t nan = 0x7fc0;
    f.write(reinterpret_cast<const char*>(&nan), 2);
  }
  r = run_tetra("quantize --quiet --device cpu " + (dir.path() / "a").string() + " " +
                (dir.path() / "b").string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find(victim), std::string::npos) << r.output;
}
