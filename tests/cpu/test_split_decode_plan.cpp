// The split decode attention's per-step plan (model/cuda/split_decode_plan.h) against the
// definition written out here: each block's range, and the cache row of each of its first
// kSplitPlanRows tokens looked up token by token in the block table.
#include "model/cuda/split_decode_plan.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/error.h"

namespace tetra::model::cuda {
namespace {

TEST(SplitDecodePlan, RangesCoverTheSequenceInAlignedSpans) {
  for (int len : {0, 1, 15, 16, 17, 100, 1025, 4097})
    for (int splits : {1, 2, 3, 8, 16}) {
      int next = 0;
      for (int r = 0; r < splits; ++r) {
        const SplitRange g = split_range(len, splits, r);
        EXPECT_EQ(g.begin, next) << len << " / " << splits << " split " << r;
        EXPECT_LE(g.begin, g.end);
        if (g.end < len) EXPECT_EQ((g.end - g.begin) % kSplitAlign, 0) << "only the last is short";
        next = g.end;
      }
      EXPECT_EQ(next, len) << len << " / " << splits;
    }
}

TEST(SplitDecodePlan, MatchesTheBlockTableTokenByToken) {
  std::mt19937 rng(23);
  for (int block_size : {1, 7, 16, 64})
    for (int splits : {1, 3, 8, 16}) {
      const std::vector<int32_t> lens = {1, 0, 1025, 191, 193, 4097, 16 * 17};
      const int S = int(lens.size());
      const int max_blocks = (4097 + block_size - 1) / block_size + 2;
      std::vector<int32_t> tables(size_t(S) * max_blocks, -1);
      std::uniform_int_distribution<int32_t> block(0, 100000);
      for (int s = 0; s < S; ++s)
        for (int b = 0; b * block_size < lens[size_t(s)]; ++b)
          tables[size_t(s) * max_blocks + b] = block(rng);
      std::vector<int32_t> plan(split_decode_plan_ints(S, splits), 12345);
      build_split_decode_plan(lens.data(), tables.data(), max_blocks, block_size, S, splits,
                              plan.data());
      for (int s = 0; s < S; ++s)
        for (int r = 0; r < splits; ++r) {
          const int32_t* p = plan.data() + (size_t(s) * splits + r) * kSplitPlanInts;
          const SplitRange g = split_range(lens[size_t(s)], splits, r);
          ASSERT_EQ(p[0], g.begin);
          ASSERT_EQ(p[1], g.end);
          ASSERT_EQ(p[2], lens[size_t(s)]);
          for (int j = 0; j < kSplitPlanRows; ++j) {
            const int tok = g.begin + j;
            const int32_t want =
                tok < g.end ? tables[size_t(s) * max_blocks + tok / block_size] * block_size +
                                  tok % block_size
                            : -1;
            ASSERT_EQ(p[kSplitPlanHeader + j], want)
                << "block " << block_size << " splits " << splits << " seq " << s << " split "
                << r << " row " << j;
          }
        }
    }
}

TEST(SplitDecodePlan, RefusesLengthsItsTableCannotHold) {
  const std::vector<int32_t> lens = {33};
  const std::vector<int32_t> tables = {4, 9};  // two blocks of 16: 32 tokens
  std::vector<int32_t> plan(split_decode_plan_ints(1, 2));
  EXPECT_THROW(build_split_decode_plan(lens.data(), tables.data(), 2, 16, 1, 2, plan.data()),
               tetra::Error);
  const std::vector<int32_t> holes = {4, -1};  // token 16.. has no block
  const std::vector<int32_t> lens2 = {20};
  EXPECT_THROW(build_split_decode_plan(lens2.data(), holes.data(), 2, 16, 1, 1, plan.data()),
               tetra::Error);
  EXPECT_THROW(build_split_decode_plan(lens2.data(), tables.data(), 2, 16, 1, 0, plan.data()),
               tetra::Error);
}

}  // namespace
}  // namespace tetra::model::cuda
