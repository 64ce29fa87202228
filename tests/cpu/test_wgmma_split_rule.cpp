// The wgmma kernel's k split (ops/moe/w4a16_launch.h, wgmma_k_split): doubled while the split
// grid keeps at most one block per SM and each block 8 chunks, clusters of at most 4 for the
// one-block-per-SM tile and 8 for the two-per-SM one. The shapes are GLM-4.5-Air's dense linears
// measured on the H200 (132 SMs) in session 25.
#include <gtest/gtest.h>

#include "ops/moe/w4a16_launch.h"

namespace tetra::moe_detail {
namespace {

TEST(WgmmaSplitRule, PicksTheMeasuredSplitsOfAirsDenseLinears) {
  const int sms = 132;
  // q/k/v as one matrix (56 column blocks, k 4096 = 64 chunks): the narrow tile at 16-32 rows
  // and the wide one at 64-128 rows both ran fastest at S = 2; two row blocks (192-256 rows) at 1.
  EXPECT_EQ(wgmma_k_split(56, 2, sms, 64), 2);
  EXPECT_EQ(wgmma_k_split(56, 1, sms, 64), 2);
  EXPECT_EQ(wgmma_k_split(112, 1, sms, 64), 1);
  // o_proj (16 column blocks, k 12288 = 192 chunks), wide tile at 65-128 rows: S = 4 (clusters
  // of 8 of the wide tile ran 86 us against 55 at 64 rows); narrow tile: 8.
  EXPECT_EQ(wgmma_k_split(16, 1, sms, 192), 4);
  EXPECT_EQ(wgmma_k_split(16, 2, sms, 192), 8);
  EXPECT_EQ(wgmma_k_split(32, 1, sms, 192), 4);
  // k or v alone (4 column blocks), narrow: 8.
  EXPECT_EQ(wgmma_k_split(4, 2, sms, 64), 8);
}

TEST(WgmmaSplitRule, EdgesOfTheWaveAndOfTheChunks) {
  EXPECT_EQ(wgmma_k_split(50, 1, 100, 64), 2);   // exactly one block per SM at S = 2
  EXPECT_EQ(wgmma_k_split(51, 1, 100, 64), 1);
  EXPECT_EQ(wgmma_k_split(1, 2, 100, 16), 2);    // 8 chunks per block at S = 2
  EXPECT_EQ(wgmma_k_split(1, 2, 100, 15), 1);    // 7 would be too few
  EXPECT_EQ(wgmma_k_split(1, 2, 100, 1), 1);
  EXPECT_EQ(wgmma_k_split(1, 2, 1000, 4096), 8); // never past the portable cluster size
  EXPECT_EQ(wgmma_k_split(1000, 2, 132, 4096), 1);  // a full grid (MoE GEMMs at many rows)
}

}  // namespace
}  // namespace tetra::moe_detail
