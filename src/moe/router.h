// MoE routing on the CPU: router logits (x @ W_gate^T) and expert selection, float32 throughout.
// The semantics are those of MODELS.md "Routing (sigmoid, noaux_tc)" and Qwen3-MoE softmax top-k.
// The CUDA twins (ops/moe/moe_ops_cuda.h) produce bit-identical ids and weights.
#pragma once
#include <cstdint>

namespace tetra::moe {

enum class Scoring { Sigmoid, Softmax };
const char* scoring_name(Scoring s);

struct RouterParams {
  Scoring scoring = Scoring::Sigmoid;
  int num_experts = 0;  // E
  int top_k = 0;        // experts per token
  int n_group = 1;      // expert groups for group-limited selection (noaux_tc); 1 = none
  int topk_group = 1;   // groups kept per token when n_group > 1
  bool norm_topk_prob = true;          // divide the k weights by their sum (+1e-20)
  float routed_scaling_factor = 1.0f;  // applied after the normalisation
};

// Throws tetra::Error naming the bad field: E >= 1, 1 <= top_k <= E (and <= 32), E % n_group == 0,
// group size >= 2 when grouped (the group score needs a top-2), n_group <= 32,
// 1 <= topk_group <= n_group, top_k <= topk_group * group size, finite scaling factor > 0.
void validate_router_params(const RouterParams& p);

inline constexpr int kMaxTopK = 32;    // one warp lane per selected expert on the GPU
inline constexpr int kMaxGroups = 32;  // one warp lane per group on the GPU

// Expert selection for T tokens.
//   logits  [T, E] f32   router GEMM output
//   bias    [E] f32 or nullptr   e_score_correction_bias: added to the scores for CHOOSING only
//   ids     [T, top_k] int32     chosen experts, best first (by biased score; ties to lower index)
//   weights [T, top_k] f32       unbiased scores of the chosen experts, renormalised if
//                                norm_topk_prob, times routed_scaling_factor
// Sigmoid: s = sigmoid(logit). Softmax: s = softmax over all E experts.
// If n_group > 1: group score = sum of the two best biased scores in the group; the topk_group best
// groups (ties to the lower group) stay selectable, the others are masked out.
// NaN scores rank as -Inf, so ids are always valid and distinct.
void route_cpu(const float* logits, const float* bias, int T, const RouterParams& p, int32_t* ids,
               float* weights);

// Router logits, float32 accumulation in a fixed order (the CUDA router_logits order: lane l of
// 32 owns the 8-element blocks b with b % 32 == l, FMAs in ascending k, then a butterfly sum).
//   x      [T, H] f32 or bf16 bits      activations
//   w_gate [E, H] bf16 bits or f32      router weight (mlp.gate.weight)
//   logits [T, E] f32
void router_logits_cpu(const float* x, const uint16_t* w_gate_bf16, int T, int H, int E,
                       float* logits);
void router_logits_cpu(const uint16_t* x_bf16, const uint16_t* w_gate_bf16, int T, int H, int E,
                       float* logits);
void router_logits_cpu(const float* x, const float* w_gate, int T, int H, int E, float* logits);

}  // namespace tetra::moe
