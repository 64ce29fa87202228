// RoPE CPU reference: the inv_freq table, hand-worked rotations for both pairings, partial
// rotary dims left alone, NeoX == GPT-J under the dim permutation that maps one pairing onto the
// other, and the relative-position property that makes RoPE what it is.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/rope/rope.h"

namespace tetra::ops {
namespace {

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = float_to_bf16(v[i]);
  return o;
}
std::vector<float> to_float(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = bf16_to_float(v[i]);
  return o;
}
RopeShape one_head(int head_dim, int rotary_dim, RopeStyle style) {
  return RopeShape{head_dim, rotary_dim, 1, 0, head_dim, 0, style};
}

TEST(Rope, InvFreqTable) {
  const auto f = rope_inv_freq(1e6, 64);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[1], 0.64938163f, 1e-7f);  // 10^(-6/32)
  EXPECT_NEAR(f[16], 1e-3f, 1e-10f);      // 1e6^(-1/2)
  EXPECT_THROW(rope_inv_freq(1e4, 7), Error);
}

TEST(Rope, NeoxPairsIWithIPlusHalf) {
  // head_dim 4, theta 1e4: inv_freq = [1, 0.01]; pos 1 turns pair (0,2) by 1 rad, (1,3) by 0.01.
  auto x = to_bf16({1, 1, 0, 0});
  const auto f = rope_inv_freq(1e4, 4);
  const int32_t pos = 1;
  apply_rope_cpu(x.data(), nullptr, &pos, 1, f.data(), one_head(4, 4, RopeStyle::NeoX));
  const auto y = to_float(x);
  EXPECT_NEAR(y[0], std::cos(1.0), 0.004);
  EXPECT_NEAR(y[2], std::sin(1.0), 0.004);
  EXPECT_NEAR(y[1], std::cos(0.01), 0.004);
  EXPECT_NEAR(y[3], std::sin(0.01), 0.0001);
}

TEST(Rope, GptjPairsAdjacentDims) {
  auto x = to_bf16({1, 0, 1, 0});
  const auto f = rope_inv_freq(1e4, 4);
  const int32_t pos = 2;
  apply_rope_cpu(x.data(), nullptr, &pos, 1, f.data(), one_head(4, 4, RopeStyle::GptJ));
  const auto y = to_float(x);
  EXPECT_NEAR(y[0], std::cos(2.0), 0.004);
  EXPECT_NEAR(y[1], std::sin(2.0), 0.004);
  EXPECT_NEAR(y[2], std::cos(0.02), 0.004);
  EXPECT_NEAR(y[3], std::sin(0.02), 0.0002);
}

TEST(Rope, PositionZeroIsIdentityAndPartialDimsPassThrough) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  const int D = 128, R = 64, T = 2;
  RopeShape s{D, R, 3, 2, 3 * D + 5, 2 * D, RopeStyle::NeoX};
  std::vector<float> qf(T * s.q_stride), kf(T * s.k_stride);
  for (auto& v : qf) v = u(rng);
  for (auto& v : kf) v = u(rng);
  auto q = to_bf16(qf), k = to_bf16(kf);
  const auto q0 = q, k0 = k;
  const auto f = rope_inv_freq(1e6, R);
  const int32_t pos[T] = {0, 500};
  apply_rope_cpu(q.data(), k.data(), pos, T, f.data(), s);
  for (int i = 0; i < s.q_stride; ++i) EXPECT_EQ(q[i], q0[i]);  // token 0: position 0
  for (int i = 0; i < s.k_stride; ++i) EXPECT_EQ(k[i], k0[i]);
  int changed = 0;
  for (int h = 0; h < 3; ++h)
    for (int d = 0; d < D; ++d) {
      const size_t i = s.q_stride + h * D + d;
      if (d >= R) EXPECT_EQ(q[i], q0[i]) << "dim " << d << " is past rotary_dim";
      else changed += q[i] != q0[i];
    }
  for (int i = 3 * D; i < s.q_stride; ++i) EXPECT_EQ(q[s.q_stride + i], q0[s.q_stride + i]);
  EXPECT_GT(changed, 3 * R / 2);
}

TEST(Rope, NeoxEqualsGptjOnPermutedDims) {
  // NeoX pair (i, i+R/2) is GPT-J pair (2i, 2i+1) after moving dim i -> 2i, i+R/2 -> 2i+1.
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-1, 1);
  const int D = 64, R = 64;
  std::vector<float> xf(D);
  for (auto& v : xf) v = u(rng);
  std::vector<float> pf(D);
  for (int i = 0; i < R / 2; ++i) pf[2 * i] = xf[i], pf[2 * i + 1] = xf[i + R / 2];
  auto x = to_bf16(xf), p = to_bf16(pf);
  const auto f = rope_inv_freq(1e4, R);
  const int32_t pos = 1234;
  apply_rope_cpu(x.data(), nullptr, &pos, 1, f.data(), one_head(D, R, RopeStyle::NeoX));
  apply_rope_cpu(p.data(), nullptr, &pos, 1, f.data(), one_head(D, R, RopeStyle::GptJ));
  for (int i = 0; i < R / 2; ++i) {
    EXPECT_EQ(x[i], p[2 * i]);
    EXPECT_EQ(x[i + R / 2], p[2 * i + 1]);
  }
}

TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1, 1);
  const int D = 64;
  std::vector<float> qf(D), kf(D);
  for (auto& v : qf) v = u(rng);
  for (auto& v : kf) v = u(rng);
  const auto f = rope_inv_freq(1e4, D);
  auto rotated_dot = [&](int32_t pq, int32_t pk) {
    auto q = to_bf16(qf), k = to_bf16(kf);
    apply_rope_cpu(q.data(), nullptr, &pq, 1, f.data(), one_head(D, D, RopeStyle::NeoX));
    apply_rope_cpu(k.data(), nullptr, &pk, 1, f.data(), one_head(D, D, RopeStyle::NeoX));
    double d = 0;
    for (int i = 0; i < D; ++i) d += double(bf16_to_float(q[i])) * bf16_to_float(k[i]);
    return d;
  };
  const double a = rotated_dot(10, 3), b = rotated_dot(107, 100), c = rotated_dot(3, 10);
  EXPECT_NEAR(a, b, 0.05);
  EXPECT_GT(std::abs(a - c), 0.05) << "the dot product should see the sign of the offset";
}

TEST(Rope, RefusesBadShapesAndPositions) {
  std::vector<uint16_t> x(64);
  const auto f = rope_inv_freq(1e4, 64);
  const int32_t neg = -1;
  EXPECT_THROW(apply_rope_cpu(x.data(), nullptr, &neg, 1, f.data(), one_head(64, 64, RopeStyle::NeoX)),
               Error);
  EXPECT_THROW(check_rope_shape(one_head(64, 66, RopeStyle::NeoX)), Error);
  EXPECT_THROW(check_rope_shape(RopeShape{64, 64, 2, 0, 100, 0, RopeStyle::NeoX}), Error);
}

// YaRN at DeepSeek-V3's rotary shape (64 dims, theta 1e4, 4096 original positions, factor
// 40, beta 32 / 1): the ramp's ends are dim indices floor(64 ln(4096 / (32 * 2 pi)) / (2 ln 1e4))
// = 10 and ceil(64 ln(4096 / (2 pi)) / (2 ln 1e4)) = 23, worked out by hand. Below 10 the
// frequencies stay, from 23 on they are divided by the factor, in between they fall
// monotonically from one to the other.
TEST(Rope, YarnKeepsHighAndInterpolatesLowFrequencies) {
  ops::YarnParams y;
  y.factor = 40;
  y.original_max_position = 4096;
  const std::vector<float> plain = ops::rope_inv_freq(10000.0, 64);
  const std::vector<float> yarn = ops::rope_yarn_inv_freq(10000.0, 64, y);
  ASSERT_EQ(yarn.size(), 32u);
  for (int i = 0; i <= 10; ++i) EXPECT_EQ(yarn[size_t(i)], plain[size_t(i)]) << i;
  for (int i = 23; i < 32; ++i) EXPECT_FLOAT_EQ(yarn[size_t(i)], plain[size_t(i)] / 40.0f) << i;
  for (int i = 11; i < 23; ++i) {
    // ratio yarn / plain goes from 1 towards 1/40 along the ramp
    const double r = double(yarn[size_t(i)]) / plain[size_t(i)];
    const double prev = double(yarn[size_t(i - 1)]) / plain[size_t(i - 1)];
    EXPECT_LT(r, prev) << i;
    EXPECT_NEAR(r, 1.0 - (i - 10) / 13.0 * (1.0 - 1.0 / 40.0), 1e-6) << i;
  }
  EXPECT_DOUBLE_EQ(ops::yarn_mscale(40, 1.0), 0.1 * std::log(40.0) + 1.0);
  EXPECT_DOUBLE_EQ(ops::yarn_mscale(0.5, 1.0), 1.0);
  y.factor = 0;
  EXPECT_THROW(ops::rope_yarn_inv_freq(10000.0, 64, y), Error);
}

}  // namespace
}  // namespace tetra::ops
