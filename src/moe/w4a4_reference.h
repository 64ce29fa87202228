// CPU twin of the cuda-w4a4 MoE GEMMs: NVFP4 activation quantization (format/nvfp4.h,
// quantize_activation) followed by float32 math on dequantized weights.
//
// Numerics, per expert e (NVFP4.md "Activation quantization"):
//   xq   = NVFP4(x, input_scale13[e])               E2M1 * SF per 16-block, times input_scale13[e]
//   g, u = xq . gate_e^T, xq . up_e^T               float32 accumulation
//   a    = bf16(silu(g) * u)                        rounded to bf16 like the GPU's GEMM1 output
//   aq   = NVFP4(a, input_scale2[e])
//   y    = aq . down_e^T
// The bf16 rounding of `a` before its quantization is part of the recipe: without it, a value that
// sits near an E2M1 boundary would round differently than on the GPU.
//
// "Unscaled" values below are E2M1 * SF without the tensor's input_scale: the exact numbers the
// GPU keeps in bf16 (E2M1 * E4M3 has at most 5 significant bits, so bf16 holds it exactly).
#pragma once
#include <cstdint>

#include "moe/moe_reference.h"

namespace tetra::moe {

// Per-expert activation scales of a W4A4 layer.
struct W4a4InputScales {
  const float* gate_up = nullptr;  // [E] GEMM1 input_scale (max of gate_proj and up_proj's)
  const float* down = nullptr;     // [E] GEMM2 input_scale (down_proj.input_scale)
};

// x: [rows, cols] bf16 bits, cols % 16 == 0 -> out: [rows, cols] float, unscaled NVFP4 values.
void w4a4_quantize_rows_cpu(const uint16_t* x, int64_t rows, int64_t cols, float input_scale,
                            float* out_unscaled);

// GEMM1 of expert e for one row: x [H] bf16 -> act_unscaled [I], the NVFP4 form of
// bf16(silu(g) * u) quantized with input_scale2 (unscaled, as the GPU's act buffer holds it).
void w4a4_gemm1_row_cpu(const ExpertMlpF32& w, int e, const uint16_t* x, float input_scale13,
                        float input_scale2, float* act_unscaled);

// GEMM2 of expert e for one row: act_unscaled [I] (NVFP4 values without input_scale2) -> y [H].
void w4a4_gemm2_row_cpu(const ExpertMlpF32& w, int e, const float* act_unscaled,
                        float input_scale2, float* y);

// out [T, H] = sum_j weights[t, j] * ExpertW4A4_{ids[t, j]}(x[t]): the cpu yardstick of a whole
// W4A4 routed-expert pass. x [T, H] bf16 bits, ids/weights [T, top_k].
void moe_experts_w4a4_cpu(const uint16_t* x, int T, const int32_t* ids, const float* weights,
                          int top_k, const ExpertMlpF32& w, const W4a4InputScales& scales,
                          float* out);

}  // namespace tetra::moe
