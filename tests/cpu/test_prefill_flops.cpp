// prefill_flops against counts written out by hand from the configs: GLM-4.5-Air (GQA with
// biases, one dense layer, a shared expert), a GLM-5-shaped MLA + DSA model below and above its
// top-k, and the argument errors.
#include <gtest/gtest.h>

#include "core/error.h"
#include "format/model_size.h"
#include "format/presets.h"
#include "format/quant_config.h"
#include "perf/prefill_flops.h"

namespace tetra {
namespace {

TEST(PrefillFlops, Glm45AirByHand) {
  const ModelConfig c = preset_config("glm4.5-air");
  ASSERT_EQ(c.hidden_size, 4096);
  ASSERT_EQ(c.num_layers, 46);
  const double H = 4096, q = 96 * 128, kv = 8 * 128;
  const double attention = H * q + 2 * H * kv + q * H + (q + 2 * kv);  // q k v o + q/k/v biases
  const double dense = 3 * H * 10944;                                 // layer 0
  const double experts = (8 + 1) * 3 * H * 1408;                      // top 8 + the shared one
  const double router = 128 * H;
  const double per_token = 46 * attention + dense + 45 * (experts + router);
  const double lm_head = 151552 * H;
  const int64_t T = 4096;
  const PrefillFlops f = prefill_flops(c, QuantConfig{}, T);
  EXPECT_NEAR(f.linear, 2 * T * per_token + 2 * lm_head, 1e-9 * f.linear);
  const double pairs = double(T) * (T + 1) / 2;
  EXPECT_NEAR(f.attention, 46 * 2 * pairs * 96 * (128 + 128), 1e-9 * f.attention);
  EXPECT_DOUBLE_EQ(f.total(), f.linear + f.attention);
  // ~24.4 GFLOP of weights per token, ~19 TFLOP of attention at 4096 tokens.
  EXPECT_NEAR(2 * per_token / 1e9, 24.4, 0.1);
  // One token more per prompt costs one token's linear FLOPs plus T + 1 new pairs per layer.
  const PrefillFlops g = prefill_flops(c, QuantConfig{}, T + 1);
  EXPECT_NEAR(g.linear - f.linear, 2 * per_token, 1e-9 * f.linear);
  EXPECT_NEAR(g.attention - f.attention, 46 * 2 * double(T + 1) * 96 * 256, 1e-9 * f.attention);
  // Every position's logits: lm_head T times.
  EXPECT_NEAR(prefill_flops(c, QuantConfig{}, T, T).linear - f.linear, 2 * (T - 1) * lm_head,
              1e-9 * f.linear);
}

// Tied embeddings (the lm_head is the embedding table): the logits' FLOPs are the same as an
// untied lm_head of the same shape, counted once, from the embedding's entry of model_size.
TEST(PrefillFlops, TiedLmHeadCountsTheTableOnce) {
  ModelConfig c = preset_config("glm4.5-air");
  const int64_t T = 512;
  const PrefillFlops untied = prefill_flops(c, QuantConfig{}, T, 3);
  c.tie_word_embeddings = true;
  const PrefillFlops tied = prefill_flops(c, QuantConfig{}, T, 3);
  EXPECT_DOUBLE_EQ(tied.linear, untied.linear);
  EXPECT_DOUBLE_EQ(tied.attention, untied.attention);
  // Every logit row adds the table's 2 * vocab * hidden FLOPs, tied or not.
  const double table = double(c.vocab_size) * double(c.hidden_size);
  EXPECT_NEAR(prefill_flops(c, QuantConfig{}, T, 4).linear - tied.linear, 2 * table,
              1e-9 * tied.linear);
}

TEST(PrefillFlops, MlaAndDsaKeepTopKKeys) {
  const ModelConfig c = preset_config("glm5");
  ASSERT_EQ(c.attention, AttentionKind::MLA);
  ASSERT_GT(c.index_topk, 0);
  const double heads = double(c.num_attention_heads);
  const double dqk = double(c.qk_nope_head_dim + c.qk_rope_head_dim), dv = double(c.v_head_dim);
  int64_t indexer_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) indexer_layers += c.layer_has_indexer(l) ? 1 : 0;
  ASSERT_GT(indexer_layers, 0);
  // At most index_topk tokens: every key kept, no indexer.
  const int64_t S = c.index_topk;
  const PrefillFlops a = prefill_flops(c, QuantConfig{}, S);
  EXPECT_NEAR(a.attention, double(c.num_layers) * 2 * (double(S) * (S + 1) / 2) * heads * (dqk + dv),
              1e-9 * a.attention);
  // Twice as long: query t keeps min(t, topk) keys, and the indexer scores every pair.
  const int64_t T = 2 * c.index_topk;
  const double k = double(c.index_topk);
  const double kept = k * (k + 1) / 2 + double(T - c.index_topk) * k;
  const double full = double(T) * (T + 1) / 2;
  const PrefillFlops b = prefill_flops(c, QuantConfig{}, T);
  EXPECT_NEAR(b.attention,
              double(c.num_layers) * 2 * kept * heads * (dqk + dv) +
                  double(indexer_layers) * 2 * full * double(c.index_n_heads * c.index_head_dim),
              1e-9 * b.attention);
  // The indexer's projections join the per-token weights once it runs: one token more costs
  // 2 * indexer params more above index_topk than below it.
  const double short_step = a.linear - prefill_flops(c, QuantConfig{}, S - 1).linear;
  const double long_step = prefill_flops(c, QuantConfig{}, T + 1).linear - b.linear;
  const double indexer = double(model_size(c, QuantConfig{}).active.at(ModuleKind::Indexer).params);
  ASSERT_GT(indexer, 0.0);
  EXPECT_NEAR(long_step - short_step, 2 * indexer, 1e-6 * short_step);
}

TEST(PrefillFlops, ArgumentErrors) {
  const ModelConfig c = preset_config("qwen3-30b-a3b");
  EXPECT_THROW(prefill_flops(c, QuantConfig{}, 0), Error);
  EXPECT_THROW(prefill_flops(c, QuantConfig{}, 4, 5), Error);
  EXPECT_THROW(prefill_flops(c, QuantConfig{}, 4, -1), Error);
  EXPECT_NO_THROW(prefill_flops(c, QuantConfig{}, 4, 0));
}

}  // namespace
}  // namespace tetra
