// CPU reference of a whole MoE layer with float32 weights (dequantized by the caller) and float32
// accumulation. Slow on purpose: plain loops that are easy to check, the yardstick for the GPU path.
//   out = sum_j w_j * Expert_{id_j}(x) + Shared(x),   Expert(x) = down(silu(gate(x)) * up(x))
// The intermediate silu(g)*u stays float32 here (a GPU path rounds it to bf16 or quantizes it).
#pragma once
#include <cstdint>

#include "moe/router.h"

namespace tetra::moe {

// A stack of MLP experts in float32. The shared expert is a stack of one (n_shared_experts are
// already fused into one MLP of width I = n_shared * moe_intermediate by the checkpoint).
struct ExpertMlpF32 {
  const float* w13 = nullptr;  // [E, 2*I, H] rows 0..I-1 gate_proj, rows I..2I-1 up_proj
  const float* w2 = nullptr;   // [E, H, I] down_proj
  int num_experts = 0;         // E (0 = absent, only allowed for the shared expert)
  int hidden = 0;              // H
  int inter = 0;               // I
};

struct MoeLayerF32 {
  const float* gate = nullptr;  // [E, H] router weight (mlp.gate.weight)
  const float* bias = nullptr;  // [E] e_score_correction_bias, or nullptr
  RouterParams router;
  ExpertMlpF32 experts;  // routed experts, num_experts == router.num_experts
  ExpertMlpF32 shared;   // num_experts 0 (none) or 1
};

// y [H] = Expert_e(x), x [H].
void expert_mlp_cpu(const ExpertMlpF32& w, int e, const float* x, float* y);

// out [T, H] = sum_j weights[t, j] * Expert_{ids[t, j]}(x[t]) for given routing.
//   x [T, H] f32, ids [T, top_k] int32, weights [T, top_k] f32
void moe_experts_cpu(const float* x, int T, const int32_t* ids, const float* weights, int top_k,
                     const ExpertMlpF32& w, float* out);

// The layer: logits = x @ gate^T (router_logits_cpu), route_cpu, routed experts, + shared expert.
//   x [T, H] f32 -> out [T, H] f32; ids_out [T, top_k] / weights_out [T, top_k] if not null.
void moe_layer_cpu(const float* x, int T, const MoeLayerF32& layer, float* out,
                   int32_t* ids_out = nullptr, float* weights_out = nullptr);

}  // namespace tetra::moe
