// 128x4 swizzled block-scale layout: hand-computed offsets, padding, batches, round trips.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/error.h"
#include "format/scale_layout.h"

using namespace tetra;
using namespace tetra::nvfp4;

TEST(ScaleLayout, PaddedSizes) {
  EXPECT_EQ(swizzled_scale_bytes(1, 1), 128 * 4);
  EXPECT_EQ(swizzled_scale_bytes(128, 4), 128 * 4);
  EXPECT_EQ(swizzled_scale_bytes(129, 5), 256 * 8);
  EXPECT_EQ(swizzled_scale_bytes(300, 10), 384 * 12);
  EXPECT_EQ(swizzled_scale_bytes(4096, 384), 4096 * 384);  // GLM-5 expert up: K = 6144
  EXPECT_EQ(swizzled_scale_bytes(0, 3), 0);
  EXPECT_THROW(swizzled_scale_bytes(-1, 3), Error);
}

// Each coordinate alone is set in an otherwise zero [300, 10] matrix (kb_pad = 12, so one row of
// 128x4 tiles is 3 * 512 = 1536 bytes); the swizzled copy must hold it at the offset worked out
// by hand from NVFP4.md's formula, and nothing anywhere else.
TEST(ScaleLayout, HandPickedOffsets) {
  const int64_t rows = 300, kb = 10;
  struct Probe {
    int64_t m, k, offset;
  };
  const Probe probes[] = {
      {0, 0, 0},
      {0, 3, 3},
      {0, 4, 512},          // next 4-column tile
      {0, 9, 2 * 512 + 1},  // third tile, column 1 in it
      {1, 0, 16},           // m % 32 picks a 16-byte group
      {31, 0, 31 * 16},
      {32, 0, 4},  // (m % 128) / 32 picks the word
      {33, 2, 16 + 4 + 2},
      {127, 3, 31 * 16 + 3 * 4 + 3},                   // last byte of the first tile: 511
      {128, 0, 1536},                                  // next row of tiles
      {200, 7, 1536 + 512 + 8 * 16 + 2 * 4 + 3},       // 200 % 32 = 8, 72 / 32 = 2: 2187
      {299, 9, 2 * 1536 + 2 * 512 + 11 * 16 + 4 + 1},  // 299 % 32 = 11, 43 / 32 = 1: 4277
  };
  const int64_t bytes = swizzled_scale_bytes(rows, kb);
  for (const auto& p : probes) {
    EXPECT_EQ(swizzled_scale_offset(p.m, p.k, 12), p.offset) << p.m << "," << p.k;
    std::vector<uint8_t> plain(size_t(rows * kb), 0), sw(size_t(bytes), 0x55);
    plain[size_t(p.m * kb + p.k)] = 0xab;
    swizzle_scales(plain.data(), 1, rows, kb, sw.data());
    for (int64_t i = 0; i < bytes; ++i)
      ASSERT_EQ(int(sw[size_t(i)]), i == p.offset ? 0xab : 0)
          << "probe " << p.m << "," << p.k << " byte " << i;
  }
}

TEST(ScaleLayout, RoundTripWithPaddingAndBatch) {
  struct Shape {
    int64_t batch, rows, kb;
  };
  const Shape shapes[] = {{1, 1, 1},    {3, 19, 3},    {2, 128, 4},
                          {4, 300, 10}, {1, 989, 129}, {5, 0, 7}};
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> nonzero(1, 255);
  for (const auto& s : shapes) {
    const int64_t per = swizzled_scale_bytes(s.rows, s.kb);
    std::vector<uint8_t> plain(size_t(s.batch * s.rows * s.kb));
    for (auto& v : plain) v = uint8_t(nonzero(rng));
    std::vector<uint8_t> sw(size_t(s.batch * per), 0x77), back(plain.size(), 0);
    swizzle_scales(plain.data(), s.batch, s.rows, s.kb, sw.data());
    unswizzle_scales(sw.data(), s.batch, s.rows, s.kb, back.data());
    EXPECT_EQ(back, plain) << s.batch << "x" << s.rows << "x" << s.kb;
    for (int64_t e = 0; e < s.batch; ++e) {
      // Every plain (nonzero) value lands on its own byte and the padding is zero: exactly
      // rows * kb nonzero bytes per matrix.
      int64_t nonzero_bytes = 0;
      for (int64_t i = 0; i < per; ++i) nonzero_bytes += sw[size_t(e * per + i)] != 0;
      EXPECT_EQ(nonzero_bytes, s.rows * s.kb) << "matrix " << e;
      if (s.rows > 0 && s.kb > 0) {  // matrix e starts at e * per with its element (0, 0)
        EXPECT_EQ(sw[size_t(e * per)], plain[size_t(e * s.rows * s.kb)]) << "matrix " << e;
      }
    }
  }
}

TEST(ScaleLayout, RejectsNegativeShapes) {
  std::vector<uint8_t> a(16), b(512);
  EXPECT_THROW(swizzle_scales(a.data(), -1, 1, 1, b.data()), Error);
  EXPECT_THROW(unswizzle_scales(b.data(), 1, 1, -4, a.data()), Error);
}
