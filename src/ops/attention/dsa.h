// GLM-5's DeepSeek Sparse Attention (DSA) indexer, CPU reference: which of a token's earlier
// keys its MLA attention reads once the context is longer than index_topk (MODELS.md; the
// transformers GlmMoeDsaIndexer in bf16, without the reference's FP8 and Hadamard steps, which
// preserve the scores up to rounding). Per layer with an indexer:
//   k_idx = rope(LayerNorm(wk(x)))          [D] per token, kept in its own cache (this file)
//   q_idx = rope(wq_b(q_latent))            [Hi, D] per token (q_latent: q_a_layernorm's output)
//   w     = weights_proj(x) * Hi^-0.5       [Hi]
//   score[t, j] = sum_h relu(q_idx[t, h] . k_idx[j] * D^-0.5) * w[t, h]
// and token t keeps the min(topk, its key count) keys of highest score (causal: keys 0 ..
// positions[t] of its sequence). RoPE turns the first Dr dims of every q/k head (Dr =
// qk_rope_head_dim), pairs per the config's indexer_rope_interleave. Layers whose
// indexer_types entry is "shared" reuse the previous layer's selection.
// Status: the ops and their tests; the model runtime does not call them yet (it caps GLM-5's
// context at index_topk, where the selection is every key).
#pragma once
#include <cstdint>

#include "ops/attention/mla.h"
#include "ops/rope/rope.h"

namespace tetra::ops {

struct DsaShape {
  int n_heads = 0;   // Hi: index_n_heads
  int head_dim = 0;  // D: index_head_dim
  int rope_dim = 0;  // Dr: the leading dims of each head that rotate (qk_rope_head_dim)
  int topk = 0;      // index_topk
  RopeStyle style = RopeStyle::NeoX;
};

// Refuses inconsistent shapes with a tetra::Error naming the field.
void check_dsa_shape(const DsaShape& s);

// For every token t with slots[t] >= 0: key_cache[slots[t]] =
//   bf16(rope(bf16(LayerNorm(wk_out[t]) * ln_w + ln_b), positions[t])), LayerNorm with eps.
// wk_out [T, D] bf16, ln_w / ln_b [D] bf16, inv_freq [Dr / 2], key_cache [num_slots, D] bf16.
void dsa_index_keys_cpu(const uint16_t* wk_out, const uint16_t* ln_w, const uint16_t* ln_b,
                        float eps, const int32_t* positions, const int64_t* slots, int T,
                        const float* inv_freq, const DsaShape& s, int64_t num_slots,
                        uint16_t* key_cache);

// Token t of sequence s (cu_seqlens [S + 1]) scores its keys j = 0 .. positions[t] (addresses
// as MlaKeys says; `selected` there is ignored) and writes the positions of the
// n_t = min(topk, positions[t] + 1) best, ascending, to selected[t, 0 .. n_t); ties go to the
// lower position. q [T, Hi, D] bf16 (wq_b output, turned here: q is not modified), weights
// [T, Hi] bf16 (weights_proj output), key_cache [num_slots, D] bf16, selected [T, topk] int32
// (entries past n_t are left as they are).
void dsa_select_cpu(const uint16_t* q, const uint16_t* weights, const uint16_t* key_cache,
                    int64_t num_slots, const int32_t* cu_seqlens, int S, const int32_t* positions,
                    const MlaKeys& keys, const float* inv_freq, const DsaShape& s,
                    int32_t* selected);

}  // namespace tetra::ops
