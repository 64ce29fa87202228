// Activation scales of a W4A4 (NVFP4 x NVFP4) MoE layer and how they reach the GEMM epilogue.
//
// Tetra's choices (NVFP4.md leaves them to the engine):
//   - one activation scale per expert, no max over experts;
//   - GEMM1's scale is max(gate_proj.input_scale, up_proj.input_scale) of that expert (gate and
//     up read the same x, and the fused w13 GEMM quantizes x once; ModelOpt exports usually have
//     them equal);
//   - the epilogue factor is alpha = input_scale * weight_scale_2 (NVFP4.md g1_alpha/g2_alpha),
//     folded once at load time into the packed layer's alphas (which already carry 2^10, see
//     moe/expert_weights.h), so the W4A16 GEMMs run unchanged on unscaled NVFP4 activations.
#pragma once
#include <string>
#include <vector>

#include "moe/expert_weights.h"

namespace tetra {

// Throws tetra::Error naming `name` unless the scale is positive, finite, and its reciprocal
// (used to build block scales) is finite too.
void check_input_scale(float input_scale, const std::string& name);

// GEMM1's per-expert scale from the two checkpoint tensors (both checked).
float w4a4_gate_up_input_scale(float gate_input_scale, float up_input_scale,
                               const std::string& expert_name);

// alpha_gate[e], alpha_up[e] *= input_scale13[e]; alpha_down[e] *= input_scale2[e].
// Both vectors have layer.num_experts entries (else Error). Call once per packed layer.
void fold_w4a4_input_scales(PackedMoeLayer& layer, const std::vector<float>& input_scale13,
                            const std::vector<float>& input_scale2);

}  // namespace tetra
