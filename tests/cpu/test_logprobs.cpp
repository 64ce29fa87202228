// ops::position_logprobs against a log-softmax written out directly (in long double), on random
// rows of vocabulary sizes around real ones, with ties, NaN and infinite logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "ops/sampling/logprobs.h"

namespace tetra {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_row(int64_t vocab, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> row(static_cast<size_t>(vocab));
  for (float& x : row) x = d(rng);
  return row;
}

// log softmax(row)[i], directly.
std::vector<double> reference_logprobs(const std::vector<float>& row) {
  long double sum = 0;
  for (float x : row) sum += std::exp(static_cast<long double>(x));
  std::vector<double> out;
  for (float x : row) out.push_back(double(static_cast<long double>(x) - std::log(sum)));
  return out;
}

TEST(Logprobs, MatchesALogSoftmaxOnRandomRows) {
  for (int64_t vocab : {1, 2, 7, 1000, 151552}) {
    for (float scale : {0.5f, 4.0f, 30.0f}) {
      const std::vector<float> row = random_row(vocab, uint32_t(vocab * 7 + int(scale)), scale);
      const std::vector<double> ref = reference_logprobs(row);
      std::vector<int64_t> order(static_cast<size_t>(vocab));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[size_t(a)] > row[size_t(b)]; });
      const int32_t token = int32_t((vocab * 5) / 7);
      for (int top : {0, 1, 5, 20}) {
        const ops::PositionLogprobs lp = ops::position_logprobs(row.data(), vocab, token, top);
        EXPECT_NEAR(lp.logprob, ref[size_t(token)], 1e-5 * (1 + std::abs(ref[size_t(token)])))
            << "vocab " << vocab << " scale " << scale;
        ASSERT_EQ(lp.top.size(), size_t(std::min<int64_t>(top, vocab)));
        for (size_t k = 0; k < lp.top.size(); ++k) {
          EXPECT_EQ(lp.top[k].token, order[k]) << "rank " << k << " vocab " << vocab;
          EXPECT_NEAR(lp.top[k].logprob, ref[size_t(order[k])], 1e-5 * (1 + std::abs(ref[size_t(order[k])])));
        }
      }
    }
  }
}

TEST(Logprobs, TiesRankTheLowerIdFirst) {
  const std::vector<float> row = {1.0f, 3.0f, 2.0f, 3.0f, 3.0f, -1.0f};
  const ops::PositionLogprobs lp = ops::position_logprobs(row.data(), 6, 5, 4);
  ASSERT_EQ(lp.top.size(), 4u);
  EXPECT_EQ(lp.top[0].token, 1);
  EXPECT_EQ(lp.top[1].token, 3);
  EXPECT_EQ(lp.top[2].token, 4);
  EXPECT_EQ(lp.top[3].token, 2);
  EXPECT_FLOAT_EQ(lp.top[0].logprob, lp.top[2].logprob);
  const std::vector<double> ref = reference_logprobs(row);
  EXPECT_NEAR(lp.logprob, ref[5], 1e-6);
}

TEST(Logprobs, NanCountsAsMinusInfinity) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> row = {nan, 0.0f, -kInf, 0.0f};
  const ops::PositionLogprobs lp = ops::position_logprobs(row.data(), 4, 1, 4);
  EXPECT_NEAR(lp.logprob, std::log(0.5), 1e-6);
  ASSERT_EQ(lp.top.size(), 4u);
  EXPECT_EQ(lp.top[0].token, 1);
  EXPECT_EQ(lp.top[1].token, 3);
  EXPECT_EQ(lp.top[2].token, 0);  // NaN and -inf are equal (-inf): the lower id first
  EXPECT_EQ(lp.top[3].token, 2);
  EXPECT_EQ(lp.top[2].logprob, -kInf);
  EXPECT_EQ(lp.top[3].logprob, -kInf);
  EXPECT_EQ(ops::position_logprobs(row.data(), 4, 0, 0).logprob, -kInf);
}

TEST(Logprobs, RowsWithoutFiniteValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> none = {nan, -kInf, -kInf};
  const ops::PositionLogprobs a = ops::position_logprobs(none.data(), 3, 1, 3);
  EXPECT_EQ(a.logprob, -kInf);
  for (const ops::TokenLogprob& t : a.top) EXPECT_EQ(t.logprob, -kInf);
  // +inf logits share the whole mass.
  const std::vector<float> inf = {kInf, 5.0f, kInf, nan};
  EXPECT_NEAR(ops::position_logprobs(inf.data(), 4, 0, 0).logprob, std::log(0.5), 1e-6);
  EXPECT_EQ(ops::position_logprobs(inf.data(), 4, 1, 0).logprob, -kInf);
  EXPECT_EQ(ops::position_logprobs(inf.data(), 4, 3, 0).logprob, -kInf);
}

TEST(Logprobs, RefusesBadArguments) {
  const std::vector<float> row = {0.0f, 1.0f};
  EXPECT_THROW(ops::position_logprobs(row.data(), 2, 2, 0), Error);
  EXPECT_THROW(ops::position_logprobs(row.data(), 2, -1, 0), Error);
  EXPECT_THROW(ops::position_logprobs(row.data(), 2, 0, -1), Error);
  EXPECT_THROW(ops::position_logprobs(row.data(), 2, 0, ops::kMaxTopLogprobs + 1), Error);
}

}  // namespace
}  // namespace tetra
