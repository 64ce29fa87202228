// Routing on the CPU: hand-worked cases, float32 edge cases, and random tokens against an
// independent double-precision implementation written here with std::sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "moe/router.h"
#include "moe/routing_math.h"

using namespace tetra;
using namespace tetra::moe;

namespace {

double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct Routed {
  std::vector<int32_t> ids;  // [T, K]
  std::vector<float> w;      // [T, K]
};

Routed run(const std::vector<float>& logits, const std::vector<float>* bias, int T,
           const RouterParams& p) {
  Routed r{std::vector<int32_t>(size_t(T) * p.top_k, -7), std::vector<float>(size_t(T) * p.top_k)};
  route_cpu(logits.data(), bias ? bias->data() : nullptr, T, p, r.ids.data(), r.w.data());
  return r;
}

// Independent double-precision routing of one token (std::stable_sort, no shared code).
// Returns false when two candidates are closer than `gap` (float and double may then disagree).
bool reference_route(const float* logits, const float* bias, const RouterParams& p,
                     std::vector<int>& ids, std::vector<double>& w, double gap = 1e-5) {
  const int E = p.num_experts;
  std::vector<double> s(E), sel(E);
  if (p.scoring == Scoring::Sigmoid) {
    for (int e = 0; e < E; ++e) s[e] = sigmoid_d(logits[e]);
  } else {
    double m = -INFINITY, sum = 0;
    for (int e = 0; e < E; ++e) m = std::max(m, double(logits[e]));
    for (int e = 0; e < E; ++e) sum += std::exp(double(logits[e]) - m);
    for (int e = 0; e < E; ++e) s[e] = std::exp(double(logits[e]) - m) / sum;
  }
  for (int e = 0; e < E; ++e) sel[e] = s[e] + (bias ? bias[e] : 0.0);
  auto too_close = [gap](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i)
      if (v[i] - v[i - 1] < gap) return true;
    return false;
  };
  if (too_close(sel)) return false;
  std::vector<char> allowed(E, 1);
  if (p.n_group > 1) {
    const int gs = E / p.n_group;
    std::vector<double> gscore(p.n_group);
    for (int g = 0; g < p.n_group; ++g) {
      std::vector<double> v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
      std::sort(v.rbegin(), v.rend());
      gscore[g] = v[0] + v[1];
    }
    if (too_close(gscore)) return false;
    std::vector<int> order(p.n_group);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return gscore[a] > gscore[b]; });
    for (int e = 0; e < E; ++e) allowed[e] = 0;
    for (int j = 0; j < p.topk_group; ++j)
      for (int e = order[j] * gs; e < (order[j] + 1) * gs; ++e) allowed[e] = 1;
  }
  std::vector<int> cand;
  for (int e = 0; e < E; ++e)
    if (allowed[e]) cand.push_back(e);
  std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return sel[a] > sel[b]; });
  ids.assign(cand.begin(), cand.begin() + p.top_k);
  w.resize(p.top_k);
  double sum = 0;
  for (int j = 0; j < p.top_k; ++j) sum += s[ids[j]];
  for (int j = 0; j < p.top_k; ++j)
    w[j] = (p.norm_topk_prob ? s[ids[j]] / (sum + 1e-20) : s[ids[j]]) * p.routed_scaling_factor;
  return true;
}

// Random tokens with no near ties (resampled), so the double reference is the exact answer.
void check_random_tokens(const RouterParams& p, bool with_bias, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_real_distribution<float> ud(-0.2f, 0.2f);
  const int E = p.num_experts, K = p.top_k, T = 60;
  std::vector<float> bias(E);
  for (float& b : bias) b = ud(rng);
  std::vector<float> logits(size_t(T) * E);
  std::vector<std::vector<int>> ref_ids(T);
  std::vector<std::vector<double>> ref_w(T);
  for (int t = 0; t < T; ++t) {
    float* row = logits.data() + size_t(t) * E;
    do {
      for (int e = 0; e < E; ++e) row[e] = nd(rng);
    } while (!reference_route(row, with_bias ? bias.data() : nullptr, p, ref_ids[t], ref_w[t]));
  }
  const Routed r = run(logits, with_bias ? &bias : nullptr, T, p);
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < K; ++j) {
      ASSERT_EQ(r.ids[size_t(t) * K + j], ref_ids[t][j]) << "token " << t << " slot " << j;
      EXPECT_NEAR(r.w[size_t(t) * K + j], ref_w[t][j], 1e-6 * std::max(1.0, ref_w[t][j]))
          << "token " << t << " slot " << j;
    }
  }
}

int ulp_distance(float a, float b) {
  const int32_t ia = int32_t(float_to_bits(a)), ib = int32_t(float_to_bits(b));
  return std::abs(ia - ib);
}

}  // namespace

TEST(RoutingMath, ExpWithinTwoUlpOverTheWholeRange) {
  int worst = 0;
  for (double x = -87.0; x <= 88.7; x += 0.0137) {  // normal results
    const float xf = float(x);
    const float want = float(std::exp(double(xf)));  // correctly rounded (double has headroom)
    worst = std::max(worst, ulp_distance(math::exp_f32(xf), want));
  }
  EXPECT_LE(worst, 2);
  // Subnormal results: absolute error within one subnormal step of the rounded value.
  for (double x = -103.9; x < -87.4; x += 0.0371) {
    const float xf = float(x);
    EXPECT_LE(ulp_distance(math::exp_f32(xf), float(std::exp(double(xf)))), 1) << x;
  }
  EXPECT_EQ(math::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(math::exp_f32(-200.0f), 0.0f);
  EXPECT_EQ(math::exp_f32(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isinf(math::exp_f32(89.0f)));
  EXPECT_TRUE(std::isinf(math::exp_f32(INFINITY)));
  EXPECT_TRUE(std::isnan(math::exp_f32(NAN)));
}

TEST(RoutingMath, SigmoidMatchesDoubleAndSaturates) {
  for (double x = -30.0; x <= 30.0; x += 0.01) {
    const float xf = float(x);
    const double want = sigmoid_d(xf);
    EXPECT_NEAR(math::sigmoid_f32(xf), want, 4e-7 * want) << x;  // exp, add, divide: ~3 ulp
  }
  EXPECT_EQ(math::sigmoid_f32(0.0f), 0.5f);
  EXPECT_EQ(math::sigmoid_f32(20.0f), 1.0f);  // float32 saturates, like the reference
  EXPECT_EQ(math::sigmoid_f32(-200.0f), 0.0f);
}

TEST(RoutingMath, WarpOrderSumIsTheSum) {
  std::vector<float> v(300);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i % 17) - 3.0f;  // small ints: exact
  double want = 0;
  for (float x : v) want += x;
  EXPECT_EQ(math::warp_order_sum(v.data(), int(v.size())), float(want));
  EXPECT_EQ(math::warp_order_sum(v.data(), 1), v[0]);
}

TEST(Router, TiesGoToTheLowestExpertIndex) {
  RouterParams p;
  p.num_experts = 8;
  p.top_k = 3;
  // Experts 2, 4 and 6 share the best logit, 5 and 7 the second best.
  const std::vector<float> logits = {0.1f, -1.0f, 3.0f, 0.0f, 3.0f, 2.0f, 3.0f, 2.0f};
  Routed r = run(logits, nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 4, 6}));
  for (float w : r.w) EXPECT_NEAR(w, 1.0 / 3.0, 1e-7);
  p.top_k = 5;
  r = run(logits, nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 4, 6, 5, 7}));
  // All equal: the first k experts, in index order.
  p.top_k = 4;
  r = run(std::vector<float>(8, 0.25f), nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(Router, SaturatedSigmoidScoresTieInFloat32) {
  // sigmoid(20), sigmoid(30), sigmoid(40) are all exactly 1.0f: a float32 tie, lowest index wins
  // even though the logits differ (what the float32 reference does too).
  RouterParams p;
  p.num_experts = 4;
  p.top_k = 2;
  const Routed r = run({20.0f, 30.0f, 25.0f, 40.0f}, nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(r.w[0], 0.5f);
  EXPECT_EQ(r.w[1], 0.5f);
}

TEST(Router, GroupMaskingChangesThePick) {
  // 4 groups of 2. Expert 0 has the best single score, but its group (0: 0.993 + 0.007) loses to
  // group 1 (2 x 0.881) and group 2 (2 x 0.818) when only 2 groups are kept.
  const std::vector<float> logits = {5.0f, -5.0f, 2.0f, 2.0f, 1.5f, 1.5f, -3.0f, -3.0f};
  RouterParams p;
  p.num_experts = 8;
  p.top_k = 2;
  p.routed_scaling_factor = 2.5f;
  Routed flat = run(logits, nullptr, 1, p);
  EXPECT_EQ(flat.ids, (std::vector<int32_t>{0, 2}));
  p.n_group = 4;
  p.topk_group = 2;
  Routed grouped = run(logits, nullptr, 1, p);
  EXPECT_EQ(grouped.ids, (std::vector<int32_t>{2, 3}));
  EXPECT_NEAR(grouped.w[0], 1.25, 1e-6);  // equal scores, renormalised, times 2.5
  EXPECT_NEAR(grouped.w[1], 1.25, 1e-6);
  // Keeping 3 groups: group 3 (2 x 0.047) is out, expert 0 is back.
  p.topk_group = 3;
  grouped = run(logits, nullptr, 1, p);
  EXPECT_EQ(grouped.ids, (std::vector<int32_t>{0, 2}));
  // The group score is a top-2 SUM: group 0 = {0.9, 0.9 - eps} beats group 1 = {0.99, 0.01}.
  p.num_experts = 4;
  p.n_group = 2;
  p.topk_group = 1;
  p.top_k = 1;
  const float a = std::log(0.9f / 0.1f), b = std::log(0.89f / 0.11f);
  const float c = std::log(0.99f / 0.01f), d = std::log(0.01f / 0.99f);
  grouped = run({a, b, c, d}, nullptr, 1, p);
  EXPECT_EQ(grouped.ids, (std::vector<int32_t>{0}));
}

TEST(Router, BiasChangesThePickButNotTheWeight) {
  RouterParams p;
  p.num_experts = 4;
  p.top_k = 2;
  p.routed_scaling_factor = 2.5f;
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  Routed r = run(logits, nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  const std::vector<float> bias = {0.0f, 0.0f, 3.0f, 0.0f};  // lifts expert 2 to the top
  r = run(logits, &bias, 1, p);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{2, 0}));
  const double s2 = sigmoid_d(0.0), s0 = sigmoid_d(2.0);  // unbiased scores give the weights
  EXPECT_NEAR(r.w[0], 2.5 * s2 / (s2 + s0), 1e-6);
  EXPECT_NEAR(r.w[1], 2.5 * s0 / (s2 + s0), 1e-6);
}

TEST(Router, WithoutNormalisationWeightsAreScaledScores) {
  RouterParams p;
  p.num_experts = 4;
  p.top_k = 2;
  p.norm_topk_prob = false;
  p.routed_scaling_factor = 2.0f;
  const Routed r = run({0.5f, -2.0f, 1.5f, 0.0f}, nullptr, 1, p);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{2, 0}));
  EXPECT_NEAR(r.w[0], 2.0 * sigmoid_d(1.5), 1e-6);
  EXPECT_NEAR(r.w[1], 2.0 * sigmoid_d(0.5), 1e-6);
}

TEST(Router, SoftmaxTopKMatchesTheDirectFormula) {
  // Qwen3: softmax over all experts, top-k, renormalise. Expected values straight from the
  // formula in double: w_j = exp(l_j) / sum_{i in top-k} exp(l_i).
  RouterParams p;
  p.scoring = Scoring::Softmax;
  p.num_experts = 6;
  p.top_k = 2;
  const std::vector<float> logits = {0.3f, 1.7f, -0.4f, 2.2f, 1.7f, 0.0f};
  Routed r = run(logits, nullptr, 1, p);
  ASSERT_EQ(r.ids, (std::vector<int32_t>{3, 1}));  // 1 and 4 tie: 1 wins
  const double e3 = std::exp(2.2), e1 = std::exp(1.7);
  EXPECT_NEAR(r.w[0], e3 / (e3 + e1), 1e-6);
  EXPECT_NEAR(r.w[1], e1 / (e3 + e1), 1e-6);
  p.norm_topk_prob = false;  // plain probabilities
  r = run(logits, nullptr, 1, p);
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  EXPECT_NEAR(r.w[0], e3 / z, 1e-6);
  EXPECT_NEAR(r.w[1], e1 / z, 1e-6);
}

TEST(Router, RandomSigmoidGroupedWithBiasMatchesDoubleReference) {
  RouterParams p;
  p.num_experts = 64;
  p.top_k = 6;
  p.n_group = 8;
  p.topk_group = 3;
  p.routed_scaling_factor = 2.5f;
  check_random_tokens(p, true, 1234);
  p.n_group = 1;
  p.topk_group = 1;
  p.norm_topk_prob = false;
  check_random_tokens(p, true, 99);
}

TEST(Router, RandomSoftmaxMatchesDoubleReference) {
  RouterParams p;
  p.scoring = Scoring::Softmax;
  p.num_experts = 60;
  p.top_k = 8;
  check_random_tokens(p, false, 4321);
}

TEST(Router, NanLogitsNeverProduceInvalidIds) {
  RouterParams p;
  p.num_experts = 6;
  p.top_k = 3;
  Routed r = run({NAN, 0.5f, NAN, -1.0f, 2.0f, NAN}, nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{4, 1, 3}));  // NaN ranks below every number
  p.top_k = 5;
  r = run({NAN, 0.5f, NAN, -1.0f, 2.0f, NAN}, nullptr, 1, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{4, 1, 3, 0, 2}));  // then NaNs, lowest index first
}

TEST(Router, ManyTokensAreIndependent) {
  RouterParams p;
  p.num_experts = 16;
  p.top_k = 4;
  p.n_group = 4;
  p.topk_group = 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int T = 19;
  std::vector<float> logits(size_t(T) * 16);
  for (float& v : logits) v = nd(rng);
  const Routed all = run(logits, nullptr, T, p);
  for (int t = 0; t < T; ++t) {
    const std::vector<float> one(logits.begin() + t * 16, logits.begin() + (t + 1) * 16);
    const Routed r = run(one, nullptr, 1, p);
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(all.ids[t * 4 + j], r.ids[j]);
      EXPECT_EQ(all.w[t * 4 + j], r.w[j]);
    }
    std::vector<int32_t> sorted(all.ids.begin() + t * 4, all.ids.begin() + t * 4 + 4);
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "distinct ids";
  }
  int32_t untouched = 5;
  float w = 0;
  route_cpu(nullptr, nullptr, 0, p, &untouched, &w);  // T = 0 writes nothing
  EXPECT_EQ(untouched, 5);
}

TEST(Router, InvalidParametersAreRefused) {
  auto params = [](int E, int k, int ng, int kg) {
    RouterParams p;
    p.num_experts = E;
    p.top_k = k;
    p.n_group = ng;
    p.topk_group = kg;
    return p;
  };
  EXPECT_NO_THROW(validate_router_params(params(256, 8, 8, 4)));
  EXPECT_THROW(validate_router_params(params(0, 1, 1, 1)), Error);
  EXPECT_THROW(validate_router_params(params(8, 9, 1, 1)), Error);    // k > E
  EXPECT_THROW(validate_router_params(params(64, 33, 1, 1)), Error);  // k > 32
  EXPECT_THROW(validate_router_params(params(10, 2, 4, 2)), Error);   // E % n_group
  EXPECT_THROW(validate_router_params(params(8, 1, 8, 2)), Error);    // groups of 1
  EXPECT_THROW(validate_router_params(params(16, 2, 4, 5)), Error);   // topk_group > n_group
  EXPECT_THROW(validate_router_params(params(16, 5, 4, 1)), Error);   // k > kept experts
  RouterParams p = params(8, 2, 1, 1);
  p.routed_scaling_factor = 0.0f;
  EXPECT_THROW(validate_router_params(p), Error);
  p.routed_scaling_factor = NAN;
  EXPECT_THROW(validate_router_params(p), Error);
  try {
    validate_router_params(params(10, 2, 4, 2));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_group"), std::string::npos) << e.what();
  }
}

TEST(RouterLogits, MatchDoubleDotProducts) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const int T = 3, H = 300, E = 5;  // H not a multiple of 8 or 256: partial blocks
  std::vector<float> x(size_t(T) * H);
  std::vector<uint16_t> w(size_t(E) * H);
  for (float& v : x) v = nd(rng);
  for (uint16_t& v : w) v = float_to_bf16(0.05f * nd(rng));
  std::vector<float> logits(size_t(T) * E);
  router_logits_cpu(x.data(), w.data(), T, H, E, logits.data());
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) {
      double dot = 0, mag = 0;
      for (int h = 0; h < H; ++h) {
        const double term = double(x[t * H + h]) * bf16_to_float(w[e * H + h]);
        dot += term;
        mag += std::fabs(term);
      }
      EXPECT_NEAR(logits[t * E + e], dot, 2e-6 * mag) << t << "," << e;
    }
  }
}

TEST(RouterLogits, OverloadsAgreeBitForBit) {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd;
  const int T = 4, H = 264, E = 7;
  std::vector<uint16_t> xb(size_t(T) * H), wb(size_t(E) * H);
  for (uint16_t& v : xb) v = float_to_bf16(nd(rng));
  for (uint16_t& v : wb) v = float_to_bf16(0.1f * nd(rng));
  std::vector<float> xf(xb.size()), wf(wb.size());
  for (size_t i = 0; i < xb.size(); ++i) xf[i] = bf16_to_float(xb[i]);
  for (size_t i = 0; i < wb.size(); ++i) wf[i] = bf16_to_float(wb[i]);
  std::vector<float> a(size_t(T) * E), b(a.size()), c(a.size());
  router_logits_cpu(xb.data(), wb.data(), T, H, E, a.data());
  router_logits_cpu(xf.data(), wb.data(), T, H, E, b.data());
  router_logits_cpu(xf.data(), wf.data(), T, H, E, c.data());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(float_to_bits(a[i]), float_to_bits(b[i]));
    EXPECT_EQ(float_to_bits(a[i]), float_to_bits(c[i]));
  }
}
