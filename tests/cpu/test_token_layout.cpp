// Token layouts (contiguous and masked): invariants checked from first principles on random and
// adversarial routings, plus the errors the CPU builders must raise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "moe/token_layout.h"

using namespace tetra;
using namespace tetra::moe;

namespace {

// ids [T, K]: K distinct experts per token; `skew` > 0 crowds the low experts (others stay empty).
std::vector<int32_t> random_ids(int T, int K, int E, uint32_t seed, double skew = 0.0) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(size_t(T) * K);
  std::vector<int32_t> perm(E);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) perm[e] = e;
    for (int j = 0; j < K; ++j) {  // partial Fisher-Yates, optionally biased to low indices
      std::uniform_real_distribution<double> u(0.0, 1.0);
      const double r = std::pow(u(rng), 1.0 + skew);
      const int pick = j + std::min(E - j - 1, int(r * (E - j)));
      std::swap(perm[j], perm[pick]);
      ids[size_t(t) * K + j] = perm[j];
    }
  }
  return ids;
}

std::vector<int32_t> count_per_expert(const std::vector<int32_t>& ids, int E) {
  std::vector<int32_t> c(E, 0);
  for (int32_t e : ids) ++c[e];
  return c;
}

void check_contiguous(const ContiguousLayout& L, const std::vector<int32_t>& ids, int T, int K,
                      int E) {
  const int S = T * K;
  ASSERT_EQ(int(L.expert_offsets.size()), E + 1);
  ASSERT_EQ(int(L.slot_token.size()), S);
  ASSERT_EQ(int(L.slot_of.size()), S);
  ASSERT_EQ(L.num_rows(), S);
  const std::vector<int32_t> counts = count_per_expert(ids, E);
  EXPECT_EQ(L.expert_offsets[0], 0);
  for (int e = 0; e < E; ++e) ASSERT_EQ(L.expert_offsets[e + 1] - L.expert_offsets[e], counts[e]);
  std::vector<int> pair_of_row(S, -1);  // every (t, k) appears exactly once
  for (int p = 0; p < S; ++p) {
    const int row = L.slot_of[p];
    ASSERT_TRUE(row >= 0 && row < S) << "pair " << p;
    ASSERT_EQ(pair_of_row[row], -1) << "row " << row << " used twice";
    pair_of_row[row] = p;
  }
  const std::vector<RowRange> ranges = L.expert_rows();
  ASSERT_EQ(int(ranges.size()), E);
  for (int e = 0; e < E; ++e) {
    EXPECT_EQ(ranges[e].start, L.expert_offsets[e]);
    EXPECT_EQ(ranges[e].count, counts[e]);
    int prev = -1;
    for (int r = ranges[e].start; r < ranges[e].start + ranges[e].count; ++r) {
      const int p = pair_of_row[r];
      ASSERT_EQ(ids[p], e) << "row " << r << " is in expert " << e << "'s range";
      ASSERT_EQ(L.slot_token[r], p / K);
      ASSERT_GT(p, prev) << "stable order (token, then k) broken at row " << r;
      prev = p;
    }
  }
}

void check_masked(const MaskedLayout& L, const std::vector<int32_t>& ids, int T, int K, int E,
                  int max_m) {
  const int S = T * K;
  ASSERT_EQ(L.max_m, max_m);
  ASSERT_EQ(int(L.masked_m.size()), E);
  ASSERT_EQ(int(L.row_token.size()), E * max_m);
  ASSERT_EQ(int(L.slot_of.size()), S);
  const std::vector<int32_t> counts = count_per_expert(ids, E);
  std::vector<int> pair_of_row(size_t(E) * max_m, -1);
  for (int p = 0; p < S; ++p) {
    const int row = L.slot_of[p];
    ASSERT_TRUE(row >= 0 && row < E * max_m) << "pair " << p;
    ASSERT_EQ(row / max_m, ids[p]) << "pair " << p << " is in another expert's block";
    ASSERT_EQ(pair_of_row[row], -1) << "row " << row << " used twice";
    pair_of_row[row] = p;
  }
  const std::vector<RowRange> ranges = L.expert_rows();
  for (int e = 0; e < E; ++e) {
    ASSERT_EQ(L.masked_m[e], counts[e]);
    EXPECT_EQ(ranges[e].start, e * max_m);
    EXPECT_EQ(ranges[e].count, counts[e]);
    int prev = -1;
    for (int r = 0; r < max_m; ++r) {
      const int row = e * max_m + r;
      if (r < counts[e]) {
        const int p = pair_of_row[row];
        ASSERT_GE(p, 0) << "hole inside expert " << e << " at row " << r;
        ASSERT_EQ(L.row_token[row], p / K);
        ASSERT_GT(p, prev) << "stable order broken in expert " << e;
        prev = p;
      } else {
        ASSERT_EQ(L.row_token[row], -1) << "row past masked_m must be empty";
      }
    }
  }
}

}  // namespace

class LayoutSizes : public ::testing::TestWithParam<int> {};

TEST_P(LayoutSizes, RandomRoutingKeepsEveryInvariant) {
  const int T = GetParam();
  for (const auto& [E, K] : std::vector<std::pair<int, int>>{{8, 2}, {160, 8}, {256, 8}}) {
    for (double skew : {0.0, 4.0}) {
      SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " K=" << K << " skew=" << skew);
      const std::vector<int32_t> ids = random_ids(T, K, E, uint32_t(T * 31 + E), skew);
      check_contiguous(build_contiguous_cpu(ids.data(), T, K, E), ids, T, K, E);
      const std::vector<int32_t> counts = count_per_expert(ids, E);
      const int max_m = *std::max_element(counts.begin(), counts.end()) + 3;
      check_masked(build_masked_cpu(ids.data(), T, K, E, max_m), ids, T, K, E, max_m);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokens, LayoutSizes, ::testing::Values(1, 3, 19, 99, 989, 4096));

TEST(Layout, HandWorkedExample) {
  // T=3, K=2, E=4. Pairs p: 0:(t0,e2) 1:(t0,e0) 2:(t1,e2) 3:(t1,e3) 4:(t2,e0) 5:(t2,e2)
  const std::vector<int32_t> ids = {2, 0, 2, 3, 0, 2};
  const ContiguousLayout c = build_contiguous_cpu(ids.data(), 3, 2, 4);
  EXPECT_EQ(c.expert_offsets, (std::vector<int32_t>{0, 2, 2, 5, 6}));  // expert 1 empty
  EXPECT_EQ(c.slot_token, (std::vector<int32_t>{0, 2, 0, 1, 2, 1}));
  EXPECT_EQ(c.slot_of, (std::vector<int32_t>{2, 0, 3, 5, 1, 4}));
  const MaskedLayout m = build_masked_cpu(ids.data(), 3, 2, 4, 3);
  EXPECT_EQ(m.masked_m, (std::vector<int32_t>{2, 0, 3, 1}));
  EXPECT_EQ(m.row_token, (std::vector<int32_t>{0, 2, -1, -1, -1, -1, 0, 1, 2, 1, -1, -1}));
  EXPECT_EQ(m.slot_of, (std::vector<int32_t>{6, 0, 7, 9, 1, 8}));
  const std::vector<RowRange> r = m.expert_rows();
  EXPECT_EQ(r[2].start, 6);
  EXPECT_EQ(r[2].count, 3);
  EXPECT_EQ(r[1].count, 0);
}

TEST(Layout, AllTokensOnOneExpert) {
  const int T = 99, K = 1, E = 16;
  const std::vector<int32_t> ids(T, 5);
  const ContiguousLayout c = build_contiguous_cpu(ids.data(), T, K, E);
  check_contiguous(c, ids, T, K, E);
  for (int e = 0; e <= 5; ++e) EXPECT_EQ(c.expert_offsets[e], 0);
  for (int e = 6; e <= E; ++e) EXPECT_EQ(c.expert_offsets[e], T);
  for (int t = 0; t < T; ++t) EXPECT_EQ(c.slot_token[t], t);
  check_masked(build_masked_cpu(ids.data(), T, K, E, T), ids, T, K, E, T);  // exactly full
  // The same expert twice per token (duplicates are legal pairs): stable by token, then k.
  const std::vector<int32_t> dup(size_t(T) * 2, 3);
  check_contiguous(build_contiguous_cpu(dup.data(), T, 2, E), dup, T, 2, E);
}

TEST(Layout, EmptyExpertsAndNoTokens) {
  const std::vector<int32_t> ids = {7, 0, 7, 0};  // T=2, K=2, E=8: experts 1..6 empty
  const ContiguousLayout c = build_contiguous_cpu(ids.data(), 2, 2, 8);
  check_contiguous(c, ids, 2, 2, 8);
  for (const RowRange& r : c.expert_rows()) EXPECT_GE(r.count, 0);
  EXPECT_EQ(c.expert_rows()[3].count, 0);
  EXPECT_EQ(c.expert_rows()[3].start, 2);
  const ContiguousLayout none = build_contiguous_cpu(nullptr, 0, 8, 256);
  EXPECT_EQ(none.num_rows(), 0);
  EXPECT_EQ(none.expert_offsets, std::vector<int32_t>(257, 0));
  const MaskedLayout mnone = build_masked_cpu(nullptr, 0, 8, 4, 2);
  EXPECT_EQ(mnone.masked_m, std::vector<int32_t>(4, 0));
  EXPECT_EQ(mnone.row_token, std::vector<int32_t>(8, -1));
}

TEST(Layout, MaskedOverflowIsAnErrorNamingTheExpert) {
  const std::vector<int32_t> ids = {1, 2, 1, 3, 1, 0};  // expert 1 gets 3 pairs
  EXPECT_NO_THROW(build_masked_cpu(ids.data(), 3, 2, 4, 3));
  try {
    build_masked_cpu(ids.data(), 3, 2, 4, 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("expert 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max_m = 2"), std::string::npos) << msg;
  }
  EXPECT_THROW(build_masked_cpu(ids.data(), 3, 2, 4, 0), Error);
}

TEST(Layout, BadIdsAreErrors) {
  const std::vector<int32_t> ids = {0, 1, 4, 2};  // 4 is outside E=4 (token 1, slot 0)
  try {
    build_contiguous_cpu(ids.data(), 2, 2, 4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 1"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> neg = {0, -1};
  EXPECT_THROW(build_masked_cpu(neg.data(), 1, 2, 4, 4), Error);
  EXPECT_THROW(build_contiguous_cpu(ids.data(), 2, 0, 4), Error);
  EXPECT_THROW(build_contiguous_cpu(ids.data(), -1, 2, 4), Error);
}
