// CPU RoPE: angles in float (as the reference models build them), cos/sin in double.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "ops/rope/rope.h"

namespace tetra::ops {

std::vector<float> rope_inv_freq(double theta, int rotary_dim) {
  TETRA_CHECK(theta > 1.0, "rope theta ", theta);
  TETRA_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rotary_dim ", rotary_dim, " must be even");
  std::vector<float> f(rotary_dim / 2);  // [rotary_dim/2]
  for (int i = 0; i < rotary_dim / 2; ++i)
    f[i] = float(std::pow(theta, -2.0 * i / rotary_dim));
  return f;
}

std::vector<float> rope_yarn_inv_freq(double theta, int rotary_dim, const YarnParams& y) {
  TETRA_CHECK(theta > 1.0, "rope theta ", theta);
  TETRA_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rotary_dim ", rotary_dim, " must be even");
  TETRA_CHECK(y.factor > 0 && y.original_max_position > 0 && y.beta_fast > 0 && y.beta_slow > 0,
              "yarn: factor ", y.factor, ", original_max_position ", y.original_max_position,
              ", beta_fast ", y.beta_fast, ", beta_slow ", y.beta_slow, " must be > 0");
  const int half = rotary_dim / 2;
  // The dim index whose frequency turns `rotations` times over the original context.
  auto correction_dim = [&](double rotations) {
    return rotary_dim * std::log(y.original_max_position / (rotations * 2.0 * M_PI)) /
           (2.0 * std::log(theta));
  };
  const double low = std::max(0.0, std::floor(correction_dim(y.beta_fast)));
  double high = std::min(double(rotary_dim - 1), std::ceil(correction_dim(y.beta_slow)));
  if (high == low) high += 0.001;  // a ramp of zero width would divide by zero
  std::vector<float> f(static_cast<size_t>(half));  // [rotary_dim/2]
  for (int i = 0; i < half; ++i) {
    const double extrapolated = std::pow(theta, -2.0 * i / rotary_dim);
    const double interpolated = extrapolated / y.factor;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    // ramp 0 (high frequency): keep; ramp 1 (low frequency): interpolate.
    f[size_t(i)] = float(interpolated * ramp + extrapolated * (1.0 - ramp));
  }
  return f;
}

double yarn_mscale(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

void check_rope_shape(const RopeShape& s) {
  TETRA_CHECK(s.head_dim > 0, "rope: head_dim ", s.head_dim);
  TETRA_CHECK(s.rotary_dim > 0 && s.rotary_dim % 2 == 0 && s.rotary_dim <= s.head_dim,
              "rope: rotary_dim ", s.rotary_dim, " must be even and <= head_dim ", s.head_dim);
  TETRA_CHECK(s.n_q_heads > 0 && s.n_k_heads >= 0, "rope: heads q=", s.n_q_heads, " k=", s.n_k_heads);
  TETRA_CHECK(s.q_stride >= int64_t(s.n_q_heads) * s.head_dim, "rope: q_stride ", s.q_stride);
  TETRA_CHECK(s.k_stride >= int64_t(s.n_k_heads) * s.head_dim, "rope: k_stride ", s.k_stride);
}

namespace {

// a' = a cos - b sin, b' = b cos + a sin at `angle`.
void turn_pair(float& a, float& b, float angle) {
  const float c = float(std::cos(double(angle))), sn = float(std::sin(double(angle)));
  const float a0 = a, b0 = b;
  a = a0 * c - b0 * sn;
  b = b0 * c + a0 * sn;
}

// Rotates one head in place.
void rotate_head(uint16_t* x, float pos, const float* inv_freq, const RopeShape& s) {
  float r[2];
  const int half = s.rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const int ia = s.style == RopeStyle::NeoX ? i : 2 * i;
    const int ib = s.style == RopeStyle::NeoX ? i + half : 2 * i + 1;
    r[0] = bf16_to_float(x[ia]);
    r[1] = bf16_to_float(x[ib]);
    turn_pair(r[0], r[1], pos * inv_freq[i]);
    x[ia] = float_to_bf16(r[0]);
    x[ib] = float_to_bf16(r[1]);
  }
}

}  // namespace

void rope_rotate_f32(float* x, int rotary_dim, float pos, const float* inv_freq, RopeStyle style) {
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const int ia = style == RopeStyle::NeoX ? i : 2 * i;
    const int ib = style == RopeStyle::NeoX ? i + half : 2 * i + 1;
    turn_pair(x[ia], x[ib], pos * inv_freq[i]);
  }
}

void apply_rope_cpu(uint16_t* q, uint16_t* k, const int32_t* positions, int T,
                    const float* inv_freq, const RopeShape& shape) {
  check_rope_shape(shape);
  TETRA_CHECK(T >= 0, "rope: T ", T);
  for (int t = 0; t < T; ++t) {
    TETRA_CHECK(positions[t] >= 0, "rope: position ", positions[t], " of token ", t);
    const float pos = float(positions[t]);
    for (int h = 0; h < shape.n_q_heads; ++h)
      rotate_head(q + t * shape.q_stride + int64_t(h) * shape.head_dim, pos, inv_freq, shape);
    if (k != nullptr)
      for (int h = 0; h < shape.n_k_heads; ++h)
        rotate_head(k + t * shape.k_stride + int64_t(h) * shape.head_dim, pos, inv_freq, shape);
  }
}

}  // namespace tetra::ops
