#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "core/half.h"

using namespace tetra;

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::U8, DType::I8,
                  DType::I32, DType::I64, DType::BOOL}) {
    auto parsed = parse_dtype(dtype_name(t));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_FALSE(parse_dtype("F64x").has_value());
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
}

TEST(Half, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties go to the even (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3.0f / 256), 0x3f82);  // halfway, odd below -> up
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(Half, F16EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16(f), h) << "half bits " << h;
  }
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);  // rounds to Inf
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);        // tie to even (0)
  EXPECT_EQ(float_to_f16(std::ldexp(3.0f, -25)), 0x0002);        // tie to even (2)
}
