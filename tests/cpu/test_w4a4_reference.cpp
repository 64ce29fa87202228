// The W4A4 CPU twin (moe/w4a4_reference.h) and the input-scale helpers (moe/w4a4_scales.h).
// Expected values come from the E2M1/E4M3 tables written out here, not from the code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "moe/moe_reference.h"
#include "moe/w4a4_reference.h"
#include "moe/w4a4_scales.h"

namespace tetra {
namespace {

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float f : v) out.push_back(float_to_bf16(f));
  return out;
}

TEST(W4a4Reference, QuantizeRowsOfExactValuesIsIdentity) {
  // A block whose max is 6 * SF * s with SF = 2.0 (an E4M3 value): SF comes out exactly 2, so
  // every element that is an E2M1 value times 2 * s round-trips; the unscaled result is x / s.
  const float s = 0.25f;
  const std::vector<float> mags = {6, 4, 3, 2, 1.5f, 1, 0.5f, 0, -6, -4, -3, -2, -1.5f, -1, -0.5f, 0};
  std::vector<float> x;
  for (float v : mags) x.push_back(v * 2.0f * s);
  std::vector<float> out(16);
  moe::w4a4_quantize_rows_cpu(to_bf16(x).data(), 1, 16, s, out.data());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[size_t(i)], mags[size_t(i)] * 2.0f) << i;
}

TEST(W4a4Reference, QuantizeRowsRoundsToNearestE2M1) {
  // Block max 6 with s = 1: SF = 1. Values between E2M1 points round to the nearest one
  // (ties to the even code): 2.6 -> 3, 2.4 -> 2, 5.5 -> 6, 0.2 -> 0, 0.75 -> 1 (tie, even code 2).
  const std::vector<float> x = {6, 2.625f, 2.375f, 5.5f, 0.203125f, 0.75f, 1.25f, -3.75f,
                                0, 0, 0, 0, 0, 0, 0, 0};
  const std::vector<float> want = {6, 3, 2, 6, 0, 1, 1, -4, 0, 0, 0, 0, 0, 0, 0, 0};
  std::vector<float> out(16);
  moe::w4a4_quantize_rows_cpu(to_bf16(x).data(), 1, 16, 1.0f, out.data());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[size_t(i)], want[size_t(i)]) << i << " x=" << x[size_t(i)];
}

TEST(W4a4Reference, BlockScaleSaturatesAt448) {
  // max 6000 with s = 1: SF would be 1000, E4M3 saturates at 448, so 6000 -> 6 * 448 = 2688.
  std::vector<float> x(16, 0.0f);
  x[0] = 6000.0f;
  x[1] = -448.0f;  // 448 / 448 = 1 -> 1 * 448
  std::vector<float> out(16);
  moe::w4a4_quantize_rows_cpu(to_bf16(x).data(), 1, 16, 1.0f, out.data());
  EXPECT_EQ(out[0], 2688.0f);
  EXPECT_EQ(out[1], -448.0f);
}

// A tiny expert stack with fixed random weights.
struct Tiny {
  int E = 2, H = 32, I = 16;
  std::vector<float> w13, w2;
  Tiny() {
    std::mt19937 rng(5);
    std::normal_distribution<float> d(0.0f, 0.2f);
    w13.resize(size_t(E) * 2 * I * H);
    w2.resize(size_t(E) * H * I);
    for (auto& v : w13) v = d(rng);
    for (auto& v : w2) v = d(rng);
  }
  moe::ExpertMlpF32 mlp() const { return {w13.data(), w2.data(), E, H, I}; }
};

TEST(W4a4Reference, ScalingInputAndScaleByPowerOfTwoChangesNothing) {
  // act * 4 with input_scale * 4 gives the same codes and block scales (powers of two commute
  // with every rounding), so the same unscaled values, and GEMM2's output is exactly 4x.
  const Tiny t;
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> a(size_t(t.I));
  for (auto& v : a) v = d(rng);
  std::vector<float> a4;
  for (float v : a) a4.push_back(v * 4.0f);
  std::vector<float> q1(size_t(t.I)), q4(size_t(t.I));
  moe::w4a4_quantize_rows_cpu(to_bf16(a).data(), 1, t.I, 0.01f, q1.data());
  moe::w4a4_quantize_rows_cpu(to_bf16(a4).data(), 1, t.I, 0.04f, q4.data());
  EXPECT_EQ(q1, q4);
  std::vector<float> y1(size_t(t.H)), y4(size_t(t.H));
  moe::w4a4_gemm2_row_cpu(t.mlp(), 1, q1.data(), 0.01f, y1.data());
  moe::w4a4_gemm2_row_cpu(t.mlp(), 1, q4.data(), 0.04f, y4.data());
  for (int h = 0; h < t.H; ++h) EXPECT_EQ(y4[size_t(h)], 4.0f * y1[size_t(h)]) << h;
}

TEST(W4a4Reference, ExpertsPassIsCloseToFloatButNotEqual) {
  // FP4 activations change the result by a few percent: close to the float reference, yet
  // measurably different (so quantization really happened), and weighted like moe_experts_cpu.
  const Tiny t;
  const int T = 6, top_k = 2;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> xf(size_t(T) * t.H);
  for (auto& v : xf) v = bf16_to_float(float_to_bf16(d(rng)));
  const std::vector<uint16_t> xb = to_bf16(xf);
  const std::vector<int32_t> ids = {0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0};
  const std::vector<float> wts = {0.7f, 0.3f, 0.5f, 0.5f, 1.0f, 0.25f, 0.1f, 0.9f, 0.6f, 0.4f, 0.2f, 0.8f};
  const float is13[2] = {5.0f / 2688.0f, 3.0f / 2688.0f};
  const float is2[2] = {8.0f / 2688.0f, 6.0f / 2688.0f};  // calibrated: act amax ~ 6..8
  std::vector<float> got(size_t(T) * t.H), ref(size_t(T) * t.H);
  moe::moe_experts_w4a4_cpu(xb.data(), T, ids.data(), wts.data(), top_k, t.mlp(), {is13, is2},
                            got.data());
  moe::moe_experts_cpu(xf.data(), T, ids.data(), wts.data(), top_k, t.mlp(), ref.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += double(got[i] - ref[i]) * (got[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  EXPECT_LT(num / den, 0.1);
  EXPECT_GT(num / den, 1e-5);

  // Token 0 by hand from the row functions: 0.7 * E0 + 0.3 * E1.
  std::vector<float> act(size_t(t.I)), y0(size_t(t.H)), y1(size_t(t.H));
  moe::w4a4_gemm1_row_cpu(t.mlp(), 0, xb.data(), is13[0], is2[0], act.data());
  moe::w4a4_gemm2_row_cpu(t.mlp(), 0, act.data(), is2[0], y0.data());
  moe::w4a4_gemm1_row_cpu(t.mlp(), 1, xb.data(), is13[1], is2[1], act.data());
  moe::w4a4_gemm2_row_cpu(t.mlp(), 1, act.data(), is2[1], y1.data());
  for (int h = 0; h < t.H; ++h)
    EXPECT_NEAR(got[size_t(h)], 0.7f * y0[size_t(h)] + 0.3f * y1[size_t(h)], 1e-5f) << h;
}

TEST(W4a4Reference, BadExpertIdIsRefused) {
  const Tiny t;
  const std::vector<uint16_t> x(size_t(t.H), 0);
  const int32_t ids[1] = {2};
  const float w[1] = {1.0f}, s[2] = {1.0f, 1.0f};
  std::vector<float> out(size_t(t.H));
  EXPECT_THROW(moe::moe_experts_w4a4_cpu(x.data(), 1, ids, w, 1, t.mlp(), {s, s}, out.data()),
               Error);
}

TEST(W4a4Scales, GateUpScaleIsTheMaxAndBadScalesNameTheTensor) {
  EXPECT_EQ(w4a4_gate_up_input_scale(0.5f, 0.25f, "experts.3"), 0.5f);
  EXPECT_EQ(w4a4_gate_up_input_scale(0.125f, 0.25f, "experts.3"), 0.25f);
  try {
    w4a4_gate_up_input_scale(0.5f, -1.0f, "layers.2.mlp.experts.3");
    FAIL() << "negative scale accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.2.mlp.experts.3.up_proj.input_scale"),
              std::string::npos) << e.what();
  }
  EXPECT_THROW(check_input_scale(std::numeric_limits<float>::quiet_NaN(), "x"), Error);
  EXPECT_THROW(check_input_scale(0.0f, "x"), Error);
  EXPECT_THROW(check_input_scale(1e-40f, "x"), Error);  // 1/x overflows
  EXPECT_NO_THROW(check_input_scale(1e-30f, "x"));
}

TEST(W4a4Scales, FoldMultipliesEachExpertsAlphas) {
  PackedMoeLayer layer = make_packed_moe_layer(2, 64, 64);
  layer.alpha_gate = {1.0f, 2.0f};
  layer.alpha_up = {3.0f, 4.0f};
  layer.alpha_down = {5.0f, 6.0f};
  fold_w4a4_input_scales(layer, {0.5f, 0.25f}, {2.0f, 0.125f});
  EXPECT_EQ(layer.alpha_gate, (std::vector<float>{0.5f, 0.5f}));
  EXPECT_EQ(layer.alpha_up, (std::vector<float>{1.5f, 1.0f}));
  EXPECT_EQ(layer.alpha_down, (std::vector<float>{10.0f, 0.75f}));
  EXPECT_THROW(fold_w4a4_input_scales(layer, {0.5f}, {1.0f, 1.0f}), Error);
  EXPECT_THROW(fold_w4a4_input_scales(layer, {0.5f, 0.0f}, {1.0f, 1.0f}), Error);
}

}  // namespace
}  // namespace tetra
