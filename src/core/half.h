// bf16 and fp16 <-> float on the host, bit-exact, round-to-nearest-even. Usable from .cu too.
#pragma once
#include <cstdint>
#include <cstring>

namespace tetra {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                         // RNE
  return uint16_t(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24, exact in float
    float v = float(man) * (1.0f / 16777216.0f);
    return bits_to_float(float_to_bits(v) | sign);
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (man << 13));
  return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t float_to_f16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: Inf
  if (a < 0x38800000u) {                        // below 2^-14: subnormal half
    // value / 2^-24 rounded to nearest even integer
    const float scaled = bits_to_float(a) * 16777216.0f;
    const uint32_t r = uint32_t(scaled);
    const float frac = scaled - float(r);
    uint32_t q = r + (frac > 0.5f || (frac == 0.5f && (r & 1u)) ? 1u : 0u);
    return sign | uint16_t(q);
  }
  uint32_t v = a + 0xfffu + ((a >> 13) & 1u);  // RNE on the 13 dropped bits
  return sign | uint16_t(((v >> 23) - 112) << 10 | ((v >> 13) & 0x3ffu));
}

}  // namespace tetra
