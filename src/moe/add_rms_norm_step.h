// The add + RMSNorm that follows a MoE block in a decoder (MODELS.md "Decoder block"), for a
// backend that runs it inside its combine, one launch less per layer (MoeLayerRunner::
// forward_add_rms_norm, ops/moe/moe_ops_cuda.h CombineOptions::add_norm):
//   residual [T, H] <- bf16(out + residual);  normed [T, H] = rms_norm(residual) * weight
// with the arithmetic of ops::cuda::fused_add_rms_norm (its sum of squares in another order).
#pragma once
#include <algorithm>
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
// and the reader takes inv_rms = rsqrt(sum of sums[t, :] / H + eps), added in a fixed order
// (norm_fold_inv_rms), and scales its f32 dot products by it before rounding them to bf16. No cluster or
// grid-wide reduction in the producer, and the same bits for every reader of a row. It is the
// reference's rms_norm + linear in another order of rounding (g * h is rounded instead of
// h * inv_rms * g), as the router fold (moe/router_fold.h).
// A reader stages a launch's sums at once: tokens * parts <= kNormFoldMaxSums.
inline constexpr int kNormFoldMaxSums = 256;
struct NormFold {
  float* sums = nullptr;  // [T, parts]
  int parts = 0;          // the producer's blocks per row (MoeLayerRunner::norm_fold_parts)
  int H = 0;
  float eps = 0.0f;
};
// Host twin of the reader's inv_rms for one row's sums [parts], in the GEMV's order: lane j of a
// warp adds parts j, j + 32, ..., then a xor butterfly over the 32 lanes (every lane ends with
// the same bits). The device's rsqrtf may differ from 1 / sqrt in the last bits.
inline float norm_fold_inv_rms(const float* row_sums, int parts, int H, float eps) {
  float lane[32] = {};
  for (int p = 0; p < parts; ++p) lane[p % 32] += row_sums[p];
  for (int off = 16; off >= 1; off /= 2) {
    float next[32];
    for (int j = 0; j < 32; ++j) next[j] = lane[j] + lane[j ^ off];
    std::copy(next, next + 32, lane);
  }
  return 1.0f / std::sqrt(lane[0] / float(H) + eps);
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
