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
// (YaRN / other scalings are not implemented yet.)
std::vector<float> rope_inv_freq(double theta, int rotary_dim);

// Refuses inconsistent shapes with a tetra::Error naming the field.
void check_rope_shape(const RopeShape& s);

// In place: q, k per RopeShape; positions [T] int32 (>= 0); inv_freq [rotary_dim/2].
void apply_rope_cpu(uint16_t* q, uint16_t* k, const int32_t* positions, int T,
                    const float* inv_freq, const RopeShape& shape);

}  // namespace tetra::ops
