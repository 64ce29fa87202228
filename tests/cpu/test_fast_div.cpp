// FastDiv (core/fast_div.h), the multiply-high division the split decode attention uses to map
// positions to KV blocks, against integer division: every divisor up to 4096 (KV block sizes,
// powers of two and not) over every quotient boundary of a range of positions, random numerators
// up to 2^31 - 1, and divisors up to 2^31 - 1 at the numerators where rounding errors would show.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "core/fast_div.h"

namespace tetra {
namespace {

// n around each multiple of d below `limit`, and a handful of numerators near 2^31.
void check_divisor(uint32_t d, uint32_t limit, std::mt19937& rng) {
  const FastDiv f(d);
  for (uint64_t m = 0; m * d < limit; ++m)
    for (int delta : {-1, 0, 1}) {
      const int64_t n = int64_t(m * d) + delta;
      if (n < 0 || n >= limit) continue;
      ASSERT_EQ(f.div(uint32_t(n)), uint32_t(n) / d) << "n=" << n << " d=" << d;
    }
  std::uniform_int_distribution<uint32_t> any(0, 0x7fffffffu);
  for (int i = 0; i < 64; ++i) {
    const uint32_t n = any(rng);
    ASSERT_EQ(f.div(n), n / d) << "n=" << n << " d=" << d;
  }
  for (uint32_t n = 0x7fffffffu - 64; n < 0x80000000u; ++n)
    ASSERT_EQ(f.div(n), n / d) << "n=" << n << " d=" << d;
}

TEST(FastDiv, SmallDivisorsAgreeWithDivision) {
  std::mt19937 rng(41);
  for (uint32_t d = 1; d <= 4096; ++d) check_divisor(d, 1u << 20, rng);
}

TEST(FastDiv, LargeDivisorsAgreeWithDivision) {
  std::mt19937 rng(43);
  std::uniform_int_distribution<uint32_t> big(4097, 0x7fffffffu);
  for (uint32_t d : {65536u, 65537u, 1000003u, 0x40000000u, 0x7fffffffu})
    check_divisor(d, 1u << 31, rng);
  for (int i = 0; i < 200; ++i) check_divisor(big(rng), 1u << 24, rng);
}

TEST(FastDiv, PowersOfTwoAreShifts) {
  for (int b = 0; b < 31; ++b) {
    const FastDiv f(1u << b);
    EXPECT_EQ(f.shift, b);
    EXPECT_EQ(f.magic, 1u);
  }
}

}  // namespace
}  // namespace tetra
