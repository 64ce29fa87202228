// The tiled router-logits kernel's tile choice (ops/moe/router_logits_tiled.h, router_tile_for)
// and where the MoE layer switches to it (kRouterTiledMinLogits). Every expectation is the
// fastest shape (or one within 2% of it) measured on the H200 (132 SMs) in session 26 by
// tests/gpu/bench_router_logits at the router shapes of GLM-5 (E 256), GLM-4.5-Air (E 128) and
// Qwen3-30B-A3B (E 128).
#include <gtest/gtest.h>

#include "ops/moe/router_logits_tiled.h"

namespace tetra::moe::cuda {
namespace {

constexpr int k2x2 = 0, k2x4 = 1, k4x4 = 2, k4x8 = 3;

TEST(RouterTileRule, ShapesFollowTheCompiledList) {
  ASSERT_EQ(kRouterTileShapeCount, 4);
  EXPECT_EQ(kRouterTileShapes[k2x4].block_tokens(), 4);
  EXPECT_EQ(kRouterTileShapes[k2x4].block_experts(), 16);
  EXPECT_EQ(kRouterTileShapes[k4x8].block_tokens(), 8);
  EXPECT_EQ(kRouterTileShapes[k4x8].block_experts(), 32);
}

TEST(RouterTileRule, PicksTheMeasuredShapes) {
  const int sms = 132;
  // 128 experts (GLM-4.5-Air, Qwen3-30B-A3B).
  EXPECT_EQ(router_tile_for(64, 128, sms), k2x4);    // 7.87 us; 4x4 9.49 (64 blocks)
  EXPECT_EQ(router_tile_for(96, 128, sms), k4x4);    // 9.57; 2x4 11.19
  EXPECT_EQ(router_tile_for(128, 128, sms), k4x4);   // 9.63; 4x8 13.57 (64 blocks)
  EXPECT_EQ(router_tile_for(256, 128, sms), k4x8);   // 13.69; 4x4 15.01
  EXPECT_EQ(router_tile_for(4096, 128, sms), k4x8);  // 173.6; 4x4 200.4
  // 256 experts (GLM-5).
  EXPECT_EQ(router_tile_for(32, 256, sms), k2x4);    // 11.08; 2x2 11.06, 4x4 13.63
  EXPECT_EQ(router_tile_for(48, 256, sms), k4x4);    // 13.69; 2x4 15.85
  EXPECT_EQ(router_tile_for(64, 256, sms), k4x4);    // 13.73; 4x8 19.59 (64 blocks)
  EXPECT_EQ(router_tile_for(96, 256, sms), k4x8);    // 19.73; 4x4 21.60
  // Too few blocks for any tile: the smallest.
  EXPECT_EQ(router_tile_for(4, 16, sms), k2x2);
  EXPECT_EQ(router_tile_for(1, 1, sms), k2x2);
}

TEST(RouterTileRule, TwoThirdsOfTheSmsIsTheEdge) {
  // 32 experts: 4x4 blocks (8 tokens x 16 experts) are 2 per token tile, 4x8 blocks 1. At 352
  // tokens 4x4 gives 88 blocks, two thirds of 132 SMs (4x8: 44); at 344 only 86, so 2x4.
  EXPECT_EQ(router_tile_for(352, 32, 132), k4x4);
  EXPECT_EQ(router_tile_for(344, 32, 132), k2x4);
  EXPECT_EQ(router_tile_for(704, 32, 132), k4x8);  // 88 blocks of 4x8
}

TEST(RouterTileRule, TheLayerSwitchesAt8192Logits) {
  // One-warp kernel up to 6144 logits (Air 48 tokens 5.69 us vs 7.77 tiled; GLM-5 24 tokens
  // 8.19 vs 10.98), tiled from 8192 (GLM-5 32 tokens 11.08 vs 13.08; Air 64 tokens even).
  EXPECT_LT(48L * 128, kRouterTiledMinLogits);
  EXPECT_LT(24L * 256, kRouterTiledMinLogits);
  EXPECT_GE(32L * 256, kRouterTiledMinLogits);
  EXPECT_GE(64L * 128, kRouterTiledMinLogits);
}

}  // namespace
}  // namespace tetra::moe::cuda
