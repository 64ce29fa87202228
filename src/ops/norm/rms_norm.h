// RMSNorm family, CPU reference: y = x / sqrt(mean(x^2) + eps) * w, float math, one bf16 rounding.
// bf16 tensors are uint16_t bits. The CUDA twins (ops/norm/rms_norm_cuda.h) take the same shapes.
#pragma once
#include <cstdint>

namespace tetra::ops {

// out [T, H] bf16 = rmsnorm(x [T, H] bf16) * w [H] bf16. out may alias x.
void rms_norm_cpu(const uint16_t* x, const uint16_t* w, int T, int H, float eps, uint16_t* out);

// Pre-norm residual step of a decoder block:
//   residual [T, H] bf16 <- bf16(x + residual);  out [T, H] bf16 = rms_norm(residual) * w.
// The norm reads the rounded residual, so out equals rms_norm_cpu of the stored residual.
// out may alias x.
void fused_add_rms_norm_cpu(const uint16_t* x, uint16_t* residual, const uint16_t* w, int T,
                            int H, float eps, uint16_t* out);

// Per-head RMSNorm in place (GLM-4.x use_qk_norm, Qwen3 q_norm/k_norm), applied before RoPE:
//   x: T tokens, token t's heads at x + t*token_stride, each [n_heads, head_dim] bf16 contiguous;
//   w [head_dim] bf16 shared by all heads. token_stride (elements) lets x live inside a fused
//   qkv buffer.
void head_rms_norm_cpu(uint16_t* x, int T, int n_heads, int head_dim, int64_t token_stride,
                       const uint16_t* w, float eps);

}  // namespace tetra::ops
