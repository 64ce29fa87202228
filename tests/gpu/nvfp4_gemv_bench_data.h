// Host data of the one-row NVFP4 GEMV experiments (bench_gemv_*.cu): a random ModelOpt matrix, the
// double-precision reference y = W x, the production upload, random x with optional outliers, and
// the error summary the experiments compare kernels by.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/half.h"
#include "format/nvfp4.h"
#include "ops/linear/linear_cuda.h"

namespace tetra::gemv_bench {

struct HostMatrix {
  int n, k;
  std::vector<uint8_t> codes, scales;  // ModelOpt [n, k/2] E2M1 pairs (low nibble first), [n, k/16] E4M3
  float scale_2;
  uint8_t code(int r, int c) const {
    const uint8_t b = codes[size_t(r) * (k / 2) + c / 2];
    return uint8_t(c % 2 ? b >> 4 : b & 15);
  }
  uint8_t scale(int r, int c) const { return scales[size_t(r) * (k / 16) + c / 16]; }
};

// Random codes; E4M3 scales 2^-3 .. 2^1 with random mantissas, some subnormal, some zero blocks.
inline HostMatrix random_matrix(int n, int k, uint32_t seed) {
  std::mt19937 rng(seed);
  HostMatrix m{n, k, std::vector<uint8_t>(size_t(n) * k / 2), std::vector<uint8_t>(size_t(n) * k / 16), 0.0f};
  for (auto& b : m.codes) b = uint8_t(rng());
  for (auto& s : m.scales) {
    const uint32_t r = rng() % 64;
    s = r == 0 ? 0 : r == 1 ? uint8_t(1 + rng() % 7) : uint8_t(((4 + rng() % 5) << 3) | (rng() % 8));
  }
  m.scale_2 = 2.0f / std::sqrt(float(k));
  return m;
}

// y = W x in double over the dequantized weights, times scale_2.
inline std::vector<double> reference(const HostMatrix& m, const std::vector<uint16_t>& x) {
  std::vector<double> y(m.n);
  for (int r = 0; r < m.n; ++r) {
    double acc = 0.0;
    for (int c = 0; c < m.k; ++c)
      acc += double(nvfp4::e2m1_to_float(m.code(r, c))) * double(nvfp4::e4m3_to_float(m.scale(r, c))) *
             double(bf16_to_float(x[c]));
    y[r] = acc * m.scale_2;
  }
  return y;
}

// The matrix in the production packing (the yardstick kernels read it).
inline ops::cuda::Nvfp4LinearBuffer upload(const HostMatrix& m) {
  Nvfp4MatrixView view;
  view.weight = m.codes.data();
  view.scale = m.scales.data();
  view.scale_2 = m.scale_2;
  view.n = m.n;
  view.k = m.k;
  view.name = "bench";
  return ops::cuda::Nvfp4LinearBuffer(view);
}

// Normal x; with an outlier, x[k/3] = outlier and x[7] = -outlier/3.
inline std::vector<uint16_t> random_x(int k, uint32_t seed, float outlier) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(k);
  for (auto& v : x) v = float_to_bf16(nd(rng));
  if (outlier != 0.0f) x[size_t(k / 3)] = float_to_bf16(outlier), x[7] = float_to_bf16(-outlier / 3);
  return x;
}

struct Errors {
  double nmse, max_rel;  // max_rel: largest |error| over the largest |reference|
};
inline Errors compare(const std::vector<uint16_t>& got, const std::vector<double>& want) {
  double num = 0, den = 0, mx = 0, scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = bf16_to_float(got[i]);
    if (!std::isfinite(g)) return {INFINITY, INFINITY};
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
    mx = std::max(mx, std::fabs(g - want[i]) / std::max(scale, 1e-30));
  }
  return {den > 0 ? num / den : num, mx};
}

}  // namespace tetra::gemv_bench
