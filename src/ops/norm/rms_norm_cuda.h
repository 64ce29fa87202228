// CUDA twins of ops/norm/rms_norm.h: same shapes and semantics, device pointers, one stream.
// Float accumulation (a different summation order than the CPU's double), one bf16 rounding.
// Sizes are checked before launch (tetra::Error); the launch's cudaError_t is returned.
// rms_norm and fused_add_rms_norm launch as programmatic dependents: x and residual may come from
// the kernel just before, w may not (the one-pass kernel reads it before waiting for that kernel).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace tetra::ops::cuda {

// out [T, H] = rms_norm(x [T, H]) * w [H]; out may alias x.
cudaError_t rms_norm(const uint16_t* x, const uint16_t* w, int T, int H, float eps, uint16_t* out,
                     cudaStream_t stream);

// residual [T, H] <- bf16(x + residual); out [T, H] = rms_norm(residual) * w; out may alias x.
cudaError_t fused_add_rms_norm(const uint16_t* x, uint16_t* residual, const uint16_t* w, int T,
                               int H, float eps, uint16_t* out, cudaStream_t stream);

// In place over T tokens x n_heads heads of head_dim (token t at x + t*token_stride).
cudaError_t head_rms_norm(uint16_t* x, int T, int n_heads, int head_dim, int64_t token_stride,
                          const uint16_t* w, float eps, cudaStream_t stream);

// head_rms_norm of q (q_heads per token, weight wq) and k (k_heads, wk) in one launch,
// bit-identical to the two launches; head_dim <= 256. A programmatic dependent: q and k may come
// from the kernel just before, wq and wk may not.
cudaError_t head_rms_norm_qk(uint16_t* q, int64_t q_stride, int q_heads, const uint16_t* wq,
                             uint16_t* k, int64_t k_stride, int k_heads, const uint16_t* wk, int T,
                             int head_dim, float eps, cudaStream_t stream);

}  // namespace tetra::ops::cuda
