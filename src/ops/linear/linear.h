// Dense linear layers on the CPU: the reference the CUDA linears (linear_cuda.h) are checked
// against. y[M, N] = x[M, K] . W^T (+ bias), float accumulation, one rounding at the output.
// NVFP4 weights are dequantized exactly as format/nvfp4.h does (E2M1 * E4M3 * weight_scale_2).
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "moe/expert_weights.h"

namespace tetra::ops {

// x [M, K] bf16, w [N, K] bf16, bias [N] bf16 or null -> y [M, N] in out_dtype (F32 or BF16).
void linear_bf16_cpu(const uint16_t* x, int M, int K, const uint16_t* w, int N,
                     const uint16_t* bias, void* y, DType out_dtype);

// x [M, w.k] bf16, w NVFP4 [w.n, w.k] (ModelOpt bytes), bias [w.n] bf16 or null
// -> y [M, w.n] in out_dtype (F32 or BF16). Throws naming w.name on a NaN block scale.
void linear_nvfp4_cpu(const uint16_t* x, int M, const Nvfp4MatrixView& w, const uint16_t* bias,
                      void* y, DType out_dtype);

// Gated MLP input half: act[M, I] = bf16(silu(x . gate^T) * (x . up^T)), gate/up NVFP4 [I, K],
// both products kept in float until the one rounding (what the fused CUDA kernel does).
void gate_up_silu_nvfp4_cpu(const uint16_t* x, int M, const Nvfp4MatrixView& gate,
                            const Nvfp4MatrixView& up, uint16_t* act);

}  // namespace tetra::ops
