#include "moe/w4a4_reference.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "format/nvfp4.h"

namespace tetra::moe {

namespace {

float silu(float g) { return g / (1.0f + std::exp(-g)); }

void check_expert(const ExpertMlpF32& w, int e) {
  if (!w.w13 || !w.w2) TETRA_FAIL("w4a4 reference: expert weights are missing");
  TETRA_CHECK(e >= 0 && e < w.num_experts, "expert ", e, " of ", w.num_experts);
}

}  // namespace

void w4a4_quantize_rows_cpu(const uint16_t* x, int64_t rows, int64_t cols, float input_scale,
                            float* out_unscaled) {
  const size_t n = size_t(rows) * size_t(cols);
  std::vector<uint8_t> packed(n / 2);                      // [rows, cols/2] e2m1 pairs
  std::vector<uint8_t> scales(n / nvfp4::kBlock);          // [rows, cols/16] e4m3
  nvfp4::quantize_activation(x, DType::BF16, rows, cols, input_scale, packed.data(),
                             scales.data());
  for (size_t i = 0; i < n; ++i) {
    const uint8_t byte = packed[i / 2];
    const uint8_t code = (i & 1) ? uint8_t(byte >> 4) : uint8_t(byte & 15);
    // Exact in float: a 2-bit by 4-bit significand product.
    out_unscaled[i] =
        nvfp4::e2m1_to_float(code) * nvfp4::e4m3_to_float(scales[i / nvfp4::kBlock]);
  }
}

void w4a4_gemm1_row_cpu(const ExpertMlpF32& w, int e, const uint16_t* x, float input_scale13,
                        float input_scale2, float* act_unscaled) {
  check_expert(w, e);
  const int H = w.hidden, I = w.inter;
  const float* w13 = w.w13 + size_t(e) * 2 * I * H;  // [2I, H] gate rows, then up rows
  std::vector<float> xq(H);                          // [H] unscaled NVFP4 x
  w4a4_quantize_rows_cpu(x, 1, H, input_scale13, xq.data());
  std::vector<uint16_t> act(I);                      // [I] bf16 silu(g) * u
  for (int i = 0; i < I; ++i) {
    float g = 0.0f, u = 0.0f;
    for (int h = 0; h < H; ++h) {
      g += w13[size_t(i) * H + h] * xq[h];
      u += w13[size_t(I + i) * H + h] * xq[h];
    }
    g *= input_scale13;
    u *= input_scale13;
    act[i] = float_to_bf16(silu(g) * u);
  }
  w4a4_quantize_rows_cpu(act.data(), 1, I, input_scale2, act_unscaled);
}

void w4a4_gemm2_row_cpu(const ExpertMlpF32& w, int e, const float* act_unscaled,
                        float input_scale2, float* y) {
  check_expert(w, e);
  const int H = w.hidden, I = w.inter;
  const float* w2 = w.w2 + size_t(e) * H * I;  // [H, I]
  for (int h = 0; h < H; ++h) {
    float acc = 0.0f;
    for (int i = 0; i < I; ++i) acc += w2[size_t(h) * I + i] * act_unscaled[i];
    y[h] = acc * input_scale2;
  }
}

void moe_experts_w4a4_cpu(const uint16_t* x, int T, const int32_t* ids, const float* weights,
                          int top_k, const ExpertMlpF32& w, const W4a4InputScales& scales,
                          float* out) {
  if (!scales.gate_up || !scales.down) TETRA_FAIL("w4a4 reference: input scales are missing");
  TETRA_CHECK(T >= 0 && top_k >= 1, "T=", T, " top_k=", top_k);
  const int H = w.hidden;
  std::vector<float> act(static_cast<size_t>(w.inter));  // [I] unscaled NVFP4 act
  std::vector<float> y(static_cast<size_t>(H));        // [H] one expert's output
  for (int t = 0; t < T; ++t) {
    float* o = out + size_t(t) * H;
    for (int h = 0; h < H; ++h) o[h] = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const int32_t e = ids[size_t(t) * top_k + j];
      if (e < 0 || e >= w.num_experts)
        TETRA_FAIL("w4a4 reference: expert id ", e, " of token ", t, " outside [0, ",
                   w.num_experts, ")");
      w4a4_gemm1_row_cpu(w, e, x + size_t(t) * H, scales.gate_up[e], scales.down[e], act.data());
      w4a4_gemm2_row_cpu(w, e, act.data(), scales.down[e], y.data());
      const float wj = weights[size_t(t) * top_k + j];
      for (int h = 0; h < H; ++h) o[h] += wj * y[h];
    }
  }
}

}  // namespace tetra::moe
