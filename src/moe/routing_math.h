// Scalar float32 math shared by the CPU router (router.cpp) and the CUDA router (ops/moe/*.cu).
//
// The CPU and GPU routers must pick the SAME experts. A one-ulp difference in a score can reorder
// two nearly equal experts, so every score is computed by the very same float32 operations in the
// same order on both sides: exp is our own (libm expf and CUDA expf round differently), every
// multiply that feeds an add goes through mul_rn (nvcc may not fuse it into an FMA), and the FMAs
// we want are written as fmaf. Sums over experts follow one fixed order, the order of a 32-lane
// warp reduction (see warp_order_sum below), which the CPU reproduces exactly.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/float_rn.h"

#include "core/host_device.h"

namespace tetra::moe::math {

inline constexpr int kLanes = 32;  // warp width; also the CPU's emulated reduction width

using fp::f32_bits;
using fp::f32_from_bits;
using fp::mul_rn;
using fp::div_rn;
TETRA_HD bool is_nan_f32(float x) { return (f32_bits(x) & 0x7fffffffu) > 0x7f800000u; }

// exp(x) in float32, within about 1 ulp, bit-identical on host and device.
// x = n*ln2 + r with |r| <= ln2/2; exp(r) by a degree-7 Taylor polynomial (truncation < 0.1 ulp);
// the result is scaled by 2^n in at most two exact-or-once-rounded multiplies.
TETRA_HD float exp_f32(float x) {
  if (is_nan_f32(x)) return x;
  if (x > 88.72283935546875f) return f32_from_bits(0x7f800000u);  // above ln(FLT_MAX): +Inf
  if (x < -103.972084045410156f) return 0.0f;                     // below half the least subnormal
  const float n = rintf(mul_rn(x, 1.44269502162933349609375f));    // round(x / ln2), ties even
  // ln2 = hi + lo; hi has 9 trailing zero mantissa bits, so n*hi is exact for |n| <= 150.
  float r = fmaf(-n, 0.693145751953125f, x);
  r = fmaf(-n, 1.4286068202862268e-06f, r);
  float p = 1.0f / 5040.0f;
  p = fmaf(p, r, 1.0f / 720.0f);
  p = fmaf(p, r, 1.0f / 120.0f);
  p = fmaf(p, r, 1.0f / 24.0f);
  p = fmaf(p, r, 1.0f / 6.0f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  int e = int(n);
  if (e > 127) {  // only x near the overflow threshold: 2^128 is not a float
    p = mul_rn(p, 2.0f);
    e -= 1;
  }
  if (e < -126) {  // subnormal result: an exact first step keeps the rounding to one
    p = mul_rn(p, 5.42101086242752217e-20f);  // 2^-64
    e += 64;
  }
  return mul_rn(p, f32_from_bits(uint32_t(e + 127) << 23));
}

// 1 / (1 + exp(-x)); saturates to 0 and 1 like the float32 reference.
TETRA_HD float sigmoid_f32(float x) { return div_rn(1.0f, 1.0f + exp_f32(-x)); }

// Selection key: NaN never wins, it ranks as -Inf (so a NaN logit cannot produce an invalid id).
TETRA_HD float selection_key(float v) {
  return is_nan_f32(v) ? f32_from_bits(0xff800000u) : v;
}

// Strict total order for top-k: larger key first, ties to the lower index.
TETRA_HD bool ranks_before(float key_a, int idx_a, float key_b, int idx_b) {
  return key_a > key_b || (key_a == key_b && idx_a < idx_b);
}

// Sum of v[0..n) in the order a 32-lane warp computes it: lane l adds v[l], v[l+32], ... from 0,
// then a butterfly (xor 16, 8, 4, 2, 1) adds lane pairs. Float addition is commutative, so every
// lane of the warp ends with exactly this value. Host-only (the device does it with shuffles).
inline float warp_order_sum(const float* v, int n) {
  float lane[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    float acc = 0.0f;
    for (int i = l; i < n; i += kLanes) acc = acc + v[i];
    lane[l] = acc;
  }
  for (int off = kLanes / 2; off >= 1; off /= 2) {
    float next[kLanes];
    for (int l = 0; l < kLanes; ++l) next[l] = lane[l] + lane[l ^ off];
    for (int l = 0; l < kLanes; ++l) lane[l] = next[l];
  }
  return lane[0];
}

}  // namespace tetra::moe::math
