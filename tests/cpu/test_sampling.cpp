// Sampling CPU reference: Philox known answers (Random123 vectors), penalty arithmetic worked by
// hand, greedy, each filter's kept set checked over many seeds, the drawn frequencies against the
// softmax they should follow (temperature included), and determinism per (seed, step).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "core/error.h"
#include "ops/sampling/sampling.h"
#include "ops/sampling/sampling_math.h"

namespace tetra::ops {
namespace {

namespace sm = sampling_math;

int32_t sample_one(const std::vector<float>& logits, const SamplingParams& p,
                   const TokenHistory& h = {}) {
  int32_t tok = -2;
  sample_cpu(logits.data(), 1, int(logits.size()), &p, h, &tok);
  return tok;
}

// Tokens drawn over `draws` steps (the step advances the counter, as in generation).
std::vector<int> histogram(const std::vector<float>& logits, SamplingParams p, int draws) {
  std::vector<int> hist(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    p.step = uint64_t(i);
    const int32_t t = sample_one(logits, p);
    EXPECT_GE(t, 0);
    if (t >= 0) ++hist[t];
  }
  return hist;
}

TEST(Sampling, PhiloxKnownAnswers) {
  // Random123 tests/kat_vectors, philox4x32 10: counter words, key words -> output words.
  auto r = sm::philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
  r = sm::philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
  r = sm::philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(r.v[0], 0xd16cfe09u);
  EXPECT_EQ(r.v[1], 0x94fdccebu);
  EXPECT_EQ(r.v[2], 0x5001e420u);
  EXPECT_EQ(r.v[3], 0x24126ea1u);
}

TEST(Sampling, UniformsAreInsideTheOpenIntervalAndSpread) {
  double sum = 0;
  for (uint32_t t = 0; t < 20000; ++t) {
    const double u = sm::uniform_open01(42, 7, t);
    ASSERT_GT(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
}

TEST(Sampling, OrderKeyFollowsFloatOrderAndMarksDropped) {
  const std::vector<float> v = {-1e30f, -2.5f, -1e-30f, 0.0f, 1e-30f, 3.0f, 1e30f, INFINITY};
  for (size_t i = 1; i < v.size(); ++i) EXPECT_LT(sm::order_key(v[i - 1]), sm::order_key(v[i]));
  EXPECT_EQ(sm::order_key(NAN), 0u);
  EXPECT_EQ(sm::order_key(-INFINITY), 0u);
  EXPECT_GT(sm::order_key(-3e38f), 0u);
}

TEST(Sampling, PenaltyArithmetic) {
  // repetition 2: positive logits halve, negative double
  EXPECT_EQ(sm::penalised(3.0f, true, 0, 2.0f, 0.0f, 0.0f), 1.5f);
  EXPECT_EQ(sm::penalised(-3.0f, true, 0, 2.0f, 0.0f, 0.0f), -6.0f);
  EXPECT_EQ(sm::penalised(3.0f, false, 0, 2.0f, 0.5f, 0.25f), 3.0f);
  // 3 occurrences, frequency 0.5, presence 0.25: 3 - 1.5 - 0.25
  EXPECT_EQ(sm::penalised(3.0f, true, 3, 1.0f, 0.5f, 0.25f), 1.25f);
  // all three: 4 / 2 - 2 * 0.5 - 1
  EXPECT_EQ(sm::penalised(4.0f, true, 2, 2.0f, 0.5f, 1.0f), 0.0f);
}

TEST(Sampling, GreedyTakesTheLargestAndTheLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(sample_one({0.1f, 2.0f, -1.0f, 2.0f}, p), 1);
  EXPECT_EQ(sample_one({NAN, -INFINITY, -5.0f}, p), 2);
  EXPECT_EQ(sample_one({NAN, -INFINITY}, p), -1);
}

TEST(Sampling, PenaltiesChangeTheGreedyChoice) {
  // Token 0 leads by 0.5; it appeared twice in the output.
  const std::vector<float> logits = {2.5f, 2.0f, 1.0f};
  const std::vector<int32_t> prompt = {2}, prompt_off = {0, 1}, out = {0, 0}, out_off = {0, 2};
  const TokenHistory h{prompt.data(), prompt_off.data(), out.data(), out_off.data()};
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(sample_one(logits, p, h), 0);
  p.frequency_penalty = 0.3f;  // 2.5 - 0.6 = 1.9 < 2.0
  EXPECT_EQ(sample_one(logits, p, h), 1);
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 0.6f;  // 1.9
  EXPECT_EQ(sample_one(logits, p, h), 1);
  p.presence_penalty = 0.0f;
  p.repetition_penalty = 1.3f;  // 2.5 / 1.3 = 1.92
  EXPECT_EQ(sample_one(logits, p, h), 1);
  // A prompt token feels repetition only, not frequency/presence.
  const std::vector<float> l2 = {1.0f, 1.1f};
  const std::vector<int32_t> pr2 = {1}, pr2_off = {0, 1}, none_off = {0, 0};
  const TokenHistory h2{pr2.data(), pr2_off.data(), nullptr, none_off.data()};
  SamplingParams q;
  q.temperature = 0.0f;
  q.frequency_penalty = q.presence_penalty = 5.0f;
  EXPECT_EQ(sample_one(l2, q, h2), 1);
  q.repetition_penalty = 1.2f;  // 1.1 / 1.2 < 1
  EXPECT_EQ(sample_one(l2, q, h2), 0);
}

int32_t sample_biased(const std::vector<float>& logits, const SamplingParams& p,
                      const std::vector<int32_t>& ids, const std::vector<float>& values,
                      const TokenHistory& h = {}) {
  const std::vector<int32_t> off = {0, int32_t(ids.size())};
  int32_t tok = -2;
  sample_cpu(logits.data(), 1, int(logits.size()), &p, h, &tok, LogitBias{ids.data(), values.data(), off.data()});
  return tok;
}

TEST(Sampling, LogitBiasAddsBansAndComesBeforePenalties) {
  const std::vector<float> logits = {2.5f, 2.0f, 1.0f, NAN};
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_EQ(sample_biased(logits, p, {}, {}), 0);
  EXPECT_EQ(sample_biased(logits, p, {2}, {1.6f}), 2);         // 2.6 > 2.5
  EXPECT_EQ(sample_biased(logits, p, {0}, {-INFINITY}), 1);    // banned
  EXPECT_EQ(sample_biased(logits, p, {3}, {100.0f}), 0);       // NaN + bias stays NaN
  EXPECT_EQ(sample_biased(logits, p, {0, 1, 2}, {-INFINITY, -INFINITY, -INFINITY}), -1);
  // Penalties still act on a biased token: seen once in the output, presence 0.7:
  // (1.0 + 1.6) - 0.7 = 1.9 < 2.5.
  const std::vector<int32_t> out = {2}, off = {0, 1};
  const TokenHistory h{nullptr, nullptr, out.data(), off.data()};
  p.presence_penalty = 0.7f;
  EXPECT_EQ(sample_biased(logits, p, {2}, {1.6f}, h), 0);
  // Repetition acts on the biased logit: (-1 + 1.5) / 2 = 0.25 beats token 1's 0.3 / 2 (the
  // other order would give -1 * 2 + 1.5 = -0.5).
  const std::vector<float> l2 = {-1.0f, 0.3f};
  SamplingParams q;
  q.temperature = 0.0f;
  q.repetition_penalty = 2.0f;
  const std::vector<int32_t> seen = {0, 1}, seen_off = {0, 2};
  const TokenHistory h2{seen.data(), seen_off.data(), nullptr, nullptr};
  EXPECT_EQ(sample_biased(l2, q, {0}, {1.5f}, h2), 0);
  EXPECT_EQ(sample_biased(l2, q, {}, {}, h2), 1);
  // A sampled row never draws a banned token.
  SamplingParams t;
  t.temperature = 1.0f;
  for (uint64_t step = 0; step < 200; ++step) {
    t.step = step;
    EXPECT_NE(sample_biased({1.0f, 1.0f, 1.0f}, t, {1}, {-INFINITY}), 1);
  }
}

TEST(Sampling, RefusesBadLogitBiases) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  SamplingParams p;
  EXPECT_THROW(sample_biased(logits, p, {3}, {1.0f}), Error);          // outside the vocab
  EXPECT_THROW(sample_biased(logits, p, {-1}, {1.0f}), Error);
  EXPECT_THROW(sample_biased(logits, p, {1, 1}, {1.0f, 2.0f}), Error);  // twice
  EXPECT_THROW(sample_biased(logits, p, {1}, {NAN}), Error);
  EXPECT_THROW(sample_biased(logits, p, {1}, {INFINITY}), Error);
  EXPECT_EQ(sample_biased(logits, p, {0, 2}, {5.0f, -INFINITY}), 0);  // temperature 1, 6 vs 2
}

TEST(Sampling, RefusesHistoryOutsideTheVocabAndBadParams) {
  const std::vector<int32_t> out = {5}, off = {0, 1};
  const TokenHistory h{nullptr, nullptr, out.data(), off.data()};
  SamplingParams p;
  EXPECT_THROW(sample_one({1, 2, 3}, p, h), Error);
  p.top_p = 0.0f;
  EXPECT_THROW(sample_one({1, 2, 3}, p), Error);
  p = SamplingParams{};
  p.repetition_penalty = 0.0f;
  EXPECT_THROW(sample_one({1, 2, 3}, p), Error);
}

TEST(Sampling, SameSeedAndStepSameTokenOtherStepsVary) {
  std::vector<float> logits(1000, 0.0f);  // uniform over 1000 tokens
  SamplingParams p;
  p.seed = 1234;
  p.step = 9;
  const int32_t a = sample_one(logits, p), b = sample_one(logits, p);
  EXPECT_EQ(a, b);
  std::set<int32_t> seen;
  for (uint64_t s = 0; s < 50; ++s) {
    p.step = s;
    seen.insert(sample_one(logits, p));
  }
  EXPECT_GT(seen.size(), 40u);
  p.step = 9;
  p.seed = 1235;
  std::set<int32_t> other;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    p.seed = seed;
    other.insert(sample_one(logits, p));
  }
  EXPECT_GT(other.size(), 40u);
}

// Chi-square style check: each count within 5 sigma of draws * prob.
void expect_frequencies(const std::vector<int>& hist, const std::vector<double>& prob, int draws) {
  for (size_t i = 0; i < prob.size(); ++i) {
    const double mean = draws * prob[i], sigma = std::sqrt(draws * prob[i] * (1 - prob[i])) + 1;
    EXPECT_NEAR(hist[i], mean, 5 * sigma) << "token " << i;
  }
}

TEST(Sampling, DrawsFollowTheSoftmaxAndTheTemperature) {
  const std::vector<double> prob = {0.1, 0.2, 0.3, 0.4};
  std::vector<float> logits;
  for (double q : prob) logits.push_back(float(std::log(q)));
  const int draws = 20000;
  SamplingParams p;
  p.seed = 77;
  expect_frequencies(histogram(logits, p, draws), prob, draws);
  p.temperature = 0.5f;  // p^2 renormalised: 1, 4, 9, 16 over 30
  expect_frequencies(histogram(logits, p, draws), {1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0}, draws);
}

TEST(Sampling, TopKKeepsTheKLargestAndTiesAtTheCut) {
  const std::vector<float> logits = {0.0f, 3.0f, 1.0f, 2.0f, 2.0f, -1.0f};
  SamplingParams p;
  p.top_k = 2;  // 3.0 and 2.0 (both 2.0 tie at the cut)
  const auto hist = histogram(logits, p, 3000);
  EXPECT_EQ(hist[0] + hist[2] + hist[5], 0);
  EXPECT_GT(hist[1], 0);
  EXPECT_GT(hist[3], 0);
  EXPECT_GT(hist[4], 0);
  p.top_k = 1;
  EXPECT_EQ(histogram(logits, p, 200)[1], 200);
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
  const std::vector<double> prob = {0.05, 0.5, 0.15, 0.3};
  std::vector<float> logits;
  for (double q : prob) logits.push_back(float(std::log(q)));
  SamplingParams p;
  p.top_p = 0.79f;  // 0.5 + 0.3 reaches it
  auto hist = histogram(logits, p, 4000);
  EXPECT_EQ(hist[0] + hist[2], 0);
  expect_frequencies(hist, {0, 0.5 / 0.8, 0, 0.3 / 0.8}, 4000);
  p.top_p = 0.81f;  // needs 0.15 too
  hist = histogram(logits, p, 4000);
  EXPECT_EQ(hist[0], 0);
  EXPECT_GT(hist[2], 0);
  p.top_p = 0.4f;  // the top token alone
  EXPECT_EQ(histogram(logits, p, 300)[1], 300);
}

TEST(Sampling, MinPDropsTokensBelowTheFractionOfTheTop) {
  const std::vector<double> prob = {0.5, 0.26, 0.24};
  std::vector<float> logits;
  for (double q : prob) logits.push_back(float(std::log(q)));
  SamplingParams p;
  p.min_p = 0.5f;  // keep p >= 0.25: tokens 0 and 1
  const auto hist = histogram(logits, p, 3000);
  EXPECT_EQ(hist[2], 0);
  expect_frequencies(hist, {0.5 / 0.76, 0.26 / 0.76, 0}, 3000);
}

TEST(Sampling, FiltersCombineInOrder) {
  // min-p 0.2 (p >= 0.08) drops the 0.05 token; top-k 3 then keeps 0.4, 0.3, 0.15; top-p 0.6 over those
  // renormalised (0.47, 0.35, 0.18) keeps the first two.
  const std::vector<double> prob = {0.3, 0.05, 0.4, 0.15, 0.1};
  std::vector<float> logits;
  for (double q : prob) logits.push_back(float(std::log(q)));
  SamplingParams p;
  p.min_p = 0.2f;
  p.top_k = 3;
  p.top_p = 0.6f;
  const auto hist = histogram(logits, p, 4000);
  EXPECT_EQ(hist[1] + hist[3] + hist[4], 0);
  expect_frequencies(hist, {0.3 / 0.7, 0, 0.4 / 0.7, 0, 0}, 4000);
}

TEST(Sampling, RowsAreIndependent) {
  const int V = 50;
  std::vector<float> logits(2 * V);
  for (int i = 0; i < 2 * V; ++i) logits[i] = float((i * 37) % 11) * 0.3f;
  SamplingParams ps[2];
  ps[0].seed = 5;
  ps[1].temperature = 0.0f;
  int32_t tok[2];
  sample_cpu(logits.data(), 2, V, ps, TokenHistory{}, tok);
  EXPECT_EQ(tok[0], sample_one(std::vector<float>(logits.begin(), logits.begin() + V), ps[0]));
  EXPECT_EQ(tok[1], sample_one(std::vector<float>(logits.begin() + V, logits.end()), ps[1]));
}

}  // namespace
}  // namespace tetra::ops
