// The add + RMSNorm that follows a MoE block in a decoder (MODELS.md "Decoder block"), for a
// backend that runs it inside its combine, one launch less per layer (MoeLayerRunner::
// forward_add_rms_norm, ops/moe/moe_ops_cuda.h CombineOptions::add_norm):
//   residual [T, H] <- bf16(out + residual);  normed [T, H] = rms_norm(residual) * weight
// with the arithmetic of ops::cuda::fused_add_rms_norm (its sum of squares in another order).
#pragma once
#include <cmath>
#include <cstdint>

namespace tetra::moe {

// The RMSNorm before a MoE block (the post-attention norm), folded into the block's first launch
// (MoeLayerRunner::takes_pre_norm): the block then gets the un-normalised row h as x and writes
//   normed [T, H] = rms_norm(h) * weight
// (with ops::cuda::fused_add_rms_norm's arithmetic, its sum of squares in another order), which its
// GEMMs read. The residual add before it is done by o_proj's epilogue (Nvfp4GemvOutput::residual).
struct PreRmsNormStep {
  const uint16_t* weight = nullptr;  // [H] bf16
  float eps = 0.0f;
  uint16_t* normed = nullptr;        // [T, H] bf16, not aliasing x
  // The router fold (moe/router_fold.h, MoeLayerRunner::router_fold): o_proj's epilogue already
  // wrote normed = bf16(g * h) and the layer's sums; the block reads them instead of normalising.
  bool router_folded = false;
};

// The norm's 1/rms left to the linear that reads its output (the next layer's q/k/v GEMV,
// ops/linear/linear_cuda.h linear_nvfp4_gemv_norm_folded): the producer writes
//   gx [T, H] = bf16(residual * weight)   (in place of normed)
//   sums [T, parts]: part p's sum of squares of the new residual row t (f32, one block each)
// and the reader takes inv_rms = rsqrt((sums[t, 0] + ... + sums[t, parts - 1]) / H + eps), in
// that order, and scales its f32 dot products by it before rounding them to bf16. No cluster or
// grid-wide reduction in the producer, and the same bits for every reader of a row. It is the
// reference's rms_norm + linear in another order of rounding (g * h is rounded instead of
// h * inv_rms * g), as the router fold (moe/router_fold.h).
inline constexpr int kNormFoldMaxParts = 32;
struct NormFold {
  float* sums = nullptr;  // [T, parts]
  int parts = 0;          // 1..kNormFoldMaxParts, the producer's blocks per row
  int H = 0;
  float eps = 0.0f;
};
// Host twin of the reader's inv_rms for one row's sums [parts].
inline float norm_fold_inv_rms(const float* row_sums, int parts, int H, float eps) {
  float s = 0.0f;
  for (int p = 0; p < parts; ++p) s += row_sums[p];
  return 1.0f / std::sqrt(s / float(H) + eps);
}

struct AddRmsNormStep {
  uint16_t* residual = nullptr;      // [T, H] bf16, updated in place
  const uint16_t* weight = nullptr;  // [H] bf16
  float eps = 0.0f;
  uint16_t* normed = nullptr;        // [T, H] bf16 (with `fold`: gx)
  // Not null: the norm folded into normed's reader (NormFold); fold->parts is the producer's.
  const NormFold* fold = nullptr;
};

}  // namespace tetra::moe
