// The add + RMSNorm that follows a MoE block in a decoder (MODELS.md "Decoder block"), for a
// backend that runs it inside its combine, one launch less per layer (MoeLayerRunner::
// forward_add_rms_norm, ops/moe/moe_ops_cuda.h CombineOptions::add_norm):
//   residual [T, H] <- bf16(out + residual);  normed [T, H] = rms_norm(residual) * weight
// with the arithmetic of ops::cuda::fused_add_rms_norm (its sum of squares in another order).
#pragma once
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

struct AddRmsNormStep {
  uint16_t* residual = nullptr;      // [T, H] bf16, updated in place
  const uint16_t* weight = nullptr;  // [H] bf16
  float eps = 0.0f;
  uint16_t* normed = nullptr;        // [T, H] bf16
};

}  // namespace tetra::moe
