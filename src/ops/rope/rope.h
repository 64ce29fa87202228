// Rotary position embedding, CPU reference. Two pairings of the rotated dims:
//   NeoX (rotate-half): dim i pairs with i + rotary_dim/2, for i < rotary_dim/2;
//   GPT-J (interleaved): dim 2i pairs with 2i+1.
// Only the first rotary_dim dims of each head rotate (partial RoPE, e.g. GLM-4.x: 64 of 128);
// the rest pass through. Pair i turns by angle = float(pos) * inv_freq[i]:
//   a' = a cos - b sin,  b' = b cos + a sin.
// The CUDA twin is ops/rope/rope_cuda.h; both take the same float inv_freq table.
#pragma once
#include <cstdint>
#include <vector>

namespace tetra::ops {

enum class RopeStyle { NeoX, GptJ };

// Where q and k live and how they rotate. Token t's q heads start at q + t*q_stride (elements),
// [n_q_heads, head_dim] bf16 contiguous; likewise k (k may be null: rotate q only). The strides
// let q and k sit inside a fused qkv projection output.
struct RopeShape {
  int head_dim = 0;
  int rotary_dim = 0;  // even, <= head_dim
  int n_q_heads = 0;
  int n_k_heads = 0;
  int64_t q_stride = 0;
  int64_t k_stride = 0;
  RopeStyle style = RopeStyle::NeoX;
};

// inv_freq [rotary_dim/2] = theta^(-2i/rotary_dim), computed in double, rounded to float once.
std::vector<float> rope_inv_freq(double theta, int rotary_dim);

// YaRN (arXiv 2309.00071, as the DeepSeek-V3 reference computes it): frequencies whose
// wavelength fits in original_max_position many times (beta_fast rotations) stay as they are,
// those rotating fewer than beta_slow times are divided by factor, a linear ramp between (the
// ramp's ends floor/ceil-ed, clamped to [0, rotary_dim/2 - 1]).
struct YarnParams {
  double factor = 1.0;
  double original_max_position = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
};
std::vector<float> rope_yarn_inv_freq(double theta, int rotary_dim, const YarnParams& y);
// YaRN's magnitude correction 0.1 * m * ln(factor) + 1 (1 for factor <= 1).
double yarn_mscale(double factor, double m);

// Refuses inconsistent shapes with a tetra::Error naming the field.
void check_rope_shape(const RopeShape& s);

// Turns x [rotary_dim] (float, in place) at position pos: pairs per style, angle
// float(pos) * inv_freq[i], cos/sin in double rounded to float (as apply_rope_cpu).
void rope_rotate_f32(float* x, int rotary_dim, float pos, const float* inv_freq, RopeStyle style);

// In place: q, k per RopeShape; positions [T] int32 (>= 0); inv_freq [rotary_dim/2].
void apply_rope_cpu(uint16_t* q, uint16_t* k, const int32_t* positions, int T,
                    const float* inv_freq, const RopeShape& shape);

}  // namespace tetra::ops
