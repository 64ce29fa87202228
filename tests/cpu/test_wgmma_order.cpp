// The wgmma activation order (moe/wgmma_order.h) against the fragment layout it must match: for
// every chunk column e = 16t + 4j + 2h + b of the packed weights' k-step j (lane t, register pair
// h, bit b), its position is the k-step's logical column 16j + 8h + 2t + b; and it is a
// permutation within each 64-column chunk.
#include <gtest/gtest.h>

#include <vector>

#include "moe/wgmma_order.h"

namespace tetra {
namespace {

TEST(WgmmaOrder, MatchesTheFragmentLayoutLogicalColumns) {
  for (int c = 0; c < 3; ++c)
    for (int t = 0; t < 4; ++t)
      for (int j = 0; j < 4; ++j)
        for (int h = 0; h < 2; ++h)
          for (int b = 0; b < 2; ++b) {
            const int e = 64 * c + 16 * t + 4 * j + 2 * h + b;
            EXPECT_EQ(wgmma_order_column(e), 64 * c + 16 * j + 8 * h + 2 * t + b) << e;
          }
}

TEST(WgmmaOrder, IsAPermutationOfEachChunk) {
  const int k = 64 * 5;
  std::vector<int> hits(k, 0);
  for (int e = 0; e < k; ++e) {
    const int p = wgmma_order_column(e);
    ASSERT_GE(p, 64 * (e / 64));
    ASSERT_LT(p, 64 * (e / 64 + 1));
    ++hits[size_t(p)];
  }
  for (int p = 0; p < k; ++p) EXPECT_EQ(hits[size_t(p)], 1) << p;
  // 16-byte group g of a chunk holds the 4-byte units u with u % 8 == g (what the kernel copies).
  for (int u = 0; u < 32; ++u) EXPECT_EQ(wgmma_order_column(2 * u) / 8, u % 8) << u;
}

// An NVFP4 block's pairs in wgmma order: unit j of block b holds natural columns 16b + 2j, +1,
// and the units of the four blocks of a chunk tile the chunk (stride 4 units apart).
TEST(WgmmaOrder, BlockUnitsHoldTheBlocksPairs) {
  std::vector<int> hits(32 * 3, 0);
  for (int b = 0; b < 4 * 3; ++b)
    for (int j = 0; j < 8; ++j) {
      const int u = wgmma_order_block_unit(b, j);
      EXPECT_EQ(2 * u, wgmma_order_column(16 * b + 2 * j)) << b << " " << j;
      EXPECT_EQ(2 * u + 1, wgmma_order_column(16 * b + 2 * j + 1)) << b << " " << j;
      EXPECT_EQ(u, 32 * (b / 4) + 4 * j + b % 4) << b << " " << j;
      ++hits[size_t(u)];
    }
  for (int u = 0; u < 32 * 3; ++u) EXPECT_EQ(hits[size_t(u)], 1) << u;
}

}  // namespace
}  // namespace tetra
