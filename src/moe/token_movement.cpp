#include "moe/token_movement.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace tetra::moe {

namespace {

void check_sizes(const char* what, int T, int H, int top_k) {
  if (T < 0 || H < 1 || top_k < 1)
    TETRA_FAIL(what, ": bad sizes T=", T, " H=", H, " top_k=", top_k);
}

template <typename V>
void permute_impl(const V* x, int T, int H, int top_k, const int32_t* slot_of, V* rows) {
  check_sizes("permute", T, H, top_k);
  for (int64_t p = 0; p < int64_t(T) * top_k; ++p) {
    const int32_t row = slot_of[p];
    if (row < 0) continue;
    std::memcpy(rows + size_t(row) * H, x + size_t(p / top_k) * H, sizeof(V) * H);
  }
}

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t bf16) { return bf16_to_float(bf16); }

// Weighted sum over the k rows of token t at column h, in the documented order.
template <typename R>
float weighted_sum(const R* rows, int H, int top_k, const int32_t* slot_of, const float* weights,
                   int t, int h) {
  float acc = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    const int32_t row = slot_of[size_t(t) * top_k + j];
    if (row < 0) continue;
    const float w = weights ? weights[size_t(t) * top_k + j] : 1.0f;
    acc = fmaf(w, to_f32(rows[size_t(row) * H + h]), acc);
  }
  return acc;
}

template <typename R>
void combine_bf16_impl(const R* rows, int T, int H, int top_k, const int32_t* slot_of,
                       const float* weights, const uint16_t* shared, const uint16_t* residual,
                       uint16_t* out) {
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      const size_t i = size_t(t) * H + h;
      float acc = weighted_sum(rows, H, top_k, slot_of, weights, t, h);
      if (shared) acc = acc + bf16_to_float(shared[i]);
      if (residual) acc = acc + bf16_to_float(residual[i]);
      out[i] = float_to_bf16(acc);
    }
  }
}

}  // namespace

void permute_rows_cpu(const uint16_t* x_bf16, int T, int H, int top_k, const int32_t* slot_of,
                      uint16_t* rows_bf16) {
  permute_impl(x_bf16, T, H, top_k, slot_of, rows_bf16);
}
void permute_rows_cpu(const float* x, int T, int H, int top_k, const int32_t* slot_of,
                      float* rows) {
  permute_impl(x, T, H, top_k, slot_of, rows);
}

void combine_bf16_cpu(const void* rows, DType rows_dtype, int T, int H, int top_k,
                      const int32_t* slot_of, const float* weights, const uint16_t* shared_bf16,
                      const uint16_t* residual_bf16, uint16_t* out_bf16) {
  check_sizes("combine", T, H, top_k);
  if (rows_dtype == DType::BF16) {
    combine_bf16_impl(static_cast<const uint16_t*>(rows), T, H, top_k, slot_of, weights,
                      shared_bf16, residual_bf16, out_bf16);
  } else if (rows_dtype == DType::F32) {
    combine_bf16_impl(static_cast<const float*>(rows), T, H, top_k, slot_of, weights, shared_bf16,
                      residual_bf16, out_bf16);
  } else {
    TETRA_FAIL("combine: expert output rows must be BF16 or F32, got ", dtype_name(rows_dtype));
  }
}

void combine_f32_cpu(const float* rows, int T, int H, int top_k, const int32_t* slot_of,
                     const float* weights, float* out) {
  check_sizes("combine", T, H, top_k);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      out[size_t(t) * H + h] = weighted_sum(rows, H, top_k, slot_of, weights, t, h);
}

}  // namespace tetra::moe
