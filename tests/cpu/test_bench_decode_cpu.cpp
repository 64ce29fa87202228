// `tetra bench decode` without a GPU: the model structure it builds for --random-weights
// (shape_only_weights) against the preset facts of MODELS.md, and the command's argument errors
// (checked before any GPU is looked for, so they behave the same on every machine).
#include <gtest/gtest.h>

#include <sstream>

#include "bench/decode_bench.h"
#include "cli_runner.h"
#include "core/error.h"
#include "format/presets.h"
#include "format/quant_config.h"
#include "model/cuda/cuda_model_ops.h"

namespace tetra::bench {
namespace {

TEST(DecodeBenchShapes, Glm45AirNvfp4) {
  const model::ModelWeights w = shape_only_weights(preset_config("glm4.5-air"), true);
  ASSERT_EQ(w.layers.size(), 46u);
  EXPECT_FALSE(w.lm_head.quantized);  // ModelOpt keeps lm_head in BF16
  EXPECT_EQ(w.lm_head.out_features, 151552);
  EXPECT_EQ(w.embedding.shape, (std::vector<int64_t>{151552, 4096}));
  const model::LayerWeights& dense = w.layers[0];  // first_k_dense_replace = 1
  ASSERT_TRUE(dense.dense.has_value());
  EXPECT_FALSE(dense.moe.has_value());
  EXPECT_EQ(dense.dense->inter(), 10944);
  EXPECT_TRUE(dense.dense->gate.quantized);
  const model::LayerWeights& L = w.layers[5];
  EXPECT_EQ(L.attn.q.out_features, 96 * 128);
  EXPECT_EQ(L.attn.k.out_features, 8 * 128);
  EXPECT_EQ(L.attn.o.in_features, 96 * 128);
  EXPECT_TRUE(L.attn.q.quantized);
  EXPECT_TRUE(L.attn.q.bias.has_value());  // attention_bias
  EXPECT_FALSE(L.attn.o.bias.has_value());
  EXPECT_FALSE(L.attn.q_norm.has_value());  // no qk norm on GLM-4.5-Air
  EXPECT_EQ(L.attn.q.weight.shape, (std::vector<int64_t>{12288, 2048}));  // [N, K/2] u8
  ASSERT_TRUE(L.moe.has_value());
  EXPECT_EQ(L.moe->experts.size(), 128u);
  EXPECT_EQ(L.moe->experts[7].inter(), 1408);
  EXPECT_EQ(L.moe->router.shape, (std::vector<int64_t>{128, 4096}));
  EXPECT_TRUE(L.moe->correction_bias.has_value());  // sigmoid routing
  ASSERT_TRUE(L.moe->shared.has_value());
  EXPECT_EQ(L.moe->shared->inter(), 1408);
  EXPECT_EQ(L.moe->router_params.top_k, 8);
}

TEST(DecodeBenchShapes, Qwen3Bf16) {
  const model::ModelWeights w = shape_only_weights(preset_config("qwen3-30b-a3b"), false);
  ASSERT_EQ(w.layers.size(), 48u);
  const model::LayerWeights& L = w.layers[0];
  ASSERT_TRUE(L.moe.has_value());  // every Qwen3-30B-A3B layer is MoE
  EXPECT_FALSE(L.moe->shared.has_value());
  EXPECT_FALSE(L.moe->correction_bias.has_value());  // softmax routing
  EXPECT_TRUE(L.attn.q_norm.has_value() && L.attn.k_norm.has_value());
  EXPECT_FALSE(L.attn.q.quantized);
  EXPECT_FALSE(L.moe->experts[0].down.quantized);
  EXPECT_EQ(L.attn.q.weight.shape, (std::vector<int64_t>{32 * 128, 2048}));
}

TEST(DecodeBenchShapes, Glm5MlaNvfp4) {
  const model::ModelWeights w = shape_only_weights(preset_config("glm5"), true);
  ASSERT_EQ(w.layers.size(), 78u);
  const model::LayerWeights& L = w.layers[10];
  ASSERT_TRUE(L.attn.mla.has_value());
  const model::MlaWeights& m = *L.attn.mla;
  ASSERT_TRUE(m.q_a.has_value());
  EXPECT_EQ(m.q_a->out_features, 2048);
  EXPECT_EQ(L.attn.q.out_features, 64 * 256);  // q_b_proj: 64 heads x (192 nope + 64 rope)
  EXPECT_EQ(L.attn.q.in_features, 2048);
  EXPECT_EQ(m.kv_a.out_features, 512 + 64);
  EXPECT_EQ(m.kv_b.out_features, 64 * (192 + 256));
  EXPECT_EQ(m.kv_b.in_features, 512);
  EXPECT_EQ(L.attn.o.in_features, 64 * 256);
  EXPECT_EQ(L.attn.k.out_features, 0);  // no GQA projections
  ASSERT_TRUE(L.moe.has_value());
  EXPECT_EQ(L.moe->experts.size(), 256u);
}

// What the CUDA model backend says it cannot run (prepare() refuses with the first reason, before
// it looks for a GPU; `tetra check` prints them all).
TEST(DecodeBenchShapes, CudaBackendLimits) {
  ModelConfig c = preset_config("tiny-glm4.5-air");
  EXPECT_TRUE(model::cuda::cuda_model_unsupported_reasons(c).empty());
  c.head_dim = 96;
  const std::vector<std::string> why = model::cuda::cuda_model_unsupported_reasons(c);
  ASSERT_EQ(why.size(), 1u);
  EXPECT_NE(why[0].find("head_dim 96"), std::string::npos) << why[0];
  c.head_dim = 128;
  c.num_key_value_heads = 2;
  c.num_attention_heads = 34;  // 17 query heads per kv head
  const std::vector<std::string> gqa = model::cuda::cuda_model_unsupported_reasons(c);
  ASSERT_EQ(gqa.size(), 1u);
  EXPECT_NE(gqa[0].find("17 query heads per kv head"), std::string::npos) << gqa[0];
}

// The report states the bandwidth each row achieved (the floor's bytes over the median step),
// in the table and the JSON, labelled per GPU when the model is split.
TEST(DecodeBenchReport, AchievedBandwidth) {
  DecodeBenchReport r;
  r.preset = "glm4.5-air";
  r.config = preset_config("glm4.5-air");
  r.bandwidth_bytes_per_s = 4.46e12;
  DecodeBenchRow row;
  row.batch = 1;
  row.context = 1024;
  row.median_us = 3300.0;
  row.floor_bytes = 8.316e9;  // 2.52 TB/s at 3300 us
  row.floor_us = row.floor_bytes / r.bandwidth_bytes_per_s * 1e6;
  row.efficiency = row.floor_us / row.median_us;
  r.rows.push_back(row);
  EXPECT_NEAR(achieved_bytes_per_s(row), 2.52e12, 1e9);
  EXPECT_NEAR(achieved_bytes_per_s(row), row.efficiency * r.bandwidth_bytes_per_s, 1e3);
  const std::string md = decode_bench_markdown(r);
  EXPECT_NE(md.find("| efficiency | achieved TB/s |"), std::string::npos) << md;
  EXPECT_NE(md.find("% | 2.52 | "), std::string::npos) << md;
  const nlohmann::json j = decode_bench_json(r);
  EXPECT_NEAR(j["rows"][0]["achieved_bytes_per_s"].get<double>(), 2.52e12, 1e9);
  r.tp = 2;
  EXPECT_NE(decode_bench_markdown(r).find("achieved TB/s per GPU"), std::string::npos);
  row.median_us = 0;  // no step measured: nothing achieved, not a division by zero
  EXPECT_EQ(achieved_bytes_per_s(row), 0.0);
}

// The prefill line states its model FLOPs (perf/prefill_flops.h) over its median time.
TEST(DecodeBenchReport, PrefillFlopRate) {
  DecodeBenchReport r;
  r.preset = "glm4.5-air";
  r.config = preset_config("glm4.5-air");
  r.prefill_tokens = 4096;
  r.prefill_us = 400000.0;
  r.prefill_tokens_per_s = r.prefill_tokens / 0.4;
  EXPECT_EQ(prefill_flops_per_s(r), 0.0);  // no FLOPs counted yet
  r.prefill_model_flops = prefill_flops(r.config, QuantConfig{}, r.prefill_tokens);
  const double rate = r.prefill_model_flops.total() / 0.4;
  EXPECT_NEAR(prefill_flops_per_s(r), rate, 1e-6 * rate);
  EXPECT_GT(rate, 2.5e14);  // ~119 TFLOP in 0.4 s
  EXPECT_LT(rate, 3.2e14);
  std::ostringstream want;
  want.setf(std::ios::fixed);
  want.precision(1);
  want << "10240.0 tokens/s, " << rate / 1e12 << " TFLOP/s of model FLOPs";
  const std::string md = decode_bench_markdown(r);
  EXPECT_NE(md.find(want.str()), std::string::npos) << md;
  const nlohmann::json j = decode_bench_json(r);
  EXPECT_NEAR(j["prefill"]["flops_per_s"].get<double>(), rate, 1e-6 * rate);
  EXPECT_NEAR(j["prefill"]["model_flops"].get<double>(), r.prefill_model_flops.total(), 1.0);
}

TEST(DecodeBenchCli, ArgumentErrors) {
  struct Case { const char* args; const char* words; };
  for (const Case& c : {
           Case{"bench decode --batch 1", "either --model DIR or --preset"},
           Case{"bench decode --preset glm4.5-air", "--random-weights"},
           Case{"bench decode --preset glm4.5-air --random-weights --batch 1,0", "--batch"},
           Case{"bench decode --preset glm4.5-air --random-weights --context x", "--context"},
           Case{"bench decode --preset glm4.5-air --random-weights --dtype fp8", "--dtype"},
           Case{"bench decode --model /nonexistent --preset glm4.5-air --random-weights", "either"},
       }) {
    const test::RunResult r = test::run_tetra(c.args);
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.words), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace tetra::bench
