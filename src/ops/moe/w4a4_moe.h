// W4A4 grouped MoE GEMMs for SM90 ("Blackwell numerics on Hopper"): activations quantized to
// NVFP4 with each expert's checkpoint input_scale, FP4 x FP4 products, fp32 accumulation.
//
// How, exactly: SM90 has no FP4 MMA, but every product E2M1 * E4M3 is exact in bf16 (at most 5
// significant bits). So the activation quantizer writes each NVFP4 element dequantized WITHOUT its
// global scale, E2M1(q) * SF (an exact bf16), and the existing W4A16 kernels (ops/moe/w4a16_moe.h)
// multiply it by the exactly dequantized weight: every product is E2M1(a)*SF_a * E2M1(w)*SF_w,
// accumulated in fp32. The global factors go into the per-expert epilogue alpha:
//   alpha = input_scale * weight_scale_2   (NVFP4.md g1_alpha / g2_alpha)
// folded once at load time by fold_w4a4_input_scales (moe/w4a4_scales.h).
//
// Activation quantization (NVFP4.md), per row and 16-block, with s = that row's expert's scale:
//   SF = e4m3_rne_sat(max|x_block| / 6 * (1/s));  q = e2m1_rne_sat(x / (SF * s))  (0 if SF == 0)
// the same shared per-element code as quantize_activation (format/nvfp4.h), so the bf16 values
// equal the CPU twin's (moe/w4a4_reference.h) bit for bit.
//
// Pipeline of one layer (same row mapping as W4A16, MoeRows):
//   moe_w4a4_gemm1: xq = NVFP4(x[gather[r]], s13[e]) -> W4A16 GEMM1 + SiLU*up -> act (bf16)
//                   -> act = NVFP4(act, s2[e]) in place: act leaves GEMM1 as GEMM2's FP4 input
//                   (what a fused Blackwell GEMM1 epilogue emits), unscaled.
//   moe_w4a4_gemm2: W4A16 GEMM2 on that act.
// Rows of the masked layout past an expert's count are neither read nor written.
// With MoeKernel::kWgmma (given to both GEMMs) the warpgroup-MMA kernel runs: xq and act are then
// kept in wgmma order (moe/wgmma_order.h; x itself stays natural) and the quantizer finds each
// 16-element block's members through that permutation.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/moe/w4a16_moe.h"

namespace tetra {

struct MoeW4a4WeightsDevice {
  MoeWeightsDevice w;                  // packed weights; alphas folded with the input scales
  const float* input_scale13 = nullptr;  // [E] GEMM1 activation scale per expert
  const float* input_scale2 = nullptr;   // [E] GEMM2 activation scale per expert
};

// Quantizes the used rows of a grouped activation buffer to unscaled NVFP4 (bf16 values).
// For r in [0, row_count[e]) of every slot's expert e: dst[row_start[e] + r] =
// NVFP4(src[gather ? gather[row_start[e] + r] : row_start[e] + r], input_scale[e]).
//   src: [.., cols] bf16, dst: [total_rows, cols] bf16 (may equal src when gather is null);
//   cols % 16 == 0. `gather` of `rows` is honoured only when use_gather is true.
//   order: whether src / dst rows are in wgmma order (the values of a block are the same).
struct QuantizeRowOrder {
  bool src_wgmma = false;
  bool dst_wgmma = false;
};
cudaError_t moe_w4a4_quantize_rows(const MoeGemmProblem& p, const MoeRows& rows, bool use_gather,
                                   const uint16_t* src, int cols, const float* input_scale,
                                   uint16_t* dst, cudaStream_t stream,
                                   QuantizeRowOrder order = {});

// GEMM1 + SiLU*up + quantization of act for GEMM2. x: [.., H] bf16 (via rows.gather);
// xq: workspace [total_rows, H] bf16; act: [total_rows, I] bf16 unscaled NVFP4 values (both in
// wgmma order when kernel is kWgmma).
cudaError_t moe_w4a4_gemm1(const MoeGemmProblem& p, const MoeW4a4WeightsDevice& w,
                           const MoeRows& rows, const uint16_t* x, uint16_t* xq, uint16_t* act,
                           cudaStream_t stream, MoeKernel kernel = MoeKernel::kAuto);

// GEMM2 on act as moe_w4a4_gemm1 leaves it. y: [total_rows, H], f32 when y_f32 else bf16.
cudaError_t moe_w4a4_gemm2(const MoeGemmProblem& p, const MoeW4a4WeightsDevice& w,
                           const MoeRows& rows, const uint16_t* act, void* y, bool y_f32,
                           cudaStream_t stream, MoeKernel kernel = MoeKernel::kAuto);

}  // namespace tetra
