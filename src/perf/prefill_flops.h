// Model FLOPs of a prefill: how much arithmetic one sequence's prompt needs, so that a measured
// prefill time reads as an achieved FLOP rate (the MFU convention: 2 FLOPs per multiply-add of
// the model's matmuls; norms, activations, softmax, RoPE and routing's top-k count nothing).
//   linear:    2 * T * (weights one token multiplies: attention projections, dense MLPs, the
//              shared and top_k routed experts, routers, DSA indexer projections)
//              + 2 * R * lm_head (R logit rows: the prompt's last position)
//   attention: per layer 2 * pairs * heads * (d_qk + d_v), pairs = T (T + 1) / 2 causal
//              (query, key) pairs; GQA d_qk = d_v = head_dim, MLA d_qk = qk_nope + qk_rope and
//              d_v = v_head_dim (the un-absorbed form a prefill runs). DSA keeps min(t, index_topk)
//              keys for query t, and when T > index_topk each layer with an indexer adds its
//              scores, 2 * pairs * index_n_heads * index_head_dim (and its projections count
//              in linear; at T <= index_topk every key is kept and the indexer is skipped).
#pragma once
#include <cstdint>

#include "format/model_config.h"
#include "format/quant_config.h"

namespace tetra {

struct PrefillFlops {
  double linear = 0, attention = 0;
  double total() const { return linear + attention; }
};

// Error (a user-facing tetra::Error) when tokens < 1 or logit_rows is outside [0, tokens].
PrefillFlops prefill_flops(const ModelConfig&, const QuantConfig&, int64_t tokens,
                           int64_t logit_rows = 1);

}  // namespace tetra
