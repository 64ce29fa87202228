#include "moe/router.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "moe/routing_math.h"

namespace tetra::moe {

const char* scoring_name(Scoring s) { return s == Scoring::Sigmoid ? "sigmoid" : "softmax"; }

void validate_router_params(const RouterParams& p) {
  const int E = p.num_experts;
  if (E < 1) TETRA_FAIL("router: num_experts must be >= 1, got ", E);
  if (p.top_k < 1 || p.top_k > E || p.top_k > kMaxTopK)
    TETRA_FAIL("router: top_k must be in [1, min(num_experts=", E, ", ", kMaxTopK, ")], got ",
               p.top_k);
  if (p.n_group < 1 || p.n_group > kMaxGroups)
    TETRA_FAIL("router: n_group must be in [1, ", kMaxGroups, "], got ", p.n_group);
  if (E % p.n_group != 0)
    TETRA_FAIL("router: num_experts ", E, " is not divisible by n_group ", p.n_group);
  if (p.n_group > 1) {
    const int group_size = E / p.n_group;
    if (group_size < 2)
      TETRA_FAIL("router: grouped selection needs >= 2 experts per group (score = top-2 sum), "
                 "got num_experts ", E, " / n_group ", p.n_group);
    if (p.topk_group < 1 || p.topk_group > p.n_group)
      TETRA_FAIL("router: topk_group must be in [1, n_group=", p.n_group, "], got ", p.topk_group);
    if (p.top_k > p.topk_group * group_size)
      TETRA_FAIL("router: top_k ", p.top_k, " exceeds the experts in the kept groups (",
                 p.topk_group, " x ", group_size, ")");
  }
  if (!std::isfinite(p.routed_scaling_factor) || p.routed_scaling_factor <= 0.0f)
    TETRA_FAIL("router: routed_scaling_factor must be finite and > 0, got ",
               p.routed_scaling_factor);
}

namespace {

// Scores for one token: s (unbiased, gives the weights) and sel (biased, chooses the experts).
void token_scores(const float* logits, const float* bias, const RouterParams& p,
                  std::vector<float>& s, std::vector<float>& sel) {
  const int E = p.num_experts;
  if (p.scoring == Scoring::Sigmoid) {
    for (int e = 0; e < E; ++e) s[e] = math::sigmoid_f32(logits[e]);
  } else {
    float m = -INFINITY;  // max is exact in any order; fmaxf skips NaN like the device
    for (int e = 0; e < E; ++e) m = fmaxf(m, logits[e]);
    for (int e = 0; e < E; ++e) s[e] = math::exp_f32(logits[e] - m);
    const float sum = math::warp_order_sum(s.data(), E);
    for (int e = 0; e < E; ++e) s[e] = math::div_rn(s[e], sum);
  }
  for (int e = 0; e < E; ++e) sel[e] = math::selection_key(bias ? s[e] + bias[e] : s[e]);
}

// Marks the experts of the topk_group best groups (by top-2 sum of sel) as selectable.
void group_mask(const std::vector<float>& sel, const RouterParams& p, std::vector<char>& allowed) {
  const int group_size = p.num_experts / p.n_group;
  std::vector<float> gscore(p.n_group);  // [n_group]
  for (int g = 0; g < p.n_group; ++g) {
    float t1 = -INFINITY, t2 = -INFINITY;
    for (int e = g * group_size; e < (g + 1) * group_size; ++e) {
      const float v = sel[e];
      if (v > t1) {
        t2 = t1;
        t1 = v;
      } else if (v > t2) {
        t2 = v;
      }
    }
    gscore[g] = math::selection_key(t1 + t2);  // Inf + -Inf is NaN: ranks last
  }
  std::vector<char> kept(p.n_group, 0);
  for (int j = 0; j < p.topk_group; ++j) {
    int best = -1;
    for (int g = 0; g < p.n_group; ++g)
      if (!kept[g] && (best < 0 || math::ranks_before(gscore[g], g, gscore[best], best))) best = g;
    kept[best] = 1;
  }
  for (int e = 0; e < p.num_experts; ++e) allowed[e] = kept[e / group_size];
}

}  // namespace

void route_cpu(const float* logits, const float* bias, int T, const RouterParams& p, int32_t* ids,
               float* weights) {
  validate_router_params(p);
  TETRA_CHECK(T >= 0, "token count ", T);
  const int E = p.num_experts, K = p.top_k;
  std::vector<float> s(E), sel(E);  // [E] unbiased scores, [E] selection keys
  std::vector<char> allowed(E), taken(E);
  std::vector<float> w(K);  // [K] chosen unbiased scores
  for (int t = 0; t < T; ++t) {
    token_scores(logits + size_t(t) * E, bias, p, s, sel);
    if (p.n_group > 1) {
      group_mask(sel, p, allowed);
    } else {
      std::fill(allowed.begin(), allowed.end(), 1);
    }
    std::fill(taken.begin(), taken.end(), 0);
    int32_t* row_ids = ids + size_t(t) * K;
    for (int j = 0; j < K; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (allowed[e] && !taken[e] && (best < 0 || math::ranks_before(sel[e], e, sel[best], best)))
          best = e;
      taken[best] = 1;
      row_ids[j] = best;
      w[j] = s[best];
    }
    // Same operations, same order as the device: sequential sum, divide, then scale.
    float sum = 0.0f;
    for (int j = 0; j < K; ++j) sum = sum + w[j];
    float* row_w = weights + size_t(t) * K;
    for (int j = 0; j < K; ++j) {
      const float v = p.norm_topk_prob ? math::div_rn(w[j], sum + 1e-20f) : w[j];
      row_w[j] = math::mul_rn(v, p.routed_scaling_factor);
    }
  }
}

namespace {

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t bf16) { return bf16_to_float(bf16); }

template <typename X, typename W>
void logits_impl(const X* x, const W* w, int T, int H, int E, float* logits) {
  TETRA_CHECK(T >= 0 && H >= 1 && E >= 1, "router logits sizes T=", T, " H=", H, " E=", E);
  for (int t = 0; t < T; ++t) {
    const X* xt = x + size_t(t) * H;
    for (int e = 0; e < E; ++e) {
      const W* we = w + size_t(e) * H;
      float lane[math::kLanes] = {};
      for (int k = 0; k < H; ++k) {
        const int l = (k / 8) % math::kLanes;
        lane[l] = fmaf(to_f32(xt[k]), to_f32(we[k]), lane[l]);
      }
      for (int off = math::kLanes / 2; off >= 1; off /= 2) {
        float next[math::kLanes];
        for (int l = 0; l < math::kLanes; ++l) next[l] = lane[l] + lane[l ^ off];
        for (int l = 0; l < math::kLanes; ++l) lane[l] = next[l];
      }
      logits[size_t(t) * E + e] = lane[0];
    }
  }
}

}  // namespace

void router_logits_cpu(const float* x, const uint16_t* w_gate_bf16, int T, int H, int E,
                       float* logits) {
  logits_impl(x, w_gate_bf16, T, H, E, logits);
}
void router_logits_cpu(const uint16_t* x_bf16, const uint16_t* w_gate_bf16, int T, int H, int E,
                       float* logits) {
  logits_impl(x_bf16, w_gate_bf16, T, H, E, logits);
}
void router_logits_cpu(const float* x, const float* w_gate, int T, int H, int E, float* logits) {
  logits_impl(x, w_gate, T, H, E, logits);
}

}  // namespace tetra::moe
