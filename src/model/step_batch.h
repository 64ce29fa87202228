// One forward step of the model: a set of sequences, each bringing new tokens. A step is either
// a prefill (each sequence brings a run of tokens with causal attention over themselves and,
// when the step carries block tables, over a prefix already in the paged KV cache: chunked
// prefill, recompute after preemption) or a decode (exactly one new token per sequence,
// attending to its paged KV cache, its own k/v included). Plain host arrays: the backend copies
// them where it needs them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tetra::model {

enum class StepKind { Prefill, Decode };

// What a backend is sized for (buffers, KV cache); fixed at ModelOps::prepare.
struct OpsLimits {
  int max_tokens = 0;          // tokens in one step (a prefill batch's total length)
  int max_seqs = 0;            // sequences in one step
  int kv_block_size = 16;      // tokens per KV cache block
  int kv_num_blocks = 0;       // blocks per layer in the KV cache
  int max_blocks_per_seq = 0;  // columns of a decode step's block table
  std::string moe_backend = "auto";  // MoE runner: "auto", "cpu", "cuda-w4a16", ...
};

struct StepBatch {
  StepKind kind = StepKind::Prefill;
  std::vector<int32_t> tokens;     // [T] token ids, sequences back to back
  std::vector<int32_t> positions;  // [T] position of each token in its sequence
  std::vector<int64_t> slots;      // [T] KV cache slot (block * block_size + offset) per token
  std::vector<int32_t> cu_seqlens; // [S + 1] sequence s owns token rows cu[s] .. cu[s+1]
  // Decode: always. Prefill: only with a cached prefix (empty: every sequence starts at 0).
  // Then sequence s's new tokens sit at positions seq_lens[s] - len_s .. seq_lens[s] - 1 and
  // attend to cache positions 0 .. their own (ModelOps::extend_attention).
  int max_blocks_per_seq = 0;
  std::vector<int32_t> block_tables;  // [S, max_blocks_per_seq] block ids, unused entries -1
  std::vector<int32_t> seq_lens;      // [S] tokens in the cache after this step's writes
  // Token rows whose logits the step computes, ascending (e.g. each sequence's last row).
  std::vector<int32_t> logit_rows;    // [R]

  int num_tokens() const { return int(tokens.size()); }
  int num_seqs() const { return cu_seqlens.empty() ? 0 : int(cu_seqlens.size()) - 1; }
  int num_logit_rows() const { return int(logit_rows.size()); }
  // A prefill whose sequences may continue a cached prefix (it carries block tables).
  bool has_cached_prefix() const { return kind == StepKind::Prefill && !block_tables.empty(); }

  // Throws tetra::Error when the arrays disagree with each other, with the kind (decode: one
  // token per sequence; a prefix prefill: positions continue the prefix) or with the limits
  // (tokens, sequences, block ids, vocab ids).
  void validate(const OpsLimits& limits, int64_t vocab_size) const;

 private:
  void validate_block_tables(const OpsLimits& limits) const;
};

}  // namespace tetra::model
