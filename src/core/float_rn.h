// float32 helpers that round identically on host and device: CPU twins and CUDA kernels that
// must agree bit for bit use these instead of plain operators (nvcc would contract a*b+c into an
// FMA; these multiplies and divides are single IEEE round-to-nearest operations on both sides).
#pragma once
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace tetra::fp {

TETRA_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

TETRA_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

TETRA_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

TETRA_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

}  // namespace tetra::fp
