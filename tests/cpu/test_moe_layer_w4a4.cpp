// W4A4 numerics at the MoE layer level on the CPU: the cpu backend with MoeLayerOptions::w4a4 (the
// twin the cuda-w4a4 backend is held to) against the plain W4A4 reference (moe/w4a4_reference.h),
// the refusals when the checkpoint has no input_scale, and auto staying on W4A16.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "cpu/moe_layer_fixture.h"
#include "moe/backend_select.h"
#include "moe/moe_layer.h"
#include "moe/token_movement.h"
#include "moe/w4a4_reference.h"
#include "perf/gpu_spec.h"

using namespace tetra;
using namespace tetra::moe;
using tetra::test::HostMoeLayer;

namespace {

RouterParams small_router() {
  RouterParams rp;
  rp.num_experts = 8;
  rp.top_k = 2;
  rp.scoring = Scoring::Sigmoid;
  rp.norm_topk_prob = true;
  rp.routed_scaling_factor = 2.5f;
  return rp;
}

Target h200() {
  Target t;
  t.gpu = gpu_spec("h200");
  t.host_memory_bytes = int64_t(64) << 30;
  return t;
}

// The message of make_moe_layer's Error, or "" when it builds.
std::string refusal(const MoeLayerWeights& w, const MoeLayerOptions& o) {
  try {
    make_moe_layer(w, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::vector<uint16_t> run_cpu(const HostMoeLayer& L, bool w4a4, const std::vector<uint16_t>& x,
                              int T, const std::vector<uint16_t>* residual = nullptr) {
  MoeLayerOptions o;
  o.backend = "cpu";
  o.max_tokens = T;
  o.w4a4 = w4a4;
  auto layer = make_moe_layer(L.weights(), o);
  EXPECT_EQ(layer->backend(), "cpu");
  std::vector<uint16_t> out(x.size());  // [T, H]
  layer->forward(x.data(), T, out.data(), residual ? residual->data() : nullptr, nullptr);
  return out;
}

TEST(MoeLayerW4a4, CheckpointWithoutInputScaleIsRefusedNamingTheTensor) {
  const HostMoeLayer L = test::random_layer(small_router(), 128, 64, 64, 3);  // no input scales
  MoeLayerOptions o;
  o.max_tokens = 4;
  o.backend = "cuda-w4a4";
  o.target = h200();
  const std::string gpu = refusal(L.weights(), o);
  EXPECT_TRUE(contains(gpu, "checkpoint is W4A16_NVFP4: no input_scale for W4A4")) << gpu;
  EXPECT_TRUE(contains(gpu, "model.layers.1.mlp.experts.0.gate_proj.input_scale is missing")) << gpu;

  o.backend = "cpu";
  o.target.reset();
  o.w4a4 = true;
  const std::string cpu = refusal(L.weights(), o);
  EXPECT_TRUE(contains(cpu, "checkpoint is W4A16_NVFP4: no input_scale for W4A4")) << cpu;

  // One missing linear is enough, and it is the one named.
  HostMoeLayer partial = L;
  test::add_input_scales(partial, 5);
  partial.experts[6].down.input_scale.reset();
  const std::string one = refusal(partial.weights(), o);
  EXPECT_TRUE(contains(one, "model.layers.1.mlp.experts.6.down_proj.input_scale is missing")) << one;

  // A W4A16 backend cannot give W4A4 numerics.
  test::add_input_scales(partial, 5);
  o.backend = "cuda-w4a16";
  o.target = h200();
  const std::string w4a16 = refusal(partial.weights(), o);
  EXPECT_TRUE(contains(w4a16, "keeps bf16 activations")) << w4a16;

  // A bad scale is an error naming its tensor.
  partial.experts[2].up.input_scale = -1.0f;
  o.backend = "cpu";
  o.target.reset();
  const std::string bad = refusal(partial.weights(), o);
  EXPECT_TRUE(contains(bad, "model.layers.1.mlp.experts.2.up_proj.input_scale")) << bad;
  EXPECT_TRUE(contains(bad, "positive and finite")) << bad;
}

TEST(MoeLayerW4a4, AutoKeepsW4a16AndCuda4a4AcceptsScales) {
  HostMoeLayer L = test::random_layer(small_router(), 128, 64, 64, 7);
  MoeLayerOptions o;
  o.max_tokens = 16;
  const MoeWorkload plain = layer_workload(L.weights(), o);
  EXPECT_FALSE(plain.has_input_scale);
  EXPECT_EQ(plain.expert_algo, QuantAlgo::W4A16_NVFP4);
  test::add_input_scales(L, 8);
  const MoeWorkload scaled = layer_workload(L.weights(), o);
  EXPECT_TRUE(scaled.has_input_scale);
  EXPECT_EQ(scaled.expert_algo, QuantAlgo::NVFP4);
  // Both run it; auto stays on W4A16 (W4A4 changes the numerics, it must be asked for).
  EXPECT_TRUE(evaluate(*find_backend("cuda-w4a4"), scaled, h200()).ok);
  EXPECT_EQ(auto_backend(scaled, h200()).value_or(""), "cuda-w4a16");
  EXPECT_FALSE(evaluate(*find_backend("cuda-w4a4"), plain, h200()).ok);
  // Without the flag the cpu backend ignores the scales: bit-equal to the layer without them.
  const int T = 5;
  const std::vector<uint16_t> x = test::random_x(T, 128, 9);
  HostMoeLayer unscaled = L;
  for (auto& m : unscaled.experts) m.gate.input_scale.reset(), m.up.input_scale.reset(), m.down.input_scale.reset();
  unscaled.shared.gate.input_scale.reset();
  EXPECT_EQ(run_cpu(L, false, x, T), run_cpu(unscaled, false, x, T));
  // With it the numbers move (activation quantization is visible) but stay close.
  const std::vector<uint16_t> w4a4 = run_cpu(L, true, x, T), w4a16 = run_cpu(L, false, x, T);
  const double moved = test::nmse_bf16(w4a4, w4a16);
  EXPECT_GT(moved, 1e-5);
  EXPECT_LT(moved, 0.1);
}

// The layer's twin equals route_cpu + moe_experts_w4a4_cpu (+ the shared expert through the same
// reference, as a one-expert stack with weight 1, rounded to bf16) + residual, to the last bit up
// to the combine's summation order.
TEST(MoeLayerW4a4, CpuTwinEqualsTheW4a4Reference) {
  const int H = 128, I = 64, Is = 64, T = 7;
  const RouterParams rp = small_router();
  HostMoeLayer L = test::random_layer(rp, H, I, Is, 21);
  test::add_input_scales(L, 22);
  const MoeLayerWeights w = L.weights();
  const std::vector<uint16_t> x = test::random_x(T, H, 23), res = test::random_x(T, H, 24);
  const std::vector<uint16_t> got = run_cpu(L, true, x, T, &res);

  // Routing as the layer does it.
  const int E = rp.num_experts, K = rp.top_k;
  std::vector<float> logits(size_t(T) * E);  // [T, E]
  router_logits_cpu(x.data(), L.gate.data(), T, H, E, logits.data());
  std::vector<int32_t> ids(size_t(T) * K);   // [T, K]
  std::vector<float> weights(ids.size());    // [T, K]
  route_cpu(logits.data(), L.bias.data(), T, rp, ids.data(), weights.data());
  // Dequantized stacks and per-expert scales.
  std::vector<float> w13(size_t(E) * 2 * I * H), w2(size_t(E) * H * I);  // [E, 2I, H], [E, H, I]
  std::vector<float> s13(static_cast<size_t>(E)), s2(static_cast<size_t>(E));  // [E]
  for (int e = 0; e < E; ++e) {
    dequantize_mlp(w.experts[size_t(e)], H, I, w13.data() + size_t(e) * 2 * I * H,
                   w2.data() + size_t(e) * H * I);
    s13[size_t(e)] = std::max(*L.experts[size_t(e)].gate.input_scale, *L.experts[size_t(e)].up.input_scale);
    s2[size_t(e)] = *L.experts[size_t(e)].down.input_scale;
  }
  const ExpertMlpF32 stack{w13.data(), w2.data(), E, H, I};
  std::vector<float> routed(size_t(T) * H);  // [T, H]
  moe_experts_w4a4_cpu(x.data(), T, ids.data(), weights.data(), K, stack, {s13.data(), s2.data()},
                       routed.data());
  std::vector<float> sw13(size_t(2) * Is * H), sw2(size_t(H) * Is);
  dequantize_mlp(*w.shared, H, Is, sw13.data(), sw2.data());
  const float sh13 = std::max(*L.shared.gate.input_scale, *L.shared.up.input_scale);
  const float sh2 = *L.shared.down.input_scale;
  const std::vector<int32_t> zero(static_cast<size_t>(T), 0);
  const std::vector<float> one(static_cast<size_t>(T), 1.0f);
  std::vector<float> shared(size_t(T) * H);  // [T, H]
  moe_experts_w4a4_cpu(x.data(), T, zero.data(), one.data(), 1, ExpertMlpF32{sw13.data(), sw2.data(), 1, H, Is},
                       {&sh13, &sh2}, shared.data());

  // The layer rounds once after the combine's fixed-order FMA sum; the reference sums plainly:
  // the two may differ by one bf16 ulp where a sum sits on a rounding boundary, rarely.
  size_t equal = 0, off_by_more_than_one_ulp = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float want = routed[i] + bf16_to_float(float_to_bf16(shared[i])) + bf16_to_float(res[i]);
    const float want_bf16 = bf16_to_float(float_to_bf16(want));
    const float g = bf16_to_float(got[i]);
    const float ulp = std::ldexp(1.0f, std::ilogb(std::max(std::fabs(want_bf16), 1e-30f)) - 7);
    equal += g == want_bf16;
    off_by_more_than_one_ulp += std::fabs(g - want_bf16) > ulp * 1.001f;
  }
  EXPECT_EQ(off_by_more_than_one_ulp, 0u);
  EXPECT_GE(double(equal), 0.98 * double(got.size())) << equal << " of " << got.size();
}

// The shared expert without input scales stays W4A16 under W4A4 numerics: the result equals the
// W4A4 routed part plus the W4A16 shared expert, i.e. changing only the shared expert's scales
// changes the output.
TEST(MoeLayerW4a4, SharedExpertWithoutScalesStaysW4a16) {
  HostMoeLayer L = test::random_layer(small_router(), 128, 64, 64, 31);
  test::add_input_scales(L, 32, /*with_shared=*/false);
  EXPECT_FALSE(L.shared.gate.input_scale.has_value());
  const int T = 6;
  const std::vector<uint16_t> x = test::random_x(T, 128, 33);
  const std::vector<uint16_t> mixed = run_cpu(L, true, x, T);  // builds: shared is optional
  HostMoeLayer all = L;
  test::add_input_scales(all, 32, /*with_shared=*/true);  // same routed scales, shared gets some
  for (size_t e = 0; e < L.experts.size(); ++e)
    ASSERT_EQ(*all.experts[e].down.input_scale, *L.experts[e].down.input_scale);
  const std::vector<uint16_t> full = run_cpu(all, true, x, T);
  EXPECT_NE(mixed, full);
  EXPECT_LT(test::nmse_bf16(mixed, full), 0.1);
}

}  // namespace
