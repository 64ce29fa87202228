// The decode roofline: bytes per part for small hand-made configs, counted here by hand from the
// tensor shapes (not through model_size), the unique-expert formula, KV read, communication (in
// total and per layer), errors, the JSON shape, and the CLI's exit codes and split refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "core/error.h"
#include "format/model_config.h"
#include "format/quant_config.h"
#include "perf/gpu_spec.h"
#include "perf/memory_fit.h"
#include "perf/roofline.h"

using namespace tetra;
using nlohmann::json;

namespace {

// Qwen3-MoE-shaped: hidden 64, 2 layers (both MoE), 4 heads of 16, 2 kv heads, 8 experts top-2
// of width 32, vocab 100, untied, qk norms (Qwen3 always has them), no bias.
json small_qwen_json() {
  return json{{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"},
              {"hidden_size", 64}, {"num_hidden_layers", 2}, {"vocab_size", 100},
              {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-6},
              {"tie_word_embeddings", false}, {"intermediate_size", 128},
              {"moe_intermediate_size", 32}, {"decoder_sparse_step", 1},
              {"mlp_only_layers", json::array()}, {"num_experts", 8}, {"num_experts_per_tok", 2},
              {"norm_topk_prob", true}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"head_dim", 16}, {"attention_bias", false}, {"rope_theta", 1e6}};
}

ModelConfig small_qwen() { return parse_model_config(small_qwen_json(), "test"); }

// A GPU with round numbers: 1e12 B/s HBM, 1e11 B/s link, 5 us per collective.
GpuSpec round_gpu() {
  GpuSpec g;
  g.name = "test-gpu";
  g.product = "test";
  g.bandwidth_bytes_per_s = 1e12;
  return g;
}

RooflineOptions opts(int tp, int ep, int64_t batch, int64_t context) {
  RooflineOptions o;
  o.tp = tp, o.ep = ep, o.batch = batch, o.context = context;
  o.link_bytes_per_s = 1e11;
  o.link_latency_s = 5e-6;
  return o;
}

std::map<std::string, RooflinePart> by_name(const DecodeRoofline& r) {
  std::map<std::string, RooflinePart> m;
  for (const RooflinePart& p : r.parts) m[p.name] = p;
  return m;
}

// BF16 bytes of the small model, by hand: 2 bytes per parameter.
constexpr double kAttnParamsPerLayer = 64.0 * 64 + 32 * 64 + 32 * 64 + 64 * 64;  // q k v o
constexpr double kExpertParams = 3.0 * 32 * 64;                                  // gate up down
constexpr double kNormParams = 2 * (64 + 64 + 16 + 16) + 64;  // in/post/q/k per layer + final

}  // namespace

TEST(Roofline, Bf16BatchOneCountsEveryPartByHand) {
  QuantConfig none;
  const DecodeRoofline r = decode_roofline(small_qwen(), none, round_gpu(), opts(1, 1, 1, 10));
  auto p = by_name(r);
  EXPECT_DOUBLE_EQ(p["attention"].bytes, 2 * kAttnParamsPerLayer * 2);
  // Batch 1: 2 of 8 experts per layer.
  EXPECT_DOUBLE_EQ(p["routed_experts"].bytes, 2 * 2 * kExpertParams * 2);
  EXPECT_DOUBLE_EQ(p["router"].bytes, 2 * (8.0 * 64) * 2);
  EXPECT_DOUBLE_EQ(p["norms"].bytes, kNormParams * 2);
  EXPECT_DOUBLE_EQ(p["embedding"].bytes, 64.0 * 2);
  EXPECT_DOUBLE_EQ(p["lm_head"].bytes, 100.0 * 64 * 2);
  // KV: 10 positions * 2 layers * (K+V) * 2 kv heads * 16 dims * 2 B.
  EXPECT_DOUBLE_EQ(p["kv_cache"].bytes, 10.0 * 2 * 2 * 2 * 16 * 2);
  EXPECT_EQ(p.count("shared_experts"), 0u);
  EXPECT_EQ(p.count("dense_mlp"), 0u);
  EXPECT_EQ(p.count("tp_allreduce"), 0u);
  double sum = 0;
  for (const auto& part : r.parts) sum += part.bytes;
  EXPECT_DOUBLE_EQ(r.memory_bytes, sum);
  EXPECT_DOUBLE_EQ(r.step_seconds, sum / 1e12);
  EXPECT_DOUBLE_EQ(r.tokens_per_s(), 1e12 / sum);
  EXPECT_DOUBLE_EQ(r.unique_experts_per_layer, 2.0);
}

TEST(Roofline, TiedEmbeddingIsReadInFullAsLmHead) {
  json j = small_qwen_json();
  j["tie_word_embeddings"] = true;
  QuantConfig none;
  const DecodeRoofline r = decode_roofline(parse_model_config(j, "test"), none, round_gpu(), opts(2, 1, 1, 0));
  auto p = by_name(r);
  EXPECT_EQ(p.count("lm_head"), 0u);
  EXPECT_EQ(p.count("embedding"), 0u);
  EXPECT_DOUBLE_EQ(p["embedding+lm_head"].bytes, 100.0 * 64 * 2 / 2);
}

TEST(Roofline, UniqueExpertsAtLargerBatch) {
  QuantConfig none;
  const DecodeRoofline r = decode_roofline(small_qwen(), none, round_gpu(), opts(1, 1, 4, 0));
  // P(expert untouched by one token) = 6/8; by 4 tokens (6/8)^4 = 0.31640625.
  const double touched = 1.0 - 0.31640625;
  EXPECT_NEAR(r.unique_experts_per_layer, 8 * touched, 1e-12);
  EXPECT_NEAR(by_name(r)["routed_experts"].bytes, 2 * 8 * kExpertParams * 2 * touched, 1e-6);
  // Four sequences read four embedding rows and four KV caches (context 0: none).
  EXPECT_DOUBLE_EQ(by_name(r)["embedding"].bytes, 4 * 64.0 * 2);
  EXPECT_DOUBLE_EQ(by_name(r)["kv_cache"].bytes, 0.0);
}

TEST(Roofline, TensorParallelSplitsAndAddsAllReduces) {
  QuantConfig none;
  const DecodeRoofline r = decode_roofline(small_qwen(), none, round_gpu(), opts(2, 1, 3, 10));
  auto p = by_name(r);
  EXPECT_DOUBLE_EQ(p["attention"].bytes, 2 * kAttnParamsPerLayer * 2 / 2);
  EXPECT_DOUBLE_EQ(p["lm_head"].bytes, 100.0 * 64 * 2 / 2);
  EXPECT_DOUBLE_EQ(p["norms"].bytes, kNormParams * 2);  // replicated
  // One kv head per GPU: 3 sequences * 10 positions * 2 layers * (K+V) * 16 * 2 B.
  EXPECT_DOUBLE_EQ(p["kv_cache"].bytes, 3.0 * 10 * 2 * 2 * 16 * 2);
  // Routed experts over world = 2 GPUs; touched = 1 - (6/8)^3.
  const double touched = 1.0 - 27.0 / 64.0;
  EXPECT_NEAR(p["routed_experts"].bytes, 2 * 8 * kExpertParams * 2 / 2 * touched, 1e-6);
  // 2 all-reduces per layer of 3 tokens * 64 * 2 B = 384 B; ring over 2: 2*(1/2)*384 on the link.
  ASSERT_EQ(p.count("tp_allreduce"), 1u);
  EXPECT_TRUE(p["tp_allreduce"].communication);
  EXPECT_DOUBLE_EQ(p["tp_allreduce"].bytes, 4 * 384.0);
  EXPECT_NEAR(p["tp_allreduce"].seconds, 4 * (384.0 / 1e11 + 5e-6), 1e-15);
  EXPECT_EQ(p.count("ep_dispatch_combine"), 0u);  // tp == world: every GPU has every token
  EXPECT_NEAR(r.step_seconds, r.memory_bytes / 1e12 + p["tp_allreduce"].seconds, 1e-15);
  // Per layer: its two all-reduces.
  EXPECT_EQ(p["tp_allreduce"].layers, 2);
  EXPECT_DOUBLE_EQ(p["tp_allreduce"].bytes_per_layer(), 2 * 384.0);
  EXPECT_NEAR(p["tp_allreduce"].seconds_per_layer(), 2 * (384.0 / 1e11 + 5e-6), 1e-15);
  EXPECT_DOUBLE_EQ(r.comm_seconds_per_layer, p["tp_allreduce"].seconds_per_layer());
  EXPECT_EQ(p["attention"].layers, 0);  // memory parts have no per-layer figure
}

TEST(Roofline, CommunicationPerLayerAddsEveryCollectiveOfOneLayer) {
  QuantConfig none;
  // tp 2 inside ep 4: 2 attention groups of 2 GPUs, batch 4 -> 2 sequences per GPU.
  const DecodeRoofline r = decode_roofline(small_qwen(), none, round_gpu(), opts(2, 4, 4, 0));
  auto p = by_name(r);
  ASSERT_EQ(p.count("tp_allreduce"), 1u);
  ASSERT_EQ(p.count("ep_dispatch_combine"), 1u);
  // 2 tokens * 64 * 2 B = 256 B per all-reduce, two per layer, ring over 2.
  EXPECT_NEAR(p["tp_allreduce"].seconds_per_layer(), 2 * (256.0 / 1e11 + 5e-6), 1e-15);
  // Each token reaches 3 * (1 - (3/4)^2) = 1.3125 other GPUs with its half (tp 2) of 128 B;
  // dispatch and combine per MoE layer.
  const double sent = 2 * 64.0 * 1.3125;
  EXPECT_EQ(p["ep_dispatch_combine"].layers, 2);
  EXPECT_NEAR(p["ep_dispatch_combine"].bytes_per_layer(), 2 * sent, 1e-9);
  EXPECT_NEAR(p["ep_dispatch_combine"].seconds_per_layer(), 2 * (sent / 1e11 + 5e-6), 1e-15);
  EXPECT_NEAR(r.comm_seconds_per_layer,
              p["tp_allreduce"].seconds_per_layer() + p["ep_dispatch_combine"].seconds_per_layer(),
              1e-15);
  EXPECT_NEAR(r.comm_bytes_per_layer, 2 * 2 * (1.0 / 2) * 256 + 2 * sent, 1e-9);
  EXPECT_NEAR(r.comm_seconds, 2 * r.comm_seconds_per_layer, 1e-15);  // both layers are MoE
}

TEST(Roofline, ExpertParallelWithDataParallelAttention) {
  QuantConfig none;
  // ep 4, tp 1: 4 attention groups; batch 6 -> the busiest GPU runs 2 sequences.
  const DecodeRoofline r = decode_roofline(small_qwen(), none, round_gpu(), opts(1, 4, 6, 0));
  EXPECT_EQ(r.world, 4);
  EXPECT_EQ(r.sequences_per_gpu, 2);
  auto p = by_name(r);
  EXPECT_DOUBLE_EQ(p["attention"].bytes, 2 * kAttnParamsPerLayer * 2);  // replicated
  ASSERT_EQ(p.count("ep_dispatch_combine"), 1u);
  // Each token reaches 3 * (1 - (3/4)^2) = 1.3125 other GPUs; 2 tokens * 128 B each; two
  // all-to-alls per MoE layer, 2 MoE layers.
  const double sent = 2 * 128.0 * 1.3125;
  EXPECT_NEAR(p["ep_dispatch_combine"].bytes, 4 * sent, 1e-9);
  EXPECT_NEAR(p["ep_dispatch_combine"].seconds, 4 * (sent / 1e11 + 5e-6), 1e-15);
  const double touched = 1.0 - std::pow(6.0 / 8.0, 6);
  EXPECT_NEAR(p["routed_experts"].bytes, 2 * 8 * kExpertParams * 2 / 4 * touched, 1e-6);
}

TEST(Roofline, Nvfp4ExpertsCountPackedBytesAndScales) {
  QuantConfig q;
  q.algo = QuantAlgo::NVFP4;
  q.exclude = {"lm_head"};
  const DecodeRoofline r = decode_roofline(small_qwen(), q, round_gpu(), opts(1, 1, 1, 0));
  auto p = by_name(r);
  // One NVFP4 linear [N, K]: N*K/2 packed + N*K/16 E4M3 scales + two F32 globals.
  auto fp4 = [](double n, double k) { return n * k / 2 + n * k / 16 + 8; };
  const double expert = fp4(32, 64) * 2 + fp4(64, 32);
  EXPECT_DOUBLE_EQ(p["routed_experts"].bytes, 2 * 2 * expert);
  const double attn = fp4(64, 64) + 2 * fp4(32, 64) + fp4(64, 64);
  EXPECT_DOUBLE_EQ(p["attention"].bytes, 2 * attn);
  EXPECT_DOUBLE_EQ(p["lm_head"].bytes, 100.0 * 64 * 2);  // excluded: BF16
}

TEST(Roofline, KvReadMatchesTheCachePlannerForGqa) {
  const ModelConfig c = preset_config("glm4.5-air");
  for (int tp : {1, 2, 8, 16}) {
    const double per_token = kv_bytes_per_token(c, ParallelPlan{tp, 1});
    EXPECT_DOUBLE_EQ(kv_read_bytes_per_sequence(c, tp, 1000, 2.0), per_token * 1000) << "tp " << tp;
  }
}

TEST(Roofline, MlaKvIsTheLatentAndDsaCapsItPastTopK) {
  const ModelConfig c = preset_config("glm5");  // MLA 512 + 64, 78 layers, DSA top-k 2048
  ASSERT_EQ(c.index_topk, 2048);
  const double latent = (512.0 + 64.0) * 2 * 78;
  EXPECT_DOUBLE_EQ(kv_read_bytes_per_sequence(c, 8, 1000, 2.0), latent * 1000);  // no tp split
  int indexer_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) indexer_layers += c.layer_has_indexer(l);
  ASSERT_GT(indexer_layers, 0);
  EXPECT_DOUBLE_EQ(kv_read_bytes_per_sequence(c, 1, 10000, 2.0),
                   latent * 2048 + indexer_layers * 128.0 * 2 * 10000);
}

TEST(Roofline, IndexerWeightsOnlyPastTopK) {
  QuantConfig q;
  q.algo = QuantAlgo::NVFP4;
  const ModelConfig c = preset_config("glm5");
  const GpuSpec& h200 = gpu_spec("h200");
  EXPECT_DOUBLE_EQ(by_name(decode_roofline(c, q, h200, opts(1, 1, 1, 2048)))["indexer"].bytes, 0.0);
  EXPECT_GT(by_name(decode_roofline(c, q, h200, opts(1, 1, 1, 2049)))["indexer"].bytes, 0.0);
}

TEST(Roofline, BandwidthOverrideAndTableDefault) {
  QuantConfig none;
  const GpuSpec& h200 = gpu_spec("h200");
  RooflineOptions o = opts(1, 1, 1, 0);
  const DecodeRoofline a = decode_roofline(small_qwen(), none, h200, o);
  EXPECT_DOUBLE_EQ(a.options.bandwidth_bytes_per_s, 4.46e12);
  o.bandwidth_bytes_per_s = 2.23e12;
  const DecodeRoofline b = decode_roofline(small_qwen(), none, h200, o);
  EXPECT_NEAR(b.step_seconds, 2 * a.step_seconds, 1e-18);
  RooflineOptions d;  // no link overrides: the table's NVLink
  EXPECT_DOUBLE_EQ(decode_roofline(small_qwen(), none, h200, d).options.link_bytes_per_s, 450e9);
}

TEST(Roofline, RefusesBadSplitsAndInputs) {
  QuantConfig none;
  const ModelConfig c = small_qwen();
  const GpuSpec g = round_gpu();
  EXPECT_THROW(decode_roofline(c, none, g, opts(3, 1, 1, 0)), Error);  // 3 does not divide 4 heads
  EXPECT_THROW(decode_roofline(c, none, g, opts(1, 3, 1, 0)), Error);  // 3 does not divide 8 experts
  EXPECT_THROW(decode_roofline(c, none, g, opts(0, 1, 1, 0)), Error);
  EXPECT_THROW(decode_roofline(c, none, g, opts(1, 1, 0, 0)), Error);
  EXPECT_THROW(decode_roofline(c, none, g, opts(1, 1, 1, -1)), Error);
  EXPECT_NO_THROW(decode_roofline(c, none, g, opts(4, 8, 1, 0)));  // 8 GPUs, 2 attention groups
}

TEST(Roofline, UnknownBandwidthIsAnError) {
  QuantConfig none;
  GpuSpec g = round_gpu();
  g.bandwidth_bytes_per_s = 0;
  try {
    decode_roofline(small_qwen(), none, g, opts(1, 1, 1, 0));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bandwidth"), std::string::npos) << e.what();
  }
}

TEST(Roofline, JsonShape) {
  QuantConfig none;
  const DecodeRoofline r = decode_roofline(small_qwen(), none, round_gpu(), opts(2, 1, 2, 5));
  const json j = decode_roofline_to_json(r);
  for (const char* key : {"gpu", "tp", "ep", "world", "batch", "context", "parts", "memory_bytes",
                          "step_seconds", "per_token_seconds", "tokens_per_s",
                          "unique_experts_per_layer", "bandwidth_bytes_per_s"})
    EXPECT_TRUE(j.contains(key)) << key;
  ASSERT_TRUE(j["parts"].is_array());
  double share = 0;
  int comm_parts = 0;
  for (const json& p : j["parts"]) {
    EXPECT_TRUE(p["name"].is_string());
    EXPECT_TRUE(p["kind"] == "memory" || p["kind"] == "communication");
    share += p["share"].get<double>();
    const bool comm = p["kind"] == "communication";
    comm_parts += comm;
    EXPECT_EQ(p.contains("seconds_per_layer"), comm) << p.dump();
    if (comm) {
      EXPECT_EQ(p["layers"], 2);
      EXPECT_DOUBLE_EQ(p["seconds_per_layer"].get<double>(), p["seconds"].get<double>() / 2);
      EXPECT_DOUBLE_EQ(p["bytes_per_layer"].get<double>(), p["bytes"].get<double>() / 2);
    }
  }
  EXPECT_EQ(comm_parts, 1);  // tp 2: the all-reduces
  EXPECT_NEAR(share, 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(j["comm_seconds_per_layer"].get<double>(), r.comm_seconds_per_layer);
  EXPECT_DOUBLE_EQ(j["comm_bytes_per_layer"].get<double>(), r.comm_bytes_per_layer);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 2 / j["step_seconds"].get<double>());
}

TEST(RooflineCli, TableJsonAndExitCodes) {
  auto ok = test::run_tetra("roofline --preset glm4.5-air --gpu h200 --batch 1 --context 1024");
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_NE(ok.output.find("routed_experts"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("tokens/s"), std::string::npos) << ok.output;

  auto js = test::run_tetra("roofline --preset glm4.5-air --gpu h200 --batch 8 --context 64 --json");
  ASSERT_EQ(js.code, 0) << js.output;
  const json j = json::parse(js.output);
  EXPECT_EQ(j["batch"], 8);
  EXPECT_EQ(j["gpu"], "h200");
  EXPECT_GT(j["step_seconds"].get<double>(), 0);

  auto bad_gpu = test::run_tetra("roofline --preset glm4.5-air --gpu h900");
  EXPECT_EQ(bad_gpu.code, 1) << bad_gpu.output;
  EXPECT_NE(bad_gpu.output.find("unknown GPU"), std::string::npos) << bad_gpu.output;
  auto bad_tp = test::run_tetra("roofline --preset glm4.5-air --gpu h200 --tp 5");
  EXPECT_EQ(bad_tp.code, 1) << bad_tp.output;
  EXPECT_NE(bad_tp.output.find("attention heads"), std::string::npos) << bad_tp.output;
  auto no_model = test::run_tetra("roofline --gpu h200");
  EXPECT_EQ(no_model.code, 1) << no_model.output;
  // A checkpoint directory: config.json (no quant config = BF16) is all roofline reads.
  test::TempDir dir("roofline");
  std::ofstream(dir.path() / "config.json") << small_qwen_json().dump();
  auto from_dir = test::run_tetra("roofline --model " + dir.path().string() + " --gpu a100 --json");
  ASSERT_EQ(from_dir.code, 0) << from_dir.output;
  const json jd = json::parse(from_dir.output);
  EXPECT_EQ(jd["quant"], "NONE");
  EXPECT_DOUBLE_EQ(jd["bandwidth_bytes_per_s"].get<double>(), 2.039e12);
  for (const json& part : jd["parts"])
    if (part["name"] == "lm_head") EXPECT_DOUBLE_EQ(part["bytes"].get<double>(), 100.0 * 64 * 2);
  auto bad_flag = test::run_tetra("roofline --preset glm5 --gpu h200 --batch x");
  EXPECT_GE(bad_flag.code, 100) << bad_flag.output;
}

// A split `tetra check` lists problems for gets no floor: roofline exits 1 with check's reasons
// (divisibility, and NVFP4 scale blocks cut by a row split: tp 16 cuts 1408 into slices of 88).
TEST(RooflineCli, RefusesTheSplitsCheckRefusesWithItsReasons) {
  for (const std::string split : {"--tp 3", "--ep 3", "--tp 16"}) {
    const std::string args = " --preset glm4.5-air --gpu h200 " + split;
    const auto check = test::run_tetra("check" + args + " --json");
    ASSERT_EQ(check.code, 3) << split << "\n" << check.output;
    const json problems = json::parse(check.output)["parallel"]["problems"];
    ASSERT_FALSE(problems.empty()) << split;
    const auto roof = test::run_tetra("roofline" + args);
    EXPECT_EQ(roof.code, 1) << split << "\n" << roof.output;
    EXPECT_EQ(roof.output.find("per-token floor"), std::string::npos) << roof.output;
    for (const json& p : problems)
      EXPECT_NE(roof.output.find(p.get<std::string>()), std::string::npos)
          << split << ": " << p << "\n" << roof.output;
  }
  // BF16 weights have no scale blocks to cut: check and roofline both take tp 16.
  const std::string bf16 = " --preset glm4.5-air --quant bf16 --gpu h200 --tp 16";
  EXPECT_TRUE(json::parse(test::run_tetra("check" + bf16 + " --json").output)["parallel"]["problems"].empty());
  EXPECT_EQ(test::run_tetra("roofline" + bf16).code, 0);
}

// Communication per layer next to the totals: GLM-4.5-Air has 46 layers, 45 of them MoE.
TEST(RooflineCli, CommunicationPerLayer) {
  const std::string args = "roofline --preset glm4.5-air --gpu h200 --tp 2 --ep 4";
  auto table = test::run_tetra(args);
  ASSERT_EQ(table.code, 0) << table.output;
  EXPECT_NE(table.output.find("(46 layers)"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("(45 layers)"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("communication/layer"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("communication total"), std::string::npos) << table.output;
  auto js = test::run_tetra(args + " --json");
  ASSERT_EQ(js.code, 0) << js.output;
  const json j = json::parse(js.output);
  double per_layer = 0;
  for (const json& p : j["parts"]) {
    if (p["kind"] != "communication") continue;
    EXPECT_EQ(p["layers"], p["name"] == "tp_allreduce" ? 46 : 45) << p.dump();
    per_layer += p["seconds_per_layer"].get<double>();
  }
  EXPECT_GT(per_layer, 0);
  EXPECT_NEAR(j["comm_seconds_per_layer"].get<double>(), per_layer, 1e-15);
  EXPECT_GT(j["comm_seconds"].get<double>(), 45 * per_layer);
}
