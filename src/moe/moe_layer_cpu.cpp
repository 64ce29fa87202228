// The cpu MoE layer backend: float32 loops on dequantized weights, rounding where the GPU path
// rounds (see moe_layer.h), so that it is the yardstick the CUDA backends are held to.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/parallel.h"
#include "format/nvfp4.h"
#include "moe/moe_layer.h"
#include "moe/token_movement.h"
#include "moe/w4a4_reference.h"

namespace tetra::moe {
namespace {

void bf16_to_f32(const uint16_t* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

void dequantize_matrix(const Nvfp4MatrixView& m, float* out) {
  nvfp4::dequantize_weight(m.weight, m.scale, m.scale_2, m.n, m.k, out);
}

// a . b over n floats; 8 interleaved partial sums (a fixed order, faster than one chain).
float dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// One MLP in float32 with the GPU's rounding of the intermediate to bf16.
//   w13 [2I, H], w2 [H, I], x [H], act [I] scratch, y [H]
void mlp_forward(const float* w13, const float* w2, int H, int I, const float* x, float* act,
                 float* y) {
  for (int i = 0; i < I; ++i) {
    const float g = dot(w13 + size_t(i) * H, x, H);
    const float u = dot(w13 + size_t(I + i) * H, x, H);
    act[i] = bf16_to_float(float_to_bf16(g / (1.0f + std::exp(-g)) * u));
  }
  for (int h = 0; h < H; ++h) y[h] = dot(w2 + size_t(h) * I, act, I);
}

struct MlpF32 {
  int inter = 0;
  std::vector<float> w13;  // [2I, H]
  std::vector<float> w2;   // [H, I]
  bool w4a4 = false;       // NVFP4 activations (the cpu twin of cuda-w4a4)
  W4a4MlpScales scales;    // when w4a4
};

// One MLP with W4A4 numerics: exactly the reference's per-row functions (moe/w4a4_reference.h),
// so this twin and the reference cannot drift apart. x [H] bf16, act [I] scratch, y [H].
void mlp_forward_w4a4(const MlpF32& m, int H, const uint16_t* x, float* act, float* y) {
  ExpertMlpF32 one;
  one.w13 = m.w13.data();
  one.w2 = m.w2.data();
  one.num_experts = 1;
  one.hidden = H;
  one.inter = m.inter;
  w4a4_gemm1_row_cpu(one, 0, x, m.scales.gate_up, m.scales.down, act);
  w4a4_gemm2_row_cpu(one, 0, act, m.scales.down, y);
}

class CpuMoeLayer final : public MoeLayerRunner {
 public:
  CpuMoeLayer(const MoeLayerWeights& w, int max_tokens, bool w4a4)
      : name_(w.name), H_(w.hidden), I_(w.inter), max_tokens_(max_tokens), router_(w.router),
        expert_begin_(w.expert_begin) {
    if (w4a4 && !layer_has_input_scales(w))
      TETRA_FAIL(name_, ": W4A4 numerics need input_scale on every routed expert linear");
    gate_ = router_weight_bf16(w);
    if (w.bias) bias_.assign(w.bias, w.bias + router_.num_experts);
    const int E = int(w.experts.size());  // local block
    experts_.resize(size_t(E));
    parallel_for(E, 1, [&](int64_t b, int64_t e_end) {
      for (int64_t e = b; e < e_end; ++e)
        experts_[size_t(e)] = load(w.experts[size_t(e)], I_, w4a4,
                                   str(name_, ".experts.", expert_begin_ + e));
    });
    if (w.shared) {
      const int Is = w.shared->format == ExpertFormat::NVFP4 ? w.shared->gate.n
                                                             : w.shared->gate_bf16.n;
      // The shared expert goes W4A4 only when it carries its own input scales.
      shared_ = load(*w.shared, Is, w4a4 && mlp_has_input_scales(*w.shared),
                     name_ + ".shared_experts");
      has_shared_ = true;
    }
  }

  const std::string& backend() const override { return backend_; }
  bool on_device() const override { return false; }
  int max_tokens() const override { return max_tokens_; }

  void forward(const uint16_t* x, int T, uint16_t* out, const uint16_t* residual,
               cudaStream_t) override {
    if (T < 0 || T > max_tokens_)
      TETRA_FAIL(name_, ": forward with ", T, " tokens; the layer was built for 0..", max_tokens_);
    if (T == 0) return;
    const int E = router_.num_experts, K = router_.top_k, H = H_;  // E = E_global
    std::vector<float> logits(size_t(T) * E);  // [T, E]
    router_logits_cpu(x, gate_.data(), T, H, E, logits.data());
    std::vector<int32_t> ids(size_t(T) * K);   // [T, K]
    std::vector<float> weights(size_t(T) * K); // [T, K]
    route_cpu(logits.data(), bias_.empty() ? nullptr : bias_.data(), T, router_, ids.data(),
              weights.data());

    // The pairs whose expert this block holds (all of them unless expert-parallel); the others
    // get slot -1, which the combine skips.
    std::vector<int32_t> slot_of(size_t(T) * K, -1);  // [T*K] row of pair p (= p) or -1
    std::vector<int32_t> local_pairs;                 // [<= T*K] pair indices, ascending
    local_pairs.reserve(slot_of.size());
    const int E_local = int(experts_.size());
    for (size_t p = 0; p < slot_of.size(); ++p) {
      const int e = ids[p] - expert_begin_;
      if (e >= 0 && e < E_local) {
        slot_of[p] = int32_t(p);
        local_pairs.push_back(int32_t(p));
      }
    }
    const int64_t n_routed = int64_t(local_pairs.size());
    std::vector<float> rows(size_t(T) * K * H);   // [T*K, H] expert outputs, pair order
    std::vector<uint16_t> shared;                 // [T, H] bf16 shared-expert output
    if (has_shared_) shared.resize(size_t(T) * H);
    const int64_t jobs = n_routed + (has_shared_ ? T : 0);
    parallel_for(jobs, 1, [&](int64_t b, int64_t e_end) {
      std::vector<float> xf(static_cast<size_t>(H)), y(static_cast<size_t>(H));  // [H]
      std::vector<float> act(size_t(std::max(I_, shared_.inter)));  // [I]
      for (int64_t job = b; job < e_end; ++job) {
        const bool routed = job < n_routed;
        const int pair = routed ? local_pairs[size_t(job)] : -1;
        const int t = routed ? pair / K : int(job - n_routed);
        bf16_to_f32(x + size_t(t) * H, size_t(H), xf.data());
        const MlpF32& m = routed ? experts_[size_t(ids[size_t(pair)] - expert_begin_)] : shared_;
        float* dst = routed ? rows.data() + size_t(pair) * H : y.data();
        if (m.w4a4)
          mlp_forward_w4a4(m, H, x + size_t(t) * H, act.data(), dst);
        else
          mlp_forward(m.w13.data(), m.w2.data(), H, m.inter, xf.data(), act.data(), dst);
        if (!routed) {
          for (int h = 0; h < H; ++h) shared[size_t(t) * H + h] = float_to_bf16(y[size_t(h)]);
        }
      }
    });
    combine_bf16_cpu(rows.data(), DType::F32, T, H, K, slot_of.data(), weights.data(),
                     has_shared_ ? shared.data() : nullptr, residual, out);
  }

 private:
  MlpF32 load(const ExpertMlpView& v, int I, bool w4a4, const std::string& mlp_name) const {
    MlpF32 m;
    m.inter = I;
    m.w4a4 = w4a4;
    if (w4a4) m.scales = w4a4_mlp_scales(v, mlp_name);
    m.w13.resize(size_t(2) * I * H_);
    m.w2.resize(size_t(H_) * I);
    dequantize_mlp(v, H_, I, m.w13.data(), m.w2.data());
    return m;
  }

  std::string name_, backend_ = "cpu";
  int H_, I_, max_tokens_;
  RouterParams router_;         // num_experts = E_global
  int expert_begin_ = 0;        // global id of experts_[0]
  std::vector<uint16_t> gate_;  // [E_global, H] bf16
  std::vector<float> bias_;     // [E_global] or empty
  std::vector<MlpF32> experts_; // [E_local]
  MlpF32 shared_;
  bool has_shared_ = false;
};

}  // namespace

std::vector<uint16_t> router_weight_bf16(const MoeLayerWeights& w) {
  const size_t n = size_t(w.router.num_experts) * size_t(w.hidden);
  std::vector<uint16_t> out(n);  // [E, H]
  if (w.gate_dtype == DType::BF16) {
    const auto* g = static_cast<const uint16_t*>(w.gate);
    std::copy(g, g + n, out.begin());
  } else {
    const auto* g = static_cast<const float*>(w.gate);
    for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(g[i]);
  }
  return out;
}

void dequantize_mlp(const ExpertMlpView& m, int H, int I, float* w13, float* w2) {
  if (m.format == ExpertFormat::NVFP4) {
    dequantize_matrix(m.gate, w13);
    dequantize_matrix(m.up, w13 + size_t(I) * H);
    dequantize_matrix(m.down, w2);
  } else {
    bf16_to_f32(m.gate_bf16.weight, size_t(I) * H, w13);
    bf16_to_f32(m.up_bf16.weight, size_t(I) * H, w13 + size_t(I) * H);
    bf16_to_f32(m.down_bf16.weight, size_t(H) * I, w2);
  }
}

std::unique_ptr<MoeLayerRunner> make_cpu_moe_layer(const MoeLayerWeights& w, int max_tokens,
                                                   bool w4a4) {
  return std::make_unique<CpuMoeLayer>(w, max_tokens, w4a4);
}

}  // namespace tetra::moe
