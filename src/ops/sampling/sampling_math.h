// Per-element sampling math shared by the CPU reference and the CUDA kernel, so both make the
// same decisions: the counter-based RNG, the order-preserving float key, the penalised logit,
// the top-p weight and the Gumbel score. Only IEEE-exact operations (+ - * /, comparisons) in
// float; exp/log run in double, where a last-bit difference between libm and CUDA cannot move a
// float result except by a double rounding that essentially never happens.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace tetra::ops::sampling_math {

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011).
struct Philox4 {
  uint32_t v[4];
};
TETRA_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                               uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key schedule (Weyl) increments
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t(kM0) * c0, p1 = uint64_t(kM1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The uniform draw of token `token` at generation step `step` of the request seeded `seed`:
// counter (token, step lo, step hi, 0), key (seed lo, seed hi). 53 bits, strictly inside (0, 1).
TETRA_HD double uniform_open01(uint64_t seed, uint64_t step, uint32_t token) {
  const Philox4 r = philox4x32_10(token, uint32_t(step), uint32_t(step >> 32), 0u, uint32_t(seed),
                                  uint32_t(seed >> 32));
  const uint64_t bits = ((uint64_t(r.v[1]) << 32) | r.v[0]) >> 11;  // 53 random bits
  return (double(bits) + 0.5) * (1.0 / 9007199254740992.0);           // / 2^53
}

// Gumbel(0, 1) noise: argmax_i (x_i + g_i) is a draw from softmax(x).
TETRA_HD double gumbel(uint64_t seed, uint64_t step, uint32_t token) {
  return -log(-log(uniform_open01(seed, step, token)));
}

// Unsigned key with the order of the floats; 0 marks a dropped token (NaN or -inf), so every
// candidate's key is > 0 and "kept" is simply key != 0.
TETRA_HD uint32_t order_key(float x) {
  if (x != x || x == -INFINITY) return 0u;
  uint32_t b;
#if defined(__CUDA_ARCH__)
  b = __float_as_uint(x);
#else
  __builtin_memcpy(&b, &x, 4);
#endif
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The logit after its bias (step 0): a -inf bias bans the token whatever its logit (NaN too).
TETRA_HD float biased(float logit, float bias) {
  return bias == -INFINITY ? -INFINITY : logit + bias;
}

// The logit after penalties (vLLM / OpenAI definitions):
//   seen in prompt or output (repetition): x > 0 ? x / rep : x * rep;
//   count times in the output: x -= frequency * count, then x -= presence.
// Separate roundings (no fused multiply-add) so host and device agree bit for bit.
TETRA_HD float penalised(float x, bool seen, int count, float repetition, float frequency,
                         float presence) {
  if (seen) x = x > 0.0f ? x / repetition : x * repetition;
  if (count > 0) {
#if defined(__CUDA_ARCH__)
    x = __fsub_rn(x, __fmul_rn(frequency, float(count)));
#else
    const volatile float fc = frequency * float(count);  // volatile: keep the product rounded
    x = x - fc;
#endif
    x = x - presence;
  }
  return x;
}

// min-p: keep a token whose probability is at least min_p times the top token's, in log space.
TETRA_HD bool min_p_keeps(float x, float x_max, float min_p) {
  return double(x) - double(x_max) >= log(double(min_p));
}

// Top-p weight of a candidate: exp(x - max) in 2^-40 units, summed in integers (exact in any order).
TETRA_HD uint64_t top_p_weight(float x, float x_max) {
  return uint64_t(exp(double(x) - double(x_max)) * 1099511627776.0);  // * 2^40, truncated
}

// Weight the top-p set must reach: ceil(top_p * total) (>= 1 whenever total >= 1).
TETRA_HD uint64_t top_p_target(float top_p, uint64_t total) {
  const uint64_t t = uint64_t(ceil(double(top_p) * double(total)));
  return t == 0 ? 1 : (t > total ? total : t);
}

}  // namespace tetra::ops::sampling_math
