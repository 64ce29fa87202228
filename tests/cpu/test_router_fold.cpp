// The router fold's host twin (moe/router_fold.h), which the GPU tests hold o_proj's epilogue and
// GEMM1 to: the tile layout against the router weight and norm weight it was built from, and the
// folded logits against the reference's order (rms_norm, then the router on the normalised row)
// computed here in double: equal up to the bf16 rounding the reference applies to the
// normalised row (a relative 2^-8 per element), far from the error of a wrong tile, expert or
// scale. Also the sums of a row that is all zero but one element (exact).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "moe/router_fold.h"

namespace tetra::moe {
namespace {

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

TEST(RouterFold, TilesHoldTheNormWeightThenEachExpertsColumns) {
  std::mt19937 rng(3);
  const int E = 5, H = 48;
  const auto W = random_bf16(size_t(E) * H, rng, -1, 1), g = random_bf16(H, rng, 0.5f, 2);
  const std::vector<uint8_t> tiles = router_fold_tiles(W.data(), g.data(), E, H);
  const size_t tb = router_fold_tile_bytes(E);
  ASSERT_EQ(tb, 32 + size_t(E) * 32);
  ASSERT_EQ(tiles.size(), tb * (H / kRouterFoldTile));
  for (int t = 0; t < H / kRouterFoldTile; ++t)
    for (int j = 0; j < kRouterFoldTile; ++j) {
      const int i = t * kRouterFoldTile + j;
      uint16_t v;
      std::memcpy(&v, tiles.data() + t * tb + 2 * j, 2);
      EXPECT_EQ(v, g[size_t(i)]) << "tile " << t << " g " << j;
      for (int e = 0; e < E; ++e) {
        std::memcpy(&v, tiles.data() + t * tb + 32 + (size_t(e) * kRouterFoldTile + j) * 2, 2);
        EXPECT_EQ(v, W[size_t(e) * H + i]) << "tile " << t << " expert " << e << " col " << j;
      }
    }
}

TEST(RouterFold, LogitsMatchNormThenRouterUpToTheNormalisedRowsRounding) {
  std::mt19937 rng(5);
  for (const auto [E, H] : {std::pair{128, 4096}, std::pair{7, 64}, std::pair{160, 5120}}) {
    const auto W = random_bf16(size_t(E) * H, rng, -0.05f, 0.05f);
    const auto g = random_bf16(H, rng, 0.2f, 3.0f);
    const auto h = random_bf16(H, rng, -20.0f, 20.0f);
    const float eps = 1e-5f;
    std::vector<double> sums;
    std::vector<uint16_t> gx;
    router_fold_sums(router_fold_tiles(W.data(), g.data(), E, H), h.data(), E, H, sums, gx);
    // The reference: inv_rms in f32 from the mean square, x' = bf16(g * bf16(h * inv_rms)).
    double ss = 0;
    for (int i = 0; i < H; ++i) ss += double(bf16_to_float(h[size_t(i)])) * bf16_to_float(h[size_t(i)]);
    EXPECT_NEAR(sums[size_t(E)], ss, 1e-6 * ss);
    const float inv_rms = router_fold_inv_rms(sums.data(), E, H, eps);
    EXPECT_NEAR(inv_rms, 1.0 / std::sqrt(ss / H + eps), 1e-6 * inv_rms);
    double worst = 0, scale = 0;
    for (int e = 0; e < E; ++e) {
      double ref = 0, mag = 0;
      for (int i = 0; i < H; ++i) {
        const float xn = bf16_to_float(float_to_bf16(bf16_to_float(h[size_t(i)]) * inv_rms));
        const float x = bf16_to_float(float_to_bf16(bf16_to_float(g[size_t(i)]) * xn));
        ref += double(bf16_to_float(W[size_t(e) * H + i])) * x;
        mag += std::fabs(double(bf16_to_float(W[size_t(e) * H + i])) * x);
      }
      const double got = double(float(sums[size_t(e)]) * inv_rms);
      worst = std::max(worst, std::fabs(got - ref));
      scale = std::max(scale, mag);
    }
    // Two bf16 roundings of each term, random in sign: a few 2^-8 of the terms' magnitude / sqrt.
    EXPECT_LE(worst, 8 * std::ldexp(1.0, -8) * scale / std::sqrt(double(H))) << E << " x " << H;
    EXPECT_GT(worst, 0.0);  // the orders do differ
    for (int i = 0; i < H; ++i)
      ASSERT_EQ(gx[size_t(i)], float_to_bf16(bf16_to_float(g[size_t(i)]) * bf16_to_float(h[size_t(i)])));
  }
}

TEST(RouterFold, OneNonzeroElementGivesExactSums) {
  const int E = 3, H = 32;
  std::vector<uint16_t> W(size_t(E) * H, 0), g(H, float_to_bf16(1.0f)), h(H, 0);
  h[17] = float_to_bf16(3.0f);
  g[17] = float_to_bf16(0.5f);
  for (int e = 0; e < E; ++e) W[size_t(e) * H + 17] = float_to_bf16(float(e + 1));
  std::vector<double> sums;
  std::vector<uint16_t> gx;
  router_fold_sums(router_fold_tiles(W.data(), g.data(), E, H), h.data(), E, H, sums, gx);
  EXPECT_EQ(sums, (std::vector<double>{1.5, 3.0, 4.5, 9.0}));
  EXPECT_EQ(bf16_to_float(gx[17]), 1.5f);
  EXPECT_EQ(bf16_to_float(gx[3]), 0.0f);
}

TEST(RouterFold, RefusesShapesItCannotTile) {
  std::vector<uint16_t> W(8 * 40), g(40);
  EXPECT_THROW(router_fold_tiles(W.data(), g.data(), 8, 40), Error);  // H % 16 != 0
  std::vector<uint16_t> W2(size_t(300) * 32), g2(32);
  EXPECT_THROW(router_fold_tiles(W2.data(), g2.data(), 300, 32), Error);  // E > 256
  std::vector<double> sums;
  std::vector<uint16_t> gx;
  EXPECT_THROW(router_fold_sums(std::vector<uint8_t>(10), g2.data(), 2, 32, sums, gx), Error);
}

}  // namespace
}  // namespace tetra::moe
