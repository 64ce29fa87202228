// Extend attention (chunked prefill, recompute after preemption): a run of new tokens per
// sequence attends causally to its sequence's paged KV cache, which already holds the earlier
// tokens and this run's own k/v. New token i of sequence s sits at position
// p = seq_lens[s] - len_s + i (len_s = cu_seqlens[s+1] - cu_seqlens[s]) and attends to cache
// positions 0 .. p. With an empty prefix this is prefill attention over the cache.
// GQA: query head h reads kv head h / (n_heads / n_kv_heads). Softmax in float with the row max
// subtracted; out = sum_j p_j v_j / sum_j p_j rounded to bf16 once.
#pragma once
#include <cstdint>

#include "ops/attention/attention.h"

namespace tetra::ops {

// CPU reference. q [T, n_heads, head_dim] (token stride shape.q_step()), cu_seqlens
// [num_seqs + 1] int32, kv.block_tables / kv.seq_lens as in PagedKv (seq_lens count this run's
// tokens), out [T, n_heads, head_dim] packed. Bad lengths or block ids throw tetra::Error.
void paged_extend_attention_cpu(const uint16_t* q, const int32_t* cu_seqlens, int num_seqs,
                                const PagedKv& kv, const AttentionShape& s, uint16_t* out);

}  // namespace tetra::ops
