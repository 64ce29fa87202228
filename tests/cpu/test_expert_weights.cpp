// Repack of ModelOpt NVFP4 expert weights into the W4A16 kernels' fragment order: lossless, and
// every lane/word/register holds the element the layout note promises (checked by simulating the
// kernel's bit-level dequant on the CPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/half.h"
#include "moe/expert_weights.h"
#include "moe/fragment_code.h"

namespace tetra {
namespace {

// Independent E4M3FN decoder (bias 7, subnormals m/8 * 2^-6).
float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float mag = e == 0 ? std::ldexp(float(m) / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}
float e2m1_value(uint8_t code) {
  static const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}
uint8_t nibble(const std::vector<uint8_t>& w, int k_half, int row, int k) {
  const uint8_t b = w[size_t(row) * k_half + k / 2];
  return (k & 1) ? (b >> 4) : (b & 15);
}

struct RandomMatrix {
  int n, k;
  std::vector<uint8_t> weight;  // [n, k/2]
  std::vector<uint8_t> scale;   // [n, k/16]
  RandomMatrix(int n_, int k_, uint32_t seed, double zero_scale_share = 0.0) : n(n_), k(k_) {
    std::mt19937 rng(seed);
    weight.resize(size_t(n) * k / 2);
    scale.resize(size_t(n) * k / 16);
    for (auto& b : weight) b = uint8_t(rng());
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (auto& s : scale) {
      do s = uint8_t(rng() & 0x7f);  // non-negative, any exponent incl. subnormals
      while (s == 0x7f || s == 0);
      if (u(rng) < zero_scale_share) s = 0;
    }
  }
  Nvfp4MatrixView view(const std::string& name, float s2 = 0.5f) const {
    return Nvfp4MatrixView{weight.data(), scale.data(), s2, n, k, name};
  }
};

TEST(ExpertWeights, ScaleCodeRoundTripsEveryE4m3Byte) {
  int checked = 0;
  for (int b = 0; b < 256; ++b) {
    const uint8_t byte = uint8_t(b);
    if ((byte & 0x7f) == 0x7f) {
      EXPECT_THROW(e4m3_to_ue5m3(byte, "t.weight_scale"), Error) << b;
      continue;
    }
    if (byte == 0 || byte == 0x80) {
      EXPECT_EQ(e4m3_to_ue5m3(byte, "t"), 0);
      continue;
    }
    if (byte & 0x80) {
      EXPECT_THROW(e4m3_to_ue5m3(byte, "t"), Error) << b;
      continue;
    }
    const uint8_t code = e4m3_to_ue5m3(byte, "t");
    EXPECT_NE(code, 0);
    EXPECT_EQ(ue5m3_to_e4m3(code), byte) << b;
    // The code's value as the kernel reads it: bf16 bits (code << 4) + (233 << 7) = value * 2^116.
    const float kernel_scale = bf16_to_float(uint16_t((code << 4) + (233 << 7)));
    EXPECT_TRUE(std::isfinite(kernel_scale));
    EXPECT_EQ(kernel_scale, std::ldexp(e4m3_value(byte), 116)) << b;
    ++checked;
  }
  EXPECT_EQ(checked, 126);  // 0x01..0x7e
}

TEST(ExpertWeights, NanScaleIsRefusedWithTensorName) {
  RandomMatrix m(16, 64, 1);
  m.scale[3] = 0x7f;
  try {
    pack_nvfp4_matrix(m.view("model.layers.3.mlp.experts.7.up_proj"));
    FAIL() << "NaN scale accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.7.up_proj"), std::string::npos) << e.what();
  }
}

TEST(ExpertWeights, UnsupportedShapesSayWhy) {
  RandomMatrix a(24, 64, 2);  // 24 rows: not a multiple of 16
  EXPECT_THROW(pack_nvfp4_matrix(a.view("a")), Error);
  RandomMatrix b(16, 96, 3);  // k 96: not a multiple of 64
  EXPECT_THROW(pack_nvfp4_matrix(b.view("b")), Error);
  EXPECT_NE(moe_shape_unsupported_reason(4096, 1400).find("64"), std::string::npos);
  EXPECT_EQ(moe_shape_unsupported_reason(6144, 2048), "");
  EXPECT_THROW(make_packed_moe_layer(4, 100, 128), Error);
}

TEST(ExpertWeights, PackUnpackIsLossless) {
  for (auto [n, k] : {std::pair{16, 64}, {48, 192}, {128, 1408}, {32, 768}}) {
    RandomMatrix m(n, k, uint32_t(n * 7 + k));
    const PackedNvfp4Matrix p = pack_nvfp4_matrix(m.view("w"));
    EXPECT_EQ(p.weight.size(), packed_weight_bytes(n, k));
    EXPECT_EQ(p.scale.size(), packed_scale_bytes(n, k));
    std::vector<uint8_t> w, s;
    unpack_nvfp4_matrix(p, w, s);
    EXPECT_EQ(w, m.weight) << n << "x" << k;
    EXPECT_EQ(s, m.scale) << n << "x" << k;
  }
}

TEST(ExpertWeights, ZeroScaleBlocksKeepTheirDequantizedValues) {
  RandomMatrix m(32, 256, 9, 0.2);
  const PackedNvfp4Matrix p = pack_nvfp4_matrix(m.view("w"));
  std::vector<uint8_t> w, s;
  unpack_nvfp4_matrix(p, w, s);
  EXPECT_EQ(s, m.scale);
  int zero_blocks = 0;
  for (int r = 0; r < m.n; ++r)
    for (int k = 0; k < m.k; ++k) {
      const float sc = e4m3_value(m.scale[size_t(r) * m.k / 16 + k / 16]);
      const float orig = e2m1_value(nibble(m.weight, m.k / 2, r, k)) * sc;
      const float back = e2m1_value(nibble(w, m.k / 2, r, k)) * e4m3_value(s[size_t(r) * m.k / 16 + k / 16]);
      ASSERT_EQ(orig, back) << r << "," << k;
      if (sc == 0.0f && k % 16 == 0) ++zero_blocks;
    }
  EXPECT_GT(zero_blocks, 0);
}

// The word code is a bijection on the live bits: encode then decode gives the registers back for
// random and for single-bit patterns, and bits outside the live set are ignored by encode.
TEST(ExpertWeights, FragmentWordCodeRoundTrips) {
  std::mt19937 rng(5);
  auto check = [](const uint32_t (&r)[4]) {
    uint32_t back[4];
    fragment_word_decode(fragment_word_encode(r), back);
    for (int p = 0; p < 4; ++p) ASSERT_EQ(back[p], r[p] & kFragmentRegBits) << "register " << p;
  };
  for (int p = 0; p < 4; ++p)
    for (int bit = 0; bit < 32; ++bit) {
      uint32_t r[4] = {};
      r[p] = (1u << bit) & kFragmentRegBits;
      check(r);
    }
  for (int it = 0; it < 100000; ++it) {
    const uint32_t r[4] = {uint32_t(rng()), uint32_t(rng()), uint32_t(rng()), uint32_t(rng())};
    check(r);
  }
  // Distinct words decode to distinct register sets (decode is injective on a random sample).
  uint32_t a[4], b[4];
  for (int it = 0; it < 100000; ++it) {
    const uint32_t w = uint32_t(rng()), v = w ^ (1u << (it % 32));
    fragment_word_decode(w, a);
    fragment_word_decode(v, b);
    ASSERT_FALSE(a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3]) << w;
  }
}

// Simulate the kernel: lane (g,t), word j, register p -> two bf16 built by the documented bit
// trick, times the bf16 scale register; must equal E2M1 * scale * 2^-10 of the element the layout
// note names (row 16r+g+8*(p&1), k = 64c+16t+4j+2*(p>>1)+q).
TEST(ExpertWeights, FragmentDequantMatchesModelOptValues) {
  RandomMatrix m(32, 128, 11);
  // Make sure the e = 0, m = 1 code (0.5, the bf16 subnormal path) and -0 are present.
  m.weight[0] = 0x81;
  m.weight[5] = 0x19;
  const PackedNvfp4Matrix p = pack_nvfp4_matrix(m.view("w"));
  const int chunks = m.k / 64;
  int halves = 0, subnormal_hits = 0;
  for (int r = 0; r < m.n / 16; ++r)
    for (int c = 0; c < chunks; ++c)
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const size_t li = (size_t(r) * chunks + c) * 32 + l;
        const uint8_t sc[2] = {p.scale[li * 2], p.scale[li * 2 + 1]};
        for (int j = 0; j < 4; ++j) {
          uint32_t w;
          std::memcpy(&w, &p.weight[li * 16 + 4 * j], 4);
          uint32_t regs[4];
          fragment_word_decode(w, regs);  // the kernels' decode (dequant_word)
          for (int reg = 0; reg < 4; ++reg) {
            const int row = 16 * r + g + 8 * (reg & 1);
            const float scale_reg = bf16_to_float(uint16_t((sc[reg & 1] << 4) + (233 << 7)));
            for (int q = 0; q < 2; ++q) {
              const int k = 64 * c + 16 * t + 4 * j + 2 * (reg >> 1) + q;
              const float wv = bf16_to_float(uint16_t(regs[reg] >> (16 * q)));
              const float prod = wv * scale_reg;
              // the kernel multiplies in bf16: the product must be exact there
              ASSERT_EQ(bf16_to_float(float_to_bf16(prod)), prod);
              const uint8_t code = nibble(m.weight, m.k / 2, row, k);
              const float want = std::ldexp(
                  e2m1_value(code) * e4m3_value(m.scale[size_t(row) * m.k / 16 + k / 16]), -10);
              ASSERT_EQ(prod, want) << "tile " << r << " chunk " << c << " lane " << l << " word "
                                    << j << " reg " << reg << " q " << q;
              if ((code & 7) == 1) ++subnormal_hits;
              ++halves;
            }
          }
        }
      }
  EXPECT_EQ(halves, m.n * m.k);
  EXPECT_GT(subnormal_hits, 0);
}

TEST(ExpertWeights, GateUpInterleaveAndSplit) {
  RandomMatrix gate(64, 128, 21), up(64, 128, 22);
  const PackedNvfp4Matrix w13 = pack_gate_up(gate.view("gate"), up.view("up"));
  EXPECT_EQ(w13.n, 128);
  PackedNvfp4Matrix pg, pu;
  split_gate_up(w13, pg, pu);
  std::vector<uint8_t> w, s;
  unpack_nvfp4_matrix(pg, w, s);
  EXPECT_EQ(w, gate.weight);
  EXPECT_EQ(s, gate.scale);
  unpack_nvfp4_matrix(pu, w, s);
  EXPECT_EQ(w, up.weight);
  EXPECT_EQ(s, up.scale);
  // Tile 1 of the fused matrix is up's tile 0.
  const PackedNvfp4Matrix up_alone = pack_nvfp4_matrix(up.view("up"));
  const size_t tile_bytes = packed_weight_bytes(16, 128);
  EXPECT_EQ(0, std::memcmp(&w13.weight[tile_bytes], up_alone.weight.data(), tile_bytes));
}

TEST(ExpertWeights, LayerKeepsSeparateGateAndUpScale2) {
  const int H = 128, I = 64;
  PackedMoeLayer L = make_packed_moe_layer(2, H, I);
  RandomMatrix g(I, H, 31), u(I, H, 32), d(H, I, 33);
  pack_moe_expert(L, 1, g.view("g", 0.25f), u.view("u", 0.75f), d.view("d", 2.0f));
  EXPECT_EQ(L.alpha_gate[1], 0.25f * 1024.0f);
  EXPECT_EQ(L.alpha_up[1], 0.75f * 1024.0f);
  EXPECT_EQ(L.alpha_down[1], 2.0f * 1024.0f);
  EXPECT_EQ(L.experts_with_split_s2, 1);
  // expert 0 untouched, expert 1 holds the packed down matrix
  const PackedNvfp4Matrix pd = pack_nvfp4_matrix(d.view("d"));
  EXPECT_EQ(0, std::memcmp(&L.w2[pd.weight.size()], pd.weight.data(), pd.weight.size()));
  EXPECT_THROW(pack_moe_expert(L, 0, d.view("d"), u.view("u"), d.view("d")), Error);
}

}  // namespace
}  // namespace tetra
