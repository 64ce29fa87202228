#include "moe/moe_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace tetra::moe {

namespace {

void check_mlp(const char* what, const ExpertMlpF32& w) {
  if (!w.w13 || !w.w2) TETRA_FAIL("moe reference: ", what, " weights are missing");
  if (w.num_experts < 1 || w.hidden < 1 || w.inter < 1)
    TETRA_FAIL("moe reference: ", what, " has bad sizes E=", w.num_experts, " H=", w.hidden,
               " I=", w.inter);
}

float silu(float g) { return g / (1.0f + std::exp(-g)); }

}  // namespace

void expert_mlp_cpu(const ExpertMlpF32& w, int e, const float* x, float* y) {
  TETRA_CHECK(e >= 0 && e < w.num_experts, "expert ", e, " of ", w.num_experts);
  const int H = w.hidden, I = w.inter;
  const float* w13 = w.w13 + size_t(e) * 2 * I * H;  // [2I, H]
  const float* w2 = w.w2 + size_t(e) * H * I;        // [H, I]
  std::vector<float> act(I);                         // [I] silu(gate x) * (up x)
  for (int i = 0; i < I; ++i) {
    float g = 0.0f, u = 0.0f;
    for (int h = 0; h < H; ++h) {
      g += w13[size_t(i) * H + h] * x[h];
      u += w13[size_t(I + i) * H + h] * x[h];
    }
    act[i] = silu(g) * u;
  }
  for (int h = 0; h < H; ++h) {
    float acc = 0.0f;
    for (int i = 0; i < I; ++i) acc += w2[size_t(h) * I + i] * act[i];
    y[h] = acc;
  }
}

void moe_experts_cpu(const float* x, int T, const int32_t* ids, const float* weights, int top_k,
                     const ExpertMlpF32& w, float* out) {
  check_mlp("routed experts", w);
  TETRA_CHECK(T >= 0 && top_k >= 1, "T=", T, " top_k=", top_k);
  const int H = w.hidden;
  std::vector<float> y(H);  // [H] one expert's output
  for (int t = 0; t < T; ++t) {
    float* o = out + size_t(t) * H;
    for (int h = 0; h < H; ++h) o[h] = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const int32_t e = ids[size_t(t) * top_k + j];
      if (e < 0 || e >= w.num_experts)
        TETRA_FAIL("moe reference: expert id ", e, " of token ", t, " outside [0, ",
                   w.num_experts, ")");
      expert_mlp_cpu(w, e, x + size_t(t) * H, y.data());
      const float wj = weights[size_t(t) * top_k + j];
      for (int h = 0; h < H; ++h) o[h] += wj * y[h];
    }
  }
}

void moe_layer_cpu(const float* x, int T, const MoeLayerF32& layer, float* out, int32_t* ids_out,
                   float* weights_out) {
  const RouterParams& rp = layer.router;
  validate_router_params(rp);
  check_mlp("routed experts", layer.experts);
  if (!layer.gate) TETRA_FAIL("moe reference: router gate weight is missing");
  if (layer.experts.num_experts != rp.num_experts)
    TETRA_FAIL("moe reference: ", layer.experts.num_experts, " expert weights but the router has ",
               rp.num_experts, " experts");
  const bool has_shared = layer.shared.num_experts != 0;
  if (has_shared) {
    check_mlp("shared expert", layer.shared);
    if (layer.shared.num_experts != 1 || layer.shared.hidden != layer.experts.hidden)
      TETRA_FAIL("moe reference: shared expert must be one MLP of hidden ", layer.experts.hidden);
  }
  const int H = layer.experts.hidden, E = rp.num_experts, K = rp.top_k;
  std::vector<float> logits(size_t(T) * E);  // [T, E]
  router_logits_cpu(x, layer.gate, T, H, E, logits.data());
  std::vector<int32_t> ids(size_t(T) * K);  // [T, K]
  std::vector<float> w(size_t(T) * K);      // [T, K]
  route_cpu(logits.data(), layer.bias, T, rp, ids.data(), w.data());
  moe_experts_cpu(x, T, ids.data(), w.data(), K, layer.experts, out);
  if (has_shared) {
    std::vector<float> y(H);  // [H]
    for (int t = 0; t < T; ++t) {
      expert_mlp_cpu(layer.shared, 0, x + size_t(t) * H, y.data());
      for (int h = 0; h < H; ++h) out[size_t(t) * H + h] += y[h];
    }
  }
  if (ids_out) std::copy(ids.begin(), ids.end(), ids_out);
  if (weights_out) std::copy(w.begin(), w.end(), weights_out);
}

}  // namespace tetra::moe
