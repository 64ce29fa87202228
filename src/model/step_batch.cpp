#include "model/step_batch.h"

#include "core/error.h"

namespace tetra::model {

// Decode, and prefill with a cached prefix: sequence s holds seq_lens[s] cached tokens (this
// step's included), its len_s new tokens are the last ones (positions seq_lens[s] - len_s ..),
// and the table names valid blocks for all of them.
void StepBatch::validate_block_tables(const OpsLimits& lim) const {
  const int S = num_seqs();
  const char* what = kind == StepKind::Prefill ? "prefill step" : "decode step";
  if (max_blocks_per_seq <= 0 || max_blocks_per_seq > lim.max_blocks_per_seq)
    TETRA_FAIL(what, ": max_blocks_per_seq ", max_blocks_per_seq, " must be in [1, ",
               lim.max_blocks_per_seq, "]");
  if (block_tables.size() != size_t(S) * size_t(max_blocks_per_seq) || seq_lens.size() != size_t(S))
    TETRA_FAIL(what, ": block_tables must be [", S, ", ", max_blocks_per_seq, "] and seq_lens [",
               S, "]");
  for (int s = 0; s < S; ++s) {
    const int len = seq_lens[size_t(s)];
    const int n_new = cu_seqlens[size_t(s) + 1] - cu_seqlens[size_t(s)];
    if (len < n_new || len > max_blocks_per_seq * lim.kv_block_size)
      TETRA_FAIL(what, ": seq_lens[", s, "] = ", len, " does not fit its block table or is shorter than its ",
                 n_new, " new tokens");
    for (int i = 0; i < n_new; ++i) {
      const int32_t pos = positions[size_t(cu_seqlens[size_t(s)] + i)];
      if (pos != len - n_new + i)
        TETRA_FAIL(what, ": sequence ", s, " has position ", pos, " at new token ", i, " but holds ", len,
                   " cached tokens (the new tokens must be the last ", n_new, ")");
    }
    const int used = (len + lim.kv_block_size - 1) / lim.kv_block_size;
    for (int b = 0; b < used; ++b) {
      const int32_t id = block_tables[size_t(s) * size_t(max_blocks_per_seq) + size_t(b)];
      if (id < 0 || id >= lim.kv_num_blocks)
        TETRA_FAIL(what, ": block table of sequence ", s, " names block ", id, " outside [0, ",
                   lim.kv_num_blocks, ")");
    }
  }
}

void StepBatch::validate(const OpsLimits& lim, int64_t vocab_size) const {
  const int T = num_tokens();
  const int S = num_seqs();
  const char* what = kind == StepKind::Prefill ? "prefill step" : "decode step";
  if (T == 0 || S == 0) TETRA_FAIL(what, " has no tokens or no sequences");
  if (T > lim.max_tokens) TETRA_FAIL(what, " has ", T, " tokens; the backend is sized for ", lim.max_tokens);
  if (S > lim.max_seqs) TETRA_FAIL(what, " has ", S, " sequences; the backend is sized for ", lim.max_seqs);
  if (positions.size() != size_t(T) || slots.size() != size_t(T))
    TETRA_FAIL(what, ": tokens, positions and slots must have one entry per token (", T, ", ",
               positions.size(), ", ", slots.size(), ")");
  if (cu_seqlens.front() != 0 || cu_seqlens.back() != T)
    TETRA_FAIL(what, ": cu_seqlens must run from 0 to the token count ", T);
  for (int s = 0; s < S; ++s)
    if (cu_seqlens[size_t(s) + 1] <= cu_seqlens[size_t(s)])
      TETRA_FAIL(what, ": sequence ", s, " is empty or cu_seqlens is not increasing");
  const int64_t total_slots = int64_t(lim.kv_num_blocks) * lim.kv_block_size;
  for (int t = 0; t < T; ++t) {
    if (tokens[size_t(t)] < 0 || tokens[size_t(t)] >= vocab_size)
      TETRA_FAIL(what, ": token id ", tokens[size_t(t)], " at row ", t, " is outside [0, ", vocab_size, ")");
    if (positions[size_t(t)] < 0) TETRA_FAIL(what, ": negative position at row ", t);
    if (slots[size_t(t)] < 0 || slots[size_t(t)] >= total_slots)
      TETRA_FAIL(what, ": KV slot ", slots[size_t(t)], " at row ", t, " is outside the cache (",
                 total_slots, " slots)");
  }
  if (kind == StepKind::Decode && T != S)
    TETRA_FAIL("decode step needs exactly one token per sequence (", T, " tokens, ", S, " sequences)");
  if (kind == StepKind::Decode || has_cached_prefix()) validate_block_tables(lim);
  int prev = -1;
  for (int32_t r : logit_rows) {
    if (r <= prev || r >= T)
      TETRA_FAIL(what, ": logit_rows must be ascending rows in [0, ", T, ")");
    prev = r;
  }
}

}  // namespace tetra::model
