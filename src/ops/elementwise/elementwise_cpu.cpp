// CPU references of the elementwise model ops.
#include "ops/elementwise/elementwise.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace tetra::ops {

void embedding_gather_cpu(const uint16_t* table, int vocab, int H, const int32_t* ids, int T,
                          uint16_t* out) {
  for (int t = 0; t < T; ++t) {
    if (ids[t] < 0 || ids[t] >= vocab)
      TETRA_FAIL("token id ", ids[t], " at position ", t, " is outside the vocabulary [0, ", vocab,
                 ")");
    std::memcpy(out + size_t(t) * H, table + size_t(ids[t]) * H, size_t(H) * sizeof(uint16_t));
  }
}

void silu_mul_cpu(const uint16_t* gu, int T, int I, uint16_t* out) {
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < I; ++i) {
      const float g = bf16_to_float(gu[size_t(t) * 2 * I + i]);
      const float u = bf16_to_float(gu[size_t(t) * 2 * I + I + i]);
      out[size_t(t) * I + i] = float_to_bf16(g / (1.0f + std::exp(-g)) * u);
    }
}

void add_cpu(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

void add_bias_cpu(uint16_t* y, int M, int N, const uint16_t* bias) {
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      uint16_t& v = y[size_t(m) * N + n];
      v = float_to_bf16(bf16_to_float(v) + bf16_to_float(bias[n]));
    }
}

}  // namespace tetra::ops
