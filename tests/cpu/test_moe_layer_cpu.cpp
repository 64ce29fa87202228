// The cpu MoE layer runner against the float32 reference layer (moe_reference.h, written
// independently) and against double loops written here; the runner's checks and refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "cpu/moe_layer_fixture.h"
#include "format/nvfp4.h"
#include "moe/moe_layer.h"
#include "moe/moe_reference.h"
#include "perf/gpu_spec.h"

using namespace tetra;
using namespace tetra::moe;
using tetra::test::HostMoeLayer;

namespace {

Target no_gpu() {
  Target t;
  t.host_memory_bytes = int64_t(64) << 30;
  return t;
}

std::unique_ptr<MoeLayerRunner> cpu_runner(const HostMoeLayer& L, int max_tokens) {
  MoeLayerOptions o;
  o.backend = "cpu";
  o.max_tokens = max_tokens;
  o.target = no_gpu();
  return make_moe_layer(L.weights(), o);
}

std::vector<float> deq(const test::HostMatrix& m, ExpertFormat f) {
  std::vector<float> out(size_t(m.n) * m.k);  // [n, k]
  if (f == ExpertFormat::NVFP4)
    nvfp4::dequantize_weight(m.weight.data(), m.scale.data(), m.s2, m.n, m.k, out.data());
  else
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(m.bf16[i]);
  return out;
}

// The layer in the reference's float32 form (owning the arrays).
struct RefLayer {
  std::vector<float> gate, w13, w2, sw13, sw2;
  MoeLayerF32 layer;
};

RefLayer to_reference(const HostMoeLayer& L) {
  RefLayer r;
  const int E = L.router.num_experts, H = L.hidden, I = L.inter, Is = L.shared_inter;
  for (uint16_t g : L.gate) r.gate.push_back(bf16_to_float(g));
  for (int e = 0; e < E; ++e) {
    for (const auto* m : {&L.experts[size_t(e)].gate, &L.experts[size_t(e)].up}) {
      const std::vector<float> d = deq(*m, L.format);
      r.w13.insert(r.w13.end(), d.begin(), d.end());
    }
    const std::vector<float> d = deq(L.experts[size_t(e)].down, L.format);
    r.w2.insert(r.w2.end(), d.begin(), d.end());
  }
  if (Is > 0) {
    for (const auto* m : {&L.shared.gate, &L.shared.up}) {
      const std::vector<float> d = deq(*m, L.shared_format);
      r.sw13.insert(r.sw13.end(), d.begin(), d.end());
    }
    r.sw2 = deq(L.shared.down, L.shared_format);
  }
  r.layer.gate = r.gate.data();
  r.layer.bias = L.bias.empty() ? nullptr : L.bias.data();
  r.layer.router = L.router;
  r.layer.experts = ExpertMlpF32{r.w13.data(), r.w2.data(), E, H, I};
  if (Is > 0) r.layer.shared = ExpertMlpF32{r.sw13.data(), r.sw2.data(), 1, H, Is};
  return r;
}

std::vector<uint16_t> reference_out(const HostMoeLayer& L, const std::vector<uint16_t>& x, int T) {
  const RefLayer r = to_reference(L);
  std::vector<float> xf(x.size()), out(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_float(x[i]);
  moe_layer_cpu(xf.data(), T, r.layer, out.data());
  std::vector<uint16_t> o(out.size());
  for (size_t i = 0; i < o.size(); ++i) o[i] = float_to_bf16(out[i]);
  return o;
}

bool all_finite(const std::vector<uint16_t>& v) {
  for (uint16_t b : v)
    if (!std::isfinite(bf16_to_float(b))) return false;
  return true;
}

TEST(MoeLayerCpu, MatchesTheFloatReferenceOnEveryTinyPreset) {
  for (const std::string preset : {"tiny-glm5", "tiny-glm4.5-air", "tiny-glm4.7",
                                   "tiny-deepseek-v3", "tiny-qwen3-30b-a3b"}) {
    SCOPED_TRACE(preset);
    const ModelConfig c = preset_config(preset);
    const int H = int(c.hidden_size), I = int(c.moe_intermediate_size);
    const int Is = int(c.n_shared_experts * c.moe_intermediate_size);
    const HostMoeLayer L = test::random_layer(router_params_of(c), H, I, Is, 11,
                                              c.routing.has_correction_bias);
    auto runner = cpu_runner(L, 64);
    EXPECT_EQ(runner->backend(), "cpu");
    EXPECT_FALSE(runner->on_device());
    for (int T : {1, 7, 64}) {
      const std::vector<uint16_t> x = test::random_x(T, H, 100 + T);
      std::vector<uint16_t> out(x.size(), 0xffff);
      runner->forward(x.data(), T, out.data(), nullptr, nullptr);
      ASSERT_TRUE(all_finite(out));
      // The reference keeps the intermediate and the shared output in float: the runner's three
      // extra bf16 roundings (intermediate, shared output, and the output's against the
      // reference's own) measure 3e-6..1.1e-5 here; a wrong expert or weight gives ~1.
      const double e = test::nmse_bf16(out, reference_out(L, x, T));
      std::printf("  %-20s T=%-3d nmse vs float reference %.3g\n", preset.c_str(), T, e);
      EXPECT_LE(e, 3e-5) << "T=" << T;
      EXPECT_GT(e, 0.0) << "T=" << T << ": bf16 rounding of the intermediate must show";
    }
  }
}

TEST(MoeLayerCpu, Bf16ExpertsMatchTheReference) {
  RouterParams rp;
  rp.scoring = Scoring::Softmax;
  rp.num_experts = 8;
  rp.top_k = 2;
  const HostMoeLayer L = test::random_layer(rp, 64, 128, 0, 3, false, ExpertFormat::BF16);
  auto runner = cpu_runner(L, 5);
  const std::vector<uint16_t> x = test::random_x(5, 64, 4);
  std::vector<uint16_t> out(x.size());
  runner->forward(x.data(), 5, out.data(), nullptr, nullptr);
  EXPECT_LE(test::nmse_bf16(out, reference_out(L, x, 5)), 1e-5);
}

TEST(MoeLayerCpu, Nvfp4ExpertsWithABf16SharedExpert) {
  const ModelConfig c = preset_config("tiny-glm5");
  const HostMoeLayer L = test::random_layer(router_params_of(c), 64, 64, 64, 8, true,
                                            ExpertFormat::NVFP4, ExpertFormat::BF16);
  ASSERT_TRUE(L.weights().shared.has_value());
  EXPECT_EQ(L.weights().shared->format, ExpertFormat::BF16);
  auto runner = cpu_runner(L, 6);
  const std::vector<uint16_t> x = test::random_x(6, 64, 9);
  std::vector<uint16_t> out(x.size());
  runner->forward(x.data(), 6, out.data(), nullptr, nullptr);
  EXPECT_LE(test::nmse_bf16(out, reference_out(L, x, 6)), 3e-5);
}

// One expert, top-1, weight 1: out = Expert(x). A double loop that rounds the intermediate to bf16
// agrees far more closely than one that does not (the header's promise).
TEST(MoeLayerCpu, IntermediateIsRoundedToBf16LikeTheGpu) {
  RouterParams rp;
  rp.num_experts = 1;
  rp.top_k = 1;
  const int H = 128, I = 192, T = 16;
  const HostMoeLayer L = test::random_layer(rp, H, I, 0, 5, false);
  auto runner = cpu_runner(L, T);
  const std::vector<uint16_t> x = test::random_x(T, H, 6);
  std::vector<uint16_t> out(x.size());
  runner->forward(x.data(), T, out.data(), nullptr, nullptr);
  const std::vector<float> g = deq(L.experts[0].gate, L.format), u = deq(L.experts[0].up, L.format),
                           d = deq(L.experts[0].down, L.format);
  std::vector<uint16_t> rounded(x.size()), unrounded(x.size());
  for (int t = 0; t < T; ++t) {
    std::vector<double> a_r(I), a_u(I);
    for (int i = 0; i < I; ++i) {
      double gs = 0, us = 0;
      for (int h = 0; h < H; ++h) {
        const double xv = bf16_to_float(x[size_t(t) * H + h]);
        gs += g[size_t(i) * H + h] * xv;
        us += u[size_t(i) * H + h] * xv;
      }
      a_u[i] = gs / (1.0 + std::exp(-gs)) * us;
      a_r[i] = bf16_to_float(float_to_bf16(float(a_u[i])));
    }
    for (int h = 0; h < H; ++h) {
      double yr = 0, yu = 0;
      for (int i = 0; i < I; ++i) yr += d[size_t(h) * I + i] * a_r[i], yu += d[size_t(h) * I + i] * a_u[i];
      rounded[size_t(t) * H + h] = float_to_bf16(float(yr));
      unrounded[size_t(t) * H + h] = float_to_bf16(float(yu));
    }
  }
  const double e_r = test::nmse_bf16(out, rounded), e_u = test::nmse_bf16(out, unrounded);
  EXPECT_LE(e_r, 1e-9);
  EXPECT_GT(e_u, 10 * e_r + 1e-9);
}

TEST(MoeLayerCpu, SharedExpertAndResidualAreAddedUnweighted) {
  const ModelConfig c = preset_config("tiny-glm4.5-air");
  RouterParams rp = router_params_of(c);
  rp.routed_scaling_factor = 2.5f;  // the shared expert must not be scaled by it
  const int H = 64, T = 9;
  HostMoeLayer with = test::random_layer(rp, H, 64, 64, 21);
  HostMoeLayer without = with;
  without.shared_inter = 0;
  const std::vector<uint16_t> x = test::random_x(T, H, 22), res = test::random_x(T, H, 23);
  std::vector<uint16_t> a(x.size()), b(x.size()), c_out(x.size());
  cpu_runner(with, T)->forward(x.data(), T, a.data(), res.data(), nullptr);
  cpu_runner(without, T)->forward(x.data(), T, b.data(), nullptr, nullptr);
  // The shared MLP alone: a one-expert, top-1 layer of the shared weights (weight 1).
  RouterParams one;
  one.num_experts = 1;
  one.top_k = 1;
  HostMoeLayer shared_only = with;
  shared_only.router = one;
  shared_only.inter = 64;
  shared_only.experts = {with.shared};
  shared_only.shared_inter = 0;
  shared_only.bias.clear();
  shared_only.gate.resize(size_t(H));
  cpu_runner(shared_only, T)->forward(x.data(), T, c_out.data(), nullptr, nullptr);
  std::vector<uint16_t> sum(x.size());
  for (size_t i = 0; i < sum.size(); ++i)
    sum[i] = float_to_bf16(bf16_to_float(b[i]) + bf16_to_float(c_out[i]) + bf16_to_float(res[i]));
  EXPECT_LE(test::nmse_bf16(a, sum), 1e-5);
  EXPECT_GT(test::nmse_bf16(a, b), 1e-2);  // the shared expert and residual are not small
}

TEST(MoeLayerCpu, ZeroTokensWritesNothing) {
  RouterParams rp;
  rp.num_experts = 4;
  rp.top_k = 2;
  const HostMoeLayer L = test::random_layer(rp, 64, 64, 0, 1);
  std::vector<uint16_t> out(64, 0x1234);
  cpu_runner(L, 4)->forward(nullptr, 0, out.data(), nullptr, nullptr);
  for (uint16_t v : out) EXPECT_EQ(v, 0x1234);
}

std::string error_of(const MoeLayerWeights& w, const MoeLayerOptions& o) {
  try {
    make_moe_layer(w, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MoeLayerCpu, BadWeightsAreRefusedNamingTheTensor) {
  RouterParams rp;
  rp.num_experts = 4;
  rp.top_k = 2;
  HostMoeLayer L = test::random_layer(rp, 64, 64, 64, 1);
  MoeLayerOptions o;
  o.backend = "cpu";
  o.max_tokens = 4;
  o.target = no_gpu();

  MoeLayerWeights w = L.weights();
  w.experts[3].down.k = 32;
  std::string msg = error_of(w, o);
  EXPECT_NE(msg.find("model.layers.1.mlp.experts.3.down_proj"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected [64, 64]"), std::string::npos) << msg;

  w = L.weights();
  w.experts.push_back(w.experts[0]);  // 5 experts for a router of 4 (3 would be an EP block)
  msg = error_of(w, o);
  EXPECT_NE(msg.find("routed experts 0..4 given, the router has 4"), std::string::npos) << msg;

  w = L.weights();
  w.shared->up.scale = nullptr;
  msg = error_of(w, o);
  EXPECT_NE(msg.find("shared_experts.up_proj: NVFP4 weight or weight_scale is missing"),
            std::string::npos) << msg;

  w = L.weights();
  w.gate = nullptr;
  msg = error_of(w, o);
  EXPECT_NE(msg.find("model.layers.1.mlp.gate.weight"), std::string::npos) << msg;

  w = L.weights();
  w.router.top_k = 5;
  EXPECT_NE(error_of(w, o).find("model.layers.1.mlp"), std::string::npos);

  o.max_tokens = 0;
  EXPECT_NE(error_of(L.weights(), o).find("max_tokens must be positive"), std::string::npos);
}

TEST(MoeLayerCpu, TooManyTokensIsAnError) {
  RouterParams rp;
  rp.num_experts = 4;
  rp.top_k = 1;
  const HostMoeLayer L = test::random_layer(rp, 64, 64, 0, 1);
  const std::vector<uint16_t> x = test::random_x(3, 64, 1);
  std::vector<uint16_t> out(x.size());
  auto runner = cpu_runner(L, 2);
  try {
    runner->forward(x.data(), 3, out.data(), nullptr, nullptr);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built for 0..2"), std::string::npos) << e.what();
  }
}

TEST(MoeLayerCpu, BackendChoiceUsesTheDeclarations) {
  RouterParams rp;
  rp.num_experts = 4;
  rp.top_k = 2;
  HostMoeLayer L = test::random_layer(rp, 64, 64, 0, 1);
  MoeLayerOptions o;
  o.max_tokens = 4;
  o.target = no_gpu();
  o.backend = "auto";
  EXPECT_EQ(make_moe_layer(L.weights(), o)->backend(), "cpu");  // no GPU: the reference
  o.backend = "cuda-w4a16";
  std::string msg = error_of(L.weights(), o);
  EXPECT_NE(msg.find("no CUDA GPU on this machine"), std::string::npos) << msg;
  o.backend = "cuda-bf16";
  msg = error_of(L.weights(), o);
  EXPECT_NE(msg.find("takes BF16 expert weights; the checkpoint's experts are W4A16_NVFP4"),
            std::string::npos) << msg;
  o.backend = "trtllm-gen-fp4-sm100";
  msg = error_of(L.weights(), o);
  EXPECT_NE(msg.find("not built in this version"), std::string::npos) << msg;
  o.backend = "nope";
  msg = error_of(L.weights(), o);
  EXPECT_NE(msg.find("unknown MoE backend 'nope'"), std::string::npos) << msg;
  // On an H200 (from the table) the GEMMs' 64-wide k chunk refuses an intermediate of 32,
  // before any CUDA call.
  Target h200;
  h200.gpu = gpu_spec("h200");
  o.target = h200;
  o.backend = "cuda-w4a16";
  HostMoeLayer narrow = test::random_layer(rp, 64, 32, 0, 2);
  msg = error_of(narrow.weights(), o);
  EXPECT_NE(msg.find("moe intermediate per GPU 32 is not a multiple of 64"), std::string::npos)
      << msg;
  // A BF16 layer is not cuda-w4a16's format.
  HostMoeLayer bf = test::random_layer(rp, 64, 64, 0, 3, false, ExpertFormat::BF16);
  msg = error_of(bf.weights(), o);
  EXPECT_NE(msg.find("takes NVFP4 expert weights"), std::string::npos) << msg;
}

}  // namespace
