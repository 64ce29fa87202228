// Expert-parallel MoE layers on the cpu backend: a rank holds a block of routed experts, routes
// over all of them and adds only its own pairs (routing weights of the whole layer, not
// renormalised). Checks: the blocks' outputs summed equal the whole layer (2 and 4 blocks, even
// and uneven, with the shared expert and residual on one block only), a block no token routes
// to outputs exactly what the shared expert and residual give, and the weight checks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "cpu/moe_layer_fixture.h"
#include "format/model_config.h"
#include "moe/moe_layer.h"
#include "perf/gpu_spec.h"

using namespace tetra;
using namespace tetra::moe;
using tetra::test::HostMoeLayer;

namespace {

MoeLayerOptions cpu_options(int max_tokens) {
  MoeLayerOptions o;
  o.backend = "cpu";
  o.max_tokens = max_tokens;
  Target t;
  t.host_memory_bytes = int64_t(64) << 30;
  o.target = t;
  return o;
}

std::vector<uint16_t> run(const MoeLayerWeights& w, const std::vector<uint16_t>& x, int T,
                          const uint16_t* residual) {
  std::vector<uint16_t> out(x.size(), 0x7fa5);  // NaN poison: every element must be written
  make_moe_layer(w, cpu_options(T))->forward(x.data(), T, out.data(), residual, nullptr);
  return out;
}

// One bf16 unit in the last place of |v| (the spacing of bf16 values at v's magnitude).
float bf16_ulp(float v) {
  const float a = std::fabs(v);
  if (a < 1e-30f) return 0.0f;
  return std::ldexp(1.0f, std::ilogb(a) - 7);
}

// Sums the blocks' outputs and compares with the whole layer element by element. Each output is
// one bf16 rounding of a float32 sum (whose partial sums differ only in float32 order), so the
// difference stays within one ulp of each block output plus one of the whole output.
void expect_blocks_sum_to_whole(const HostMoeLayer& L, const std::vector<int>& bounds, int T,
                                bool with_residual) {
  SCOPED_TRACE(::testing::Message() << bounds.size() - 1 << " blocks, T=" << T);
  const int H = L.hidden;
  const std::vector<uint16_t> x = test::random_x(T, H, 77 + uint32_t(T));
  const std::vector<uint16_t> res = test::random_x(T, H, 78 + uint32_t(T));
  const uint16_t* residual = with_residual ? res.data() : nullptr;
  const std::vector<uint16_t> whole = run(L.weights(), x, T, residual);
  std::vector<float> sum(x.size(), 0.0f), slack(x.size(), 0.0f);  // [T, H]
  for (size_t b = 0; b + 1 < bounds.size(); ++b) {
    const bool first = b == 0;  // the block that adds the shared expert and the residual
    const std::vector<uint16_t> part =
        run(L.block_weights(bounds[b], bounds[b + 1] - bounds[b], first), x, T,
            first ? residual : nullptr);
    for (size_t i = 0; i < part.size(); ++i) {
      const float v = bf16_to_float(part[i]);
      ASSERT_TRUE(std::isfinite(v)) << "block " << b << " element " << i;
      sum[i] += v;
      slack[i] += bf16_ulp(v);
    }
  }
  size_t bad = 0;
  double num = 0, den = 0;
  for (size_t i = 0; i < sum.size(); ++i) {
    const float w = bf16_to_float(whole[i]);
    const float d = std::fabs(sum[i] - w);
    if (d > slack[i] + bf16_ulp(w) + 1e-6f && ++bad <= 5)
      ADD_FAILURE() << "element " << i << ": blocks sum to " << sum[i] << ", whole layer " << w;
    num += double(d) * d;
    den += double(w) * w;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_LE(num / den, 1e-5);
}

TEST(MoeLayerEp, BlocksSumToTheWholeLayer) {
  const ModelConfig c = preset_config("tiny-glm5");  // sigmoid, groups, bias, top-k of 16
  RouterParams rp = router_params_of(c);
  const HostMoeLayer L = test::random_layer(rp, 64, 64, 64, 21, true);
  const int E = rp.num_experts;
  ASSERT_EQ(E % 4, 0);
  for (int T : {1, 9}) {
    expect_blocks_sum_to_whole(L, {0, E / 2, E}, T, true);
    expect_blocks_sum_to_whole(L, {0, E / 4, E / 2, 3 * E / 4, E}, T, T == 9);
    expect_blocks_sum_to_whole(L, {0, 1, E - 3, E}, T, true);  // uneven blocks
  }
}

TEST(MoeLayerEp, SoftmaxWeightsAreNotRenormalisedPerBlock) {
  RouterParams rp;
  rp.scoring = Scoring::Softmax;
  rp.num_experts = 8;
  rp.top_k = 4;
  rp.norm_topk_prob = true;
  const HostMoeLayer L = test::random_layer(rp, 64, 64, 0, 22, false, ExpertFormat::BF16);
  expect_blocks_sum_to_whole(L, {0, 2, 4, 6, 8}, 5, false);
  expect_blocks_sum_to_whole(L, {0, 4, 8}, 5, true);
}

// The bias sends every token to experts 0 and 1 (top-2): a block of the others has no pair and
// outputs zeros, or exactly the shared expert + residual when it carries them.
TEST(MoeLayerEp, ABlockWithoutTokensAddsNothing) {
  RouterParams rp;
  rp.num_experts = 8;
  rp.top_k = 2;
  HostMoeLayer L = test::random_layer(rp, 64, 64, 64, 23, true);
  L.bias[0] = 50.0f;
  L.bias[1] = 50.0f;
  const int T = 6;
  const std::vector<uint16_t> x = test::random_x(T, 64, 24);
  const std::vector<uint16_t> res = test::random_x(T, 64, 25);
  // Without the shared expert and residual: exactly zero.
  const std::vector<uint16_t> empty = run(L.block_weights(2, 6, false), x, T, nullptr);
  for (uint16_t v : empty) ASSERT_EQ(bf16_to_float(v), 0.0f);
  // With them: the same bits as any other block the tokens do not use (nothing routed added).
  const std::vector<uint16_t> with_shared = run(L.block_weights(2, 6, true), x, T, res.data());
  const std::vector<uint16_t> other = run(L.block_weights(7, 1, true), x, T, res.data());
  EXPECT_EQ(with_shared, other);
  bool nonzero = false;
  for (uint16_t v : with_shared) nonzero = nonzero || bf16_to_float(v) != 0.0f;
  EXPECT_TRUE(nonzero);
  // The block holding experts 0 and 1 carries all routed output: it plus the empty block with
  // the shared expert sum to the whole layer.
  expect_blocks_sum_to_whole(L, {0, 2, 8}, T, true);
}

std::string error_of(const MoeLayerWeights& w) {
  try {
    make_moe_layer(w, cpu_options(4));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MoeLayerEp, BadBlocksAreRefused) {
  RouterParams rp;
  rp.num_experts = 8;
  rp.top_k = 2;
  const HostMoeLayer L = test::random_layer(rp, 64, 64, 0, 26, true);
  MoeLayerWeights w = L.block_weights(4, 4, false);
  EXPECT_EQ(error_of(w), "");
  w.expert_begin = 5;
  std::string msg = error_of(w);
  EXPECT_NE(msg.find("routed experts 5..8 given, the router has 8 (ids 0..7)"), std::string::npos)
      << msg;
  w.expert_begin = -1;
  msg = error_of(w);
  EXPECT_NE(msg.find("expert_begin -1 is negative"), std::string::npos) << msg;
  w = L.block_weights(0, 8, false);
  w.experts.push_back(w.experts[0]);
  msg = error_of(w);
  EXPECT_NE(msg.find("routed experts 0..8 given, the router has 8"), std::string::npos) << msg;
  w = L.block_weights(2, 2, false);
  w.gate_rows = 2;  // a router weight cut to the block: it must keep every expert
  msg = error_of(w);
  EXPECT_NE(msg.find("model.layers.1.mlp.gate.weight: 2 rows, expected one per expert of the "
                     "whole layer (8)"),
            std::string::npos)
      << msg;
  w.gate_rows = 8;
  EXPECT_EQ(error_of(w), "");
  w = L.block_weights(2, 2, false);
  w.experts[1].down.k = 32;  // errors name the global expert id
  msg = error_of(w);
  EXPECT_NE(msg.find("model.layers.1.mlp.experts.3.down_proj"), std::string::npos) << msg;
  w = L.block_weights(0, 8, false);
  w.experts.clear();
  msg = error_of(w);
  EXPECT_NE(msg.find("no routed experts given"), std::string::npos) << msg;
}

}  // namespace
