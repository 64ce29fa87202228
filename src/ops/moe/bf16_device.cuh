// bf16 <-> float on the device with the host's rules (core/half.h): round to nearest even, a NaN
// stays a quiet NaN. Shared by the combine kernel and the persistent layer's combine.
#pragma once
#include <cstdint>

#include "moe/routing_math.h"

namespace tetra::moe::cuda {

__device__ __forceinline__ float bf16_to_f32(uint16_t b) {
  return math::f32_from_bits(uint32_t(b) << 16);
}
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
  uint32_t u = math::f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

}  // namespace tetra::moe::cuda
