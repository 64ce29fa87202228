// Division by a runtime divisor known on the host, as one multiply-high, an add and a shift
// (Granlund and Montgomery's round-up method): for 0 <= n < 2^31 and 1 <= d < 2^31,
// n / d == (umulhi(n, magic) + n) >> shift. A kernel that divides in unrolled code (the split
// decode attention maps token positions to KV blocks) then carries 3 instructions per division
// instead of the ~25 of an integer division, and power-of-two divisors need no second path.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace tetra {

struct FastDiv {
  uint32_t magic = 1;  // 2^32 * (2^shift - d) / d + 1, truncated to 32 bits
  int shift = 0;       // ceil(log2 d)

  FastDiv() = default;
  explicit FastDiv(uint32_t d) {
    while ((uint64_t(1) << shift) < d) ++shift;
    magic = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1);
  }

  TETRA_HD uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const uint32_t hi = uint32_t((uint64_t(n) * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

}  // namespace tetra
