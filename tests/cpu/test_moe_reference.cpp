// The CPU reference MoE layer against a direct per-token double-precision loop written here, and
// the layout pipeline (permute -> per-expert rows -> combine) against the direct expert sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "moe/moe_reference.h"
#include "moe/token_layout.h"
#include "moe/token_movement.h"

using namespace tetra;
using namespace tetra::moe;

namespace {

std::vector<float> randn(size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// One expert in double: down(silu(gate x) * up x). w13 [2I, H], w2 [H, I].
std::vector<double> expert_d(const float* w13, const float* w2, int H, int I, const float* x) {
  std::vector<double> act(I), y(H, 0.0);
  for (int i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int h = 0; h < H; ++h) {
      g += double(w13[size_t(i) * H + h]) * x[h];
      u += double(w13[size_t(I + i) * H + h]) * x[h];
    }
    act[i] = g / (1.0 + std::exp(-g)) * u;
  }
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < I; ++i) y[h] += double(w2[size_t(h) * I + i]) * act[i];
  return y;
}

struct Weights {
  int E, H, I, Is;
  std::vector<float> gate, bias, w13, w2, s13, s2;
};

Weights make_weights(int E, int H, int I, int Is, std::mt19937& rng) {
  Weights w{E, H, I, Is, {}, {}, {}, {}, {}, {}};
  w.gate = randn(size_t(E) * H, 0.5f, rng);
  w.bias = randn(E, 0.1f, rng);
  w.w13 = randn(size_t(E) * 2 * I * H, 0.3f, rng);
  w.w2 = randn(size_t(E) * H * I, 0.3f, rng);
  w.s13 = randn(size_t(2) * Is * H, 0.3f, rng);
  w.s2 = randn(size_t(H) * Is, 0.3f, rng);
  return w;
}

// Routing of one token in double from the logits, by sorting. Asserts the data has no near ties.
void route_d(const std::vector<double>& logits, const float* bias, const RouterParams& p,
             std::vector<int>& ids, std::vector<double>& w) {
  const int E = p.num_experts;
  std::vector<double> s(E), sel(E);
  if (p.scoring == Scoring::Sigmoid) {
    for (int e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-logits[e]));
  } else {
    const double m = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (int e = 0; e < E; ++e) z += std::exp(logits[e] - m);
    for (int e = 0; e < E; ++e) s[e] = std::exp(logits[e] - m) / z;
  }
  for (int e = 0; e < E; ++e) sel[e] = s[e] + (bias ? bias[e] : 0.0);
  std::vector<int> cand;
  const int gs = E / p.n_group;
  std::vector<double> gscore(p.n_group);
  for (int g = 0; g < p.n_group; ++g) {
    std::vector<double> v(sel.begin() + g * gs, sel.begin() + (g + 1) * gs);
    std::sort(v.rbegin(), v.rend());
    gscore[g] = p.n_group > 1 ? v[0] + v[1] : 0.0;
  }
  std::vector<int> groups(p.n_group);
  std::iota(groups.begin(), groups.end(), 0);
  std::stable_sort(groups.begin(), groups.end(), [&](int a, int b) { return gscore[a] > gscore[b]; });
  if (p.n_group > 1 && p.topk_group < p.n_group)
    ASSERT_GT(gscore[groups[p.topk_group - 1]] - gscore[groups[p.topk_group]], 1e-4) << "near tie";
  for (int j = 0; j < (p.n_group > 1 ? p.topk_group : 1); ++j)
    for (int e = groups[j] * gs; e < (groups[j] + 1) * gs; ++e) cand.push_back(e);
  std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return sel[a] > sel[b]; });
  for (int j = 0; j + 1 < int(cand.size()) && j < p.top_k; ++j)
    ASSERT_GT(sel[cand[j]] - sel[cand[j + 1]], 1e-5) << "near tie";
  ids.assign(cand.begin(), cand.begin() + p.top_k);
  double sum = 0;
  for (int e : ids) sum += s[e];
  w.clear();
  for (int e : ids)
    w.push_back((p.norm_topk_prob ? s[e] / (sum + 1e-20) : s[e]) * p.routed_scaling_factor);
}

void check_layer(const RouterParams& rp, bool with_bias, bool with_shared, uint32_t seed) {
  std::mt19937 rng(seed);
  const int T = 6, H = 16, I = 8, Is = 12, E = rp.num_experts, K = rp.top_k;
  const Weights w = make_weights(E, H, I, Is, rng);
  const std::vector<float> x = randn(size_t(T) * H, 1.0f, rng);
  MoeLayerF32 layer;
  layer.gate = w.gate.data();
  layer.bias = with_bias ? w.bias.data() : nullptr;
  layer.router = rp;
  layer.experts = {w.w13.data(), w.w2.data(), E, H, I};
  if (with_shared) layer.shared = {w.s13.data(), w.s2.data(), 1, H, Is};
  std::vector<float> out(size_t(T) * H, NAN);
  std::vector<int32_t> ids(size_t(T) * K, -1);
  std::vector<float> wts(size_t(T) * K);
  moe_layer_cpu(x.data(), T, layer, out.data(), ids.data(), wts.data());

  for (int t = 0; t < T; ++t) {
    const float* xt = x.data() + size_t(t) * H;
    std::vector<double> logits(E, 0.0);
    for (int e = 0; e < E; ++e)
      for (int h = 0; h < H; ++h) logits[e] += double(w.gate[size_t(e) * H + h]) * xt[h];
    std::vector<int> rid;
    std::vector<double> rw;
    ASSERT_NO_FATAL_FAILURE(route_d(logits, layer.bias, rp, rid, rw));
    std::vector<double> want(H, 0.0);
    for (int j = 0; j < K; ++j) {
      ASSERT_EQ(ids[size_t(t) * K + j], rid[j]) << "token " << t << " slot " << j;
      EXPECT_NEAR(wts[size_t(t) * K + j], rw[j], 1e-5) << "token " << t << " slot " << j;
      const std::vector<double> y = expert_d(w.w13.data() + size_t(rid[j]) * 2 * I * H,
                                             w.w2.data() + size_t(rid[j]) * H * I, H, I, xt);
      for (int h = 0; h < H; ++h) want[h] += rw[j] * y[h];
    }
    if (with_shared) {
      const std::vector<double> y = expert_d(w.s13.data(), w.s2.data(), H, Is, xt);
      for (int h = 0; h < H; ++h) want[h] += y[h];  // shared expert: unweighted
    }
    for (int h = 0; h < H; ++h)
      EXPECT_NEAR(out[size_t(t) * H + h], want[h], 1e-4 * (1.0 + std::fabs(want[h])))
          << "token " << t << " h " << h;
  }
}

}  // namespace

TEST(MoeReference, SigmoidGroupedLayerWithSharedExpertMatchesDoubleLoop) {
  RouterParams rp;
  rp.num_experts = 8;
  rp.top_k = 2;
  rp.n_group = 4;
  rp.topk_group = 2;
  rp.routed_scaling_factor = 2.5f;
  check_layer(rp, true, true, 2024);
}

TEST(MoeReference, SoftmaxLayerWithoutSharedExpertMatchesDoubleLoop) {
  RouterParams rp;
  rp.scoring = Scoring::Softmax;
  rp.num_experts = 6;
  rp.top_k = 3;
  check_layer(rp, false, false, 77);
}

TEST(MoeReference, SharedExpertIsAddedUnweighted) {
  // Same layer with and without the shared expert: the difference is exactly Shared(x).
  std::mt19937 rng(3);
  const int T = 2, H = 8, I = 4, Is = 6, E = 4;
  const Weights w = make_weights(E, H, I, Is, rng);
  const std::vector<float> x = randn(size_t(T) * H, 1.0f, rng);
  MoeLayerF32 layer;
  layer.gate = w.gate.data();
  layer.router.num_experts = E;
  layer.router.top_k = 2;
  layer.router.routed_scaling_factor = 3.0f;
  layer.experts = {w.w13.data(), w.w2.data(), E, H, I};
  std::vector<float> routed(size_t(T) * H), both(size_t(T) * H);
  moe_layer_cpu(x.data(), T, layer, routed.data());
  layer.shared = {w.s13.data(), w.s2.data(), 1, H, Is};
  moe_layer_cpu(x.data(), T, layer, both.data());
  for (int t = 0; t < T; ++t) {
    const std::vector<double> s = expert_d(w.s13.data(), w.s2.data(), H, Is, x.data() + t * H);
    for (int h = 0; h < H; ++h)
      EXPECT_NEAR(both[t * H + h] - routed[t * H + h], s[h], 1e-4 * (1.0 + std::fabs(s[h])));
  }
}

TEST(MoeReference, LayoutPipelineEqualsDirectExpertSum) {
  // permute -> each expert runs on its RowRange only -> combine, for both layouts: the one
  // mechanism the grouped GEMMs use must reproduce the direct per-token sum.
  std::mt19937 rng(9);
  const int T = 19, H = 12, I = 6, E = 5, K = 2;
  const Weights w = make_weights(E, H, I, 1, rng);
  const ExpertMlpF32 experts{w.w13.data(), w.w2.data(), E, H, I};
  const std::vector<float> x = randn(size_t(T) * H, 1.0f, rng);
  std::vector<int32_t> ids(size_t(T) * K);
  std::vector<float> wts(size_t(T) * K);
  std::uniform_int_distribution<int> ue(0, E - 1);
  std::uniform_real_distribution<float> uw(0.1f, 1.0f);
  for (int t = 0; t < T; ++t) {
    ids[t * K] = ue(rng);
    ids[t * K + 1] = (ids[t * K] + 1 + ue(rng) % (E - 1)) % E;  // distinct from the first
    wts[t * K] = uw(rng);
    wts[t * K + 1] = uw(rng);
  }
  std::vector<float> direct(size_t(T) * H);
  moe_experts_cpu(x.data(), T, ids.data(), wts.data(), K, experts, direct.data());

  auto run_layout = [&](const std::vector<int32_t>& slot_of, const std::vector<RowRange>& ranges,
                        int num_rows) {
    std::vector<float> rows(size_t(num_rows) * H, NAN), ys(size_t(num_rows) * H, NAN);
    permute_rows_cpu(x.data(), T, H, K, slot_of.data(), rows.data());
    for (int e = 0; e < E; ++e)
      for (int r = ranges[e].start; r < ranges[e].start + ranges[e].count; ++r)
        expert_mlp_cpu(experts, e, rows.data() + size_t(r) * H, ys.data() + size_t(r) * H);
    std::vector<float> out(size_t(T) * H);
    combine_f32_cpu(ys.data(), T, H, K, slot_of.data(), wts.data(), out.data());
    return out;
  };
  const ContiguousLayout c = build_contiguous_cpu(ids.data(), T, K, E);
  const MaskedLayout m = build_masked_cpu(ids.data(), T, K, E, T);
  const std::vector<float> via_c = run_layout(c.slot_of, c.expert_rows(), c.num_rows());
  const std::vector<float> via_m = run_layout(m.slot_of, m.expert_rows(), m.num_rows());
  for (size_t i = 0; i < direct.size(); ++i) {
    ASSERT_NEAR(via_c[i], direct[i], 1e-5 * (1.0 + std::fabs(direct[i]))) << i;
    ASSERT_NEAR(via_m[i], direct[i], 1e-5 * (1.0 + std::fabs(direct[i]))) << i;
  }
}

TEST(MoeReference, InconsistentWeightsAreRefused) {
  std::mt19937 rng(1);
  const Weights w = make_weights(4, 8, 4, 4, rng);
  const std::vector<float> x(8, 1.0f);
  std::vector<float> out(8);
  MoeLayerF32 layer;
  layer.gate = w.gate.data();
  layer.router.num_experts = 4;
  layer.router.top_k = 2;
  layer.experts = {w.w13.data(), w.w2.data(), 3, 8, 4};  // 3 experts, router says 4
  EXPECT_THROW(moe_layer_cpu(x.data(), 1, layer, out.data()), Error);
  layer.experts.num_experts = 4;
  layer.shared = {w.s13.data(), w.s2.data(), 2, 8, 4};  // shared must be one MLP
  EXPECT_THROW(moe_layer_cpu(x.data(), 1, layer, out.data()), Error);
  layer.shared = {};
  layer.gate = nullptr;
  EXPECT_THROW(moe_layer_cpu(x.data(), 1, layer, out.data()), Error);
  layer.gate = w.gate.data();
  const std::vector<int32_t> bad_ids = {0, 4};
  const std::vector<float> wts = {0.5f, 0.5f};
  EXPECT_THROW(moe_experts_cpu(x.data(), 1, bad_ids.data(), wts.data(), 2, layer.experts,
                               out.data()),
               Error);
  EXPECT_NO_THROW(moe_layer_cpu(x.data(), 1, layer, out.data()));
}
