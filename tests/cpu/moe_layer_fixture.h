// Random MoE layers on the host for the layer-runner tests (cpu and gpu): ModelOpt NVFP4 bytes
// (or BF16) owned here, handed out as the MoeLayerWeights views the runner takes.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "moe/moe_layer.h"

namespace tetra::test {

struct HostMatrix {
  int n = 0, k = 0;
  float s2 = 1.0f;
  std::vector<uint8_t> weight;  // [n, k/2] e2m1 pairs (NVFP4)
  std::vector<uint8_t> scale;   // [n, k/16] e4m3 block scales (NVFP4)
  std::vector<uint16_t> bf16;   // [n, k] (BF16 layers)
  std::optional<float> input_scale;  // activation global scale (W4A4 checkpoints only)
};

// Random NVFP4 matrix: uniform E2M1 codes, block scales 0.5 .. 2 (e4m3 0x30..0x40) with one in
// 64 blocks zero (an all-zero block), s2 so that rows have norm ~1 against unit inputs.
inline HostMatrix random_nvfp4(int n, int k, std::mt19937& rng) {
  HostMatrix m;
  m.n = n, m.k = k;
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  m.s2 = u(rng) / (2.5f * std::sqrt(float(k)));
  m.weight.resize(size_t(n) * k / 2);
  m.scale.resize(size_t(n) * k / 16);
  for (auto& b : m.weight) b = uint8_t(rng());
  for (auto& s : m.scale) s = rng() % 64 == 0 ? uint8_t(0) : uint8_t(0x30 + rng() % 17);
  return m;
}

inline HostMatrix random_bf16(int n, int k, std::mt19937& rng) {
  HostMatrix m;
  m.n = n, m.k = k;
  std::normal_distribution<float> d(0.0f, 1.0f / std::sqrt(float(k)));
  m.bf16.resize(size_t(n) * k);
  for (auto& v : m.bf16) v = float_to_bf16(d(rng));
  return m;
}

struct HostMlp {
  HostMatrix gate, up, down;
};

struct HostMoeLayer {
  std::string name = "model.layers.1.mlp";
  int hidden = 0, inter = 0, shared_inter = 0;
  moe::ExpertFormat format = moe::ExpertFormat::NVFP4;         // routed experts
  moe::ExpertFormat shared_format = moe::ExpertFormat::NVFP4;  // the shared expert
  moe::RouterParams router;
  std::vector<uint16_t> gate;  // [E, H] bf16
  std::vector<float> bias;     // [E] or empty
  std::vector<HostMlp> experts;  // [E]
  HostMlp shared;

  moe::ExpertMlpView view(const HostMlp& m, const std::string& prefix, moe::ExpertFormat f) const {
    moe::ExpertMlpView v;
    v.format = f;
    auto nv = [&](const HostMatrix& x, const char* what) {
      return Nvfp4MatrixView{x.weight.data(), x.scale.data(), x.s2, x.n, x.k, prefix + what,
                             x.input_scale};
    };
    auto bf = [&](const HostMatrix& x, const char* what) {
      return moe::Bf16MatrixView{x.bf16.data(), x.n, x.k, prefix + what};
    };
    if (f == moe::ExpertFormat::NVFP4) {
      v.gate = nv(m.gate, ".gate_proj"), v.up = nv(m.up, ".up_proj"), v.down = nv(m.down, ".down_proj");
    } else {
      v.gate_bf16 = bf(m.gate, ".gate_proj"), v.up_bf16 = bf(m.up, ".up_proj");
      v.down_bf16 = bf(m.down, ".down_proj");
    }
    return v;
  }

  moe::MoeLayerWeights weights() const {
    moe::MoeLayerWeights w;
    w.name = name;
    w.hidden = hidden;
    w.inter = inter;
    w.router = router;
    w.gate = gate.data();
    w.gate_dtype = DType::BF16;
    w.bias = bias.empty() ? nullptr : bias.data();
    for (size_t e = 0; e < experts.size(); ++e)
      w.experts.push_back(view(experts[e], name + ".experts." + std::to_string(e), format));
    if (shared_inter > 0) w.shared = view(shared, name + ".shared_experts", shared_format);
    return w;
  }

  // One expert-parallel rank's share: routed experts [begin, begin + count) (the router keeps
  // all of them), the shared expert only when with_shared (one rank adds it).
  moe::MoeLayerWeights block_weights(int begin, int count, bool with_shared) const {
    moe::MoeLayerWeights w = weights();
    w.experts.assign(w.experts.begin() + begin, w.experts.begin() + begin + count);
    w.expert_begin = begin;
    if (!with_shared) w.shared.reset();
    return w;
  }
};

// A random layer: router weight ~ U(-sqrt(3/H), sqrt(3/H)) (logits O(1) for unit x), optional
// correction bias ~ U(-0.05, 0.05).
inline HostMoeLayer random_layer(const moe::RouterParams& rp, int H, int I, int shared_inter,
                                 uint32_t seed, bool with_bias = true,
                                 moe::ExpertFormat format = moe::ExpertFormat::NVFP4,
                                 std::optional<moe::ExpertFormat> shared_format = std::nullopt) {
  std::mt19937 rng(seed);
  HostMoeLayer L;
  L.hidden = H, L.inter = I, L.shared_inter = shared_inter, L.router = rp, L.format = format;
  L.shared_format = shared_format.value_or(format);
  const int E = rp.num_experts;
  const float a = std::sqrt(3.0f / float(H));
  std::uniform_real_distribution<float> ug(-a, a), ub(-0.05f, 0.05f);
  L.gate.resize(size_t(E) * H);
  for (auto& g : L.gate) g = float_to_bf16(ug(rng));
  if (with_bias) {
    L.bias.resize(size_t(E));
    for (auto& b : L.bias) b = ub(rng);
  }
  auto mlp = [&](int width, moe::ExpertFormat f) {
    HostMlp m;
    if (f == moe::ExpertFormat::NVFP4) {
      m.gate = random_nvfp4(width, H, rng), m.up = random_nvfp4(width, H, rng);
      m.down = random_nvfp4(H, width, rng);
    } else {
      m.gate = random_bf16(width, H, rng), m.up = random_bf16(width, H, rng);
      m.down = random_bf16(H, width, rng);
    }
    return m;
  };
  for (int e = 0; e < E; ++e) L.experts.push_back(mlp(I, format));
  if (shared_inter > 0) L.shared = mlp(shared_inter, L.shared_format);
  return L;
}

// Gives every NVFP4 linear of the layer a W4A4 input_scale, as ModelOpt calibrates it
// (amax / (6 * 448)): x is unit normal (amax ~ 4.5), silu(g)*u reaches ~ 16 with the random
// weights above (row norms up to ~3); each scale is jittered by 0.7..1.4 so gate and up differ
// (GEMM1 takes their max) and a few blocks saturate at E4M3's 448. with_shared = false leaves the
// shared expert W4A16.
inline void add_input_scales(HostMoeLayer& L, uint32_t seed, bool with_shared = true) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> jitter(0.7f, 1.4f);
  auto give = [&](HostMlp& m) {
    m.gate.input_scale = 4.5f / (6.0f * 448.0f) * jitter(rng);
    m.up.input_scale = 4.5f / (6.0f * 448.0f) * jitter(rng);
    m.down.input_scale = 16.0f / (6.0f * 448.0f) * jitter(rng);
  };
  for (HostMlp& m : L.experts) give(m);
  if (with_shared && L.shared_inter > 0 && L.shared_format == moe::ExpertFormat::NVFP4)
    give(L.shared);
}

inline bool has_input_scales(const HostMoeLayer& L) {
  return !L.experts.empty() && L.experts[0].gate.input_scale.has_value();
}

// Unit-variance bf16 activations [T, H].
inline std::vector<uint16_t> random_x(int T, int H, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> x(size_t(T) * H);
  for (auto& v : x) v = float_to_bf16(d(rng));
  return x;
}

// sum (a-b)^2 / sum b^2 over bf16 vectors; b is the reference.
inline double nmse_bf16(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? num / den : (num > 0 ? 1.0 : 0.0);
}

}  // namespace tetra::test
