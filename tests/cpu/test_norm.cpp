// RMSNorm CPU reference: a hand-worked example, properties (unit RMS, scale invariance), the
// fused residual variant against its two-step definition, and per-head norm inside a strided
// buffer leaving the neighbouring elements alone.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/norm/rms_norm.h"

namespace tetra::ops {
namespace {

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float lo = -2.0f, float hi = 2.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

TEST(RmsNorm, HandWorkedExample) {
  // x = [3, 4]: mean square 12.5, rms 3.5355339; w = [1, 2] -> [0.8485281, 2.2627417]
  const std::vector<uint16_t> x = {float_to_bf16(3.0f), float_to_bf16(4.0f)};
  const std::vector<uint16_t> w = {float_to_bf16(1.0f), float_to_bf16(2.0f)};
  std::vector<uint16_t> y(2);
  rms_norm_cpu(x.data(), w.data(), 1, 2, 0.0f, y.data());
  EXPECT_NEAR(bf16_to_float(y[0]), 0.8485281f, 0.004f);
  EXPECT_NEAR(bf16_to_float(y[1]), 2.2627417f, 0.01f);
}

TEST(RmsNorm, EpsIsAddedToMeanSquare) {
  // x = [1, 1], eps = 3: 1 / sqrt(1 + 3) = 0.5
  const std::vector<uint16_t> x = {float_to_bf16(1.0f), float_to_bf16(1.0f)};
  const std::vector<uint16_t> w = {float_to_bf16(1.0f), float_to_bf16(1.0f)};
  std::vector<uint16_t> y(2);
  rms_norm_cpu(x.data(), w.data(), 1, 2, 3.0f, y.data());
  EXPECT_EQ(bf16_to_float(y[0]), 0.5f);
  EXPECT_EQ(bf16_to_float(y[1]), 0.5f);
}

TEST(RmsNorm, UnitWeightGivesUnitRmsAndIsScaleInvariant) {
  std::mt19937 rng(1);
  const int T = 7, H = 333;
  auto x = random_bf16(size_t(T) * H, rng);
  std::vector<uint16_t> w(H, float_to_bf16(1.0f)), y(x.size()), y4(x.size()), x4(x.size());
  for (size_t i = 0; i < x.size(); ++i) x4[i] = float_to_bf16(4.0f * bf16_to_float(x[i]));  // exact
  rms_norm_cpu(x.data(), w.data(), T, H, 0.0f, y.data());
  rms_norm_cpu(x4.data(), w.data(), T, H, 0.0f, y4.data());
  for (int t = 0; t < T; ++t) {
    double ss = 0;
    for (int i = 0; i < H; ++i) ss += std::pow(bf16_to_float(y[size_t(t) * H + i]), 2);
    EXPECT_NEAR(std::sqrt(ss / H), 1.0, 0.01) << "row " << t;
  }
  EXPECT_EQ(y, y4);  // power-of-two scaling is exact, so the outputs are identical
}

TEST(RmsNorm, MatchesIndependentDoubleComputation) {
  std::mt19937 rng(2);
  const int T = 5, H = 129;
  const float eps = 1e-5f;
  auto x = random_bf16(size_t(T) * H, rng);
  auto w = random_bf16(H, rng, 0.5f, 1.5f);
  std::vector<uint16_t> y(x.size());
  rms_norm_cpu(x.data(), w.data(), T, H, eps, y.data());
  for (int t = 0; t < T; ++t) {
    double ms = 0;
    for (int i = 0; i < H; ++i) ms += std::pow(double(bf16_to_float(x[t * H + i])), 2) / H;
    for (int i = 0; i < H; ++i) {
      const double want = bf16_to_float(x[t * H + i]) / std::sqrt(ms + eps) * bf16_to_float(w[i]);
      EXPECT_NEAR(bf16_to_float(y[t * H + i]), want, std::abs(want) * 0.008 + 1e-6);
    }
  }
}

TEST(RmsNorm, OutputMayAliasInput) {
  std::mt19937 rng(3);
  auto x = random_bf16(3 * 64, rng);
  auto w = random_bf16(64, rng);
  std::vector<uint16_t> y(x.size());
  rms_norm_cpu(x.data(), w.data(), 3, 64, 1e-6f, y.data());
  rms_norm_cpu(x.data(), w.data(), 3, 64, 1e-6f, x.data());
  EXPECT_EQ(x, y);
}

TEST(FusedAddRmsNorm, EqualsAddThenNorm) {
  std::mt19937 rng(4);
  const int T = 6, H = 200;
  auto x = random_bf16(size_t(T) * H, rng);
  auto res = random_bf16(x.size(), rng);
  auto w = random_bf16(H, rng);
  std::vector<uint16_t> sum(x.size()), want(x.size()), out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    sum[i] = float_to_bf16(bf16_to_float(x[i]) + bf16_to_float(res[i]));
  rms_norm_cpu(sum.data(), w.data(), T, H, 1e-5f, want.data());
  fused_add_rms_norm_cpu(x.data(), res.data(), w.data(), T, H, 1e-5f, out.data());
  EXPECT_EQ(res, sum);  // the residual stream now holds x + residual
  EXPECT_EQ(out, want);
}

TEST(HeadRmsNorm, NormalisesEachHeadInsideAStridedBuffer) {
  std::mt19937 rng(5);
  const int T = 3, heads = 4, D = 64, stride = heads * D + 50;  // 50 foreign elements per token
  auto buf = random_bf16(size_t(T) * stride, rng);
  const auto before = buf;
  auto w = random_bf16(D, rng, 0.5f, 1.5f);
  head_rms_norm_cpu(buf.data(), T, heads, D, stride, w.data(), 1e-6f);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < heads; ++h) {
      std::vector<uint16_t> want(D);
      rms_norm_cpu(before.data() + t * stride + h * D, w.data(), 1, D, 1e-6f, want.data());
      for (int i = 0; i < D; ++i) EXPECT_EQ(buf[t * stride + h * D + i], want[i]);
    }
    for (int i = heads * D; i < stride; ++i) EXPECT_EQ(buf[t * stride + i], before[t * stride + i]);
  }
}

TEST(HeadRmsNorm, RefusesAStrideShorterThanTheHeads) {
  std::vector<uint16_t> buf(1024), w(64);
  EXPECT_THROW(head_rms_norm_cpu(buf.data(), 2, 4, 64, 200, w.data(), 1e-6f), Error);
}

}  // namespace
}  // namespace tetra::ops
