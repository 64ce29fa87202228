// The register bounds of the one-wave decode GEMMs (ops/moe/w4a16_launch.h): the routed GEMM1 and
// the 3-warp GEMM2 are compiled for as many blocks per SM as their grid needs in one wave, so
// that blocks launched while another grid still holds SMs cannot pile onto the free ones
// (bench/results/2026-12-04-session49-h200.md). The shapes are the H200's (132 SMs).
#include <gtest/gtest.h>

#include "ops/moe/w4a16_launch.h"

namespace tetra::moe_detail {
namespace {

TEST(DecodeBlocksPerSmRule, RoutedGemm1TakesItsOneWaveCount) {
  const int sms = 132;
  EXPECT_EQ(routed_blocks_per_sm(792, sms), 6);   // GLM-4.5-Air: 9 slots x 88 tile pairs
  EXPECT_EQ(routed_blocks_per_sm(864, sms), 7);   // GLM-4.7: 9 x 96
  EXPECT_EQ(routed_blocks_per_sm(1152, sms), 8);  // GLM-5: 9 x 128, past one wave of 8
  EXPECT_EQ(routed_blocks_per_sm(6 * sms + 1, sms), 7);  // one block past 6 per SM
  EXPECT_EQ(routed_blocks_per_sm(7 * sms, sms), 7);
  EXPECT_EQ(routed_blocks_per_sm(600, sms), 6);   // fewer than 6 per SM: still the 6-per-SM bound
  EXPECT_EQ(routed_blocks_per_sm(600, 0), 8);     // no SM count: as many as 8
}

TEST(DecodeBlocksPerSmRule, OneWaveGemm2TakesNineWhereNineHoldIt) {
  const int sms = 132;
  EXPECT_EQ(narrow_blocks_per_sm(1152, sms), 9);  // GLM-4.5-Air: 9 slots x 128 row tiles
  EXPECT_EQ(narrow_blocks_per_sm(9 * sms, sms), 9);
  EXPECT_EQ(narrow_blocks_per_sm(9 * sms + 1, sms), 10);
  EXPECT_EQ(narrow_blocks_per_sm(1320, sms), 10);
}

}  // namespace
}  // namespace tetra::moe_detail
