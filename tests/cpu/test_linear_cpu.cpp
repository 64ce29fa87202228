// CPU twins of the dense linears and elementwise ops against independent double-precision loops
// that decode NVFP4 from the format's definition (E2M1 value table, E4M3 by exponent/mantissa),
// not through format/nvfp4.h.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/elementwise/elementwise.h"
#include "ops/linear/linear.h"
#include "ops/linear/linear_cuda.h"

namespace tetra::ops {
namespace {

// E2M1 magnitudes by 3-bit code (NVFP4.md), sign in bit 3.
double e2m1(uint8_t c) {
  static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}
// E4M3 (fn): bias 7, subnormals at exponent field 0; callers avoid NaN codes.
double e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -v : v;
}

struct RandomNvfp4 {
  std::vector<uint8_t> weight, scale;  // [n, k/2], [n, k/16]
  Nvfp4MatrixView view;
};
RandomNvfp4 random_nvfp4(int n, int k, std::mt19937& rng, float s2) {
  RandomNvfp4 r;
  r.weight.resize(size_t(n) * k / 2);
  r.scale.resize(size_t(n) * k / 16);
  std::uniform_int_distribution<int> byte(0, 255), sc(0x20, 0x40);  // scales 2^-3 .. 2^1
  for (auto& b : r.weight) b = uint8_t(byte(rng));
  for (auto& b : r.scale) b = uint8_t(sc(rng));
  r.view = {r.weight.data(), r.scale.data(), s2, n, k, "test.weight"};
  return r;
}
double deq(const RandomNvfp4& w, int n, int k) {
  const uint8_t pair = w.weight[(size_t(n) * w.view.k + k) / 2];
  const uint8_t code = (k % 2 == 0) ? (pair & 15) : (pair >> 4);
  return e2m1(code) * e4m3(w.scale[(size_t(n) * w.view.k + k) / 16]) * w.view.scale_2;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float a) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

// |got - want| within one bf16 ulp of want (plus float-sum slack): both round the same value.
void expect_bf16_near(uint16_t got, double want, const std::string& what) {
  const double g = bf16_to_float(got);
  EXPECT_NEAR(g, want, std::abs(want) * (1.0 / 128) + 1e-3) << what;
}

TEST(LinearCpu, Nvfp4MatchesDoubleLoop) {
  std::mt19937 rng(7);
  for (int M : {1, 3, 19}) {
    const int N = 48, K = 128;
    auto w = random_nvfp4(N, K, rng, 0.37f);
    auto x = random_bf16(size_t(M) * K, rng, 2.0f);
    auto bias = random_bf16(N, rng, 1.0f);
    std::vector<uint16_t> y(size_t(M) * N);
    std::vector<float> yf(size_t(M) * N);
    linear_nvfp4_cpu(x.data(), M, w.view, bias.data(), y.data(), DType::BF16);
    linear_nvfp4_cpu(x.data(), M, w.view, nullptr, yf.data(), DType::F32);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double acc = 0;
        for (int k = 0; k < K; ++k) acc += bf16_to_float(x[size_t(m) * K + k]) * deq(w, n, k);
        EXPECT_NEAR(yf[size_t(m) * N + n], acc, 1e-4 * (1 + std::abs(acc)));
        expect_bf16_near(y[size_t(m) * N + n], acc + bf16_to_float(bias[n]),
                         "m=" + std::to_string(m) + " n=" + std::to_string(n));
      }
  }
}

TEST(LinearCpu, GateUpSiluMatchesDoubleLoop) {
  std::mt19937 rng(8);
  const int M = 5, I = 32, K = 64;
  auto g = random_nvfp4(I, K, rng, 0.11f), u = random_nvfp4(I, K, rng, 0.23f);
  auto x = random_bf16(size_t(M) * K, rng, 1.0f);
  std::vector<uint16_t> act(size_t(M) * I);
  gate_up_silu_nvfp4_cpu(x.data(), M, g.view, u.view, act.data());
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < I; ++i) {
      double gs = 0, us = 0;
      for (int k = 0; k < K; ++k) {
        const double xv = bf16_to_float(x[size_t(m) * K + k]);
        gs += xv * deq(g, i, k);
        us += xv * deq(u, i, k);
      }
      expect_bf16_near(act[size_t(m) * I + i], gs / (1 + std::exp(-gs)) * us, "act");
    }
}

TEST(LinearCpu, Bf16MatchesDoubleLoop) {
  std::mt19937 rng(9);
  const int M = 7, N = 33, K = 40;
  auto w = random_bf16(size_t(N) * K, rng, 1.0f), x = random_bf16(size_t(M) * K, rng, 1.0f);
  std::vector<float> y(size_t(M) * N);
  linear_bf16_cpu(x.data(), M, K, w.data(), N, nullptr, y.data(), DType::F32);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int k = 0; k < K; ++k)
        acc += double(bf16_to_float(x[size_t(m) * K + k])) * bf16_to_float(w[size_t(n) * K + k]);
      EXPECT_NEAR(y[size_t(m) * N + n], acc, 1e-5 * (1 + std::abs(acc)));
    }
}

TEST(LinearCpu, RefusesBadInput) {
  std::mt19937 rng(10);
  auto w = random_nvfp4(16, 64, rng, 1.0f);
  w.scale[3] = 0x7f;  // NaN block scale
  std::vector<uint16_t> x(64), y(16);
  EXPECT_THROW(linear_nvfp4_cpu(x.data(), 1, w.view, nullptr, y.data(), DType::BF16), Error);
  auto ok = random_nvfp4(16, 64, rng, 1.0f);
  EXPECT_THROW(linear_nvfp4_cpu(x.data(), 1, ok.view, nullptr, y.data(), DType::I32), Error);
  auto up = random_nvfp4(32, 64, rng, 1.0f);
  EXPECT_THROW(gate_up_silu_nvfp4_cpu(x.data(), 1, ok.view, up.view, y.data()), Error);
}

TEST(ElementwiseCpu, GatherSiluAddBias) {
  std::mt19937 rng(11);
  const int V = 10, H = 6, T = 4, I = 5;
  auto table = random_bf16(size_t(V) * H, rng, 1.0f);
  const std::vector<int32_t> ids = {3, 0, 9, 3};
  std::vector<uint16_t> out(size_t(T) * H);
  embedding_gather_cpu(table.data(), V, H, ids.data(), T, out.data());
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) EXPECT_EQ(out[t * H + h], table[ids[t] * H + h]);
  const std::vector<int32_t> bad = {1, 10};
  EXPECT_THROW(embedding_gather_cpu(table.data(), V, H, bad.data(), 2, out.data()), Error);

  auto gu = random_bf16(size_t(T) * 2 * I, rng, 3.0f);
  std::vector<uint16_t> act(size_t(T) * I);
  silu_mul_cpu(gu.data(), T, I, act.data());
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < I; ++i) {
      const double g = bf16_to_float(gu[t * 2 * I + i]), u = bf16_to_float(gu[t * 2 * I + I + i]);
      expect_bf16_near(act[t * I + i], g / (1 + std::exp(-g)) * u, "silu_mul");
    }

  auto a = random_bf16(20, rng, 1.0f), b = random_bf16(20, rng, 1.0f);
  std::vector<uint16_t> s(20);
  add_cpu(a.data(), b.data(), 20, s.data());
  for (int i = 0; i < 20; ++i)
    expect_bf16_near(s[i], double(bf16_to_float(a[i])) + bf16_to_float(b[i]), "add");

  auto y = random_bf16(size_t(T) * H, rng, 1.0f), y0 = y;
  auto bias = random_bf16(H, rng, 1.0f);
  add_bias_cpu(y.data(), T, H, bias.data());
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      expect_bf16_near(y[t * H + h], double(bf16_to_float(y0[t * H + h])) + bf16_to_float(bias[h]),
                       "add_bias");
}

// The residual add in the NVFP4 GEMV's epilogue (Nvfp4GemvOutput::residual) exists only in the
// GEMV kernels: the reasons refuse it past their 8 rows and in the small-M kernel called
// directly, before looking at any device data (so this runs without a GPU).
TEST(LinearCudaReasons, ResidualAddOnlyInTheGemvKernels) {
  uint16_t residual = 0;
  cuda::Nvfp4GemvOutput o;
  o.residual = &residual;
  EXPECT_NE(cuda::nvfp4_gemv_unsupported_reason(&o, 1, cuda::kNvfp4GemvKernelRows + 1)
                .find("residual"),
            std::string::npos);
  EXPECT_NE(cuda::nvfp4_small_m_unsupported_reason(&o, 1, 3).find("residual"), std::string::npos);
  // Without it, the same call fails on the missing matrix instead.
  o.residual = nullptr;
  EXPECT_EQ(cuda::nvfp4_small_m_unsupported_reason(&o, 1, 3).find("residual"), std::string::npos);
}

}  // namespace
}  // namespace tetra::ops
