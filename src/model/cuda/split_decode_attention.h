// Paged GQA decode attention split along the sequence (flash-decoding), for the CUDA model
// backend. Same contract as ops::cuda::paged_decode_attention (ops/attention/attention_cuda.h)
// and checked against ops::paged_decode_attention_cpu.
//
// Shape: one thread-block cluster of `splits` blocks per (sequence, kv head). Block r of the
// cluster takes the r-th of `splits` equal, 16-token aligned ranges of the sequence and walks it
// in 64-token chunks: every K and V row of a chunk is copied to shared memory by cp.async at once
// (three chunks in flight, the block-table rows of a fourth read ahead), Q.K^T and P.V run on
// tensor cores (mma.sync, the group's <= 16 query heads as the M side, P rounded to bf16 as
// FlashAttention does), and each warp keeps its own
// running softmax over its 16 tokens of every chunk, so a chunk needs no exchange between warps.
// At the end the warps' partials are merged in shared memory and the cluster's blocks merge
// theirs through distributed shared memory: no workspace and no second launch.
// Why: at batch 1 (GLM-4.5-Air, 1025 tokens) the 8 kv heads alone give 8 blocks; 8 splits give
// 64 blocks with ~64 KB each in flight, so the KV read is one HBM round trip (the count grows with
// the context: split_decode_auto_splits). At batch 64 the 512 (sequence, kv head) pairs already
// fill the GPU and one split each needs no merge.
// The launch shape depends on num_seqs, the head counts and the split count the caller passes
// (from host-side lengths), never on the device-side seq_lens, so it can be captured in a CUDA
// graph; a graph replays correctly at any length, only less fast past its count's range.
// Launched as a programmatic dependent (PDL) of the kernel before it. With
// PredecessorWrites::QAndNewKvRow the kernel reads seq_lens and the block tables and starts the
// copies of its first three chunks before waiting for that kernel, leaving out only the row of
// position seq_lens[s] - 1, which it copies (and q, which it reads) after the wait. Why: in a
// decode step the RoPE + KV write right before writes just that row and q, and waiting first put
// the whole read latency chain (lengths -> tables -> K/V) behind it. With DecodeRope the kernel
// does that RoPE + KV write itself (the model's decode step since session 17: one launch less
// per layer, GLM-4.5-Air batch 1 -0.7..-1.8% per step), its predecessor being the projection.
// With a step plan (split_decode_plan.h, written once per step by the host) a block takes its
// range and its first chunks' cache rows from the plan in one round trip instead of reading
// the length and then the block table (since session 23: Air batch 1 -0.9%, Qwen3-30B-A3B -2.9%).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/attention/attention.h"

namespace tetra::model::cuda {

inline constexpr int kMaxSplits = 16;  // the largest (non-portable) cluster on Hopper

// Why this shape cannot run here ("" when it can): head_dim 64 or 128, group <= 16, 16-byte rows.
std::string split_decode_unsupported_reason(const ops::AttentionShape& s);

// Splits per (sequence, kv head) that the op picks for num_seqs sequences on the current GPU:
// doubled while the blocks stay within one per multiprocessor and, given max_len (the longest
// sequence, 0: unknown), while 8 * splits^2 <= max_len (see the .cu for the measurements).
int split_decode_auto_splits(int num_seqs, const ops::AttentionShape& s, int max_len = 0);

// What the kernel launched right before the attention on `stream` (its PDL predecessor) may
// still be writing while the attention starts.
enum class PredecessorWrites {
  Anything,  // wait for it before the first read of anything
  // Only q and, of the cache, each sequence s's row at position seq_lens[s] - 1 (the slot
  // block_tables[s][(len - 1) / block_size] * block_size + (len - 1) % block_size). Everything
  // else the attention reads (seq_lens, block tables, the other cache rows) must be complete
  // before the predecessor starts. A caller that passes this where the predecessor writes other
  // rows, the tables or the lengths gets a data race.
  QAndNewKvRow,
};

// RoPE of the step inside the attention (instead of a RoPE + KV-write launch before it): q is
// read un-rotated and turned in registers, and the block that holds position seq_lens[s] - 1 of
// kv head h turns that head's new k row, writes the k and v rows to the cache slot slots[s] (as
// rope_and_write_kv does; nothing where the slot is outside 0..num_slots-1, as for graph padding)
// and uses them for that position. Same rounding steps as the RoPE kernels (ops/rope/
// rope_turn.cuh): the output and the cache are the same bits as rope_and_write_kv followed by
// the attention. The predecessor (the q/k/v projection) may still be writing q, k_new and v_new.
struct DecodeRope {
  const uint16_t* k_new = nullptr;  // [num_seqs, k_stride] un-rotated k of each sequence's token
  const uint16_t* v_new = nullptr;  // [num_seqs, v_stride]
  int64_t k_stride = 0, v_stride = 0;
  const int32_t* positions = nullptr;  // [num_seqs]
  const int64_t* slots = nullptr;      // [num_seqs] cache slot of the token (< 0: none)
  int64_t num_slots = 0;               // cache rows (blocks * block_size)
  uint16_t* k_cache = nullptr;         // kv's caches, writable: the new rows go there
  uint16_t* v_cache = nullptr;
  const float* inv_freq = nullptr;     // [rotary_dim / 2]
  int rotary_dim = 0;
  bool neox = true;                    // NeoX pairs (i, i + rotary_dim/2), else GPT-J (2i, 2i + 1)
};
// Why the attention cannot turn q and the new row itself for this shape ("" when it can): the
// q fragments hold both dims of a pair only for NeoX with rotary_dim % 32 == 0 or GPT-J with
// rotary_dim % 16 == 0.
std::string split_decode_rope_unsupported_reason(const ops::AttentionShape& s, int rotary_dim,
                                                 bool neox);

// q [num_seqs, n_heads, head_dim] (token stride s.q_step()) -> out [num_seqs, n_heads, head_dim].
// No scratch: the splits merge on chip. splits: 0 picks split_decode_auto_splits, else
// 1..kMaxSplits blocks per (sequence, kv head). Results are the same bits for either
// `predecessor`; only what may overlap the predecessor differs. rope: see DecodeRope (implies
// what QAndNewKvRow allows, without the new row: the attention writes it). plan: a device copy
// of build_split_decode_plan (split_decode_plan.h) for kv's lengths and tables at this `splits`
// (nonzero), complete before the predecessor starts, or nullptr; the same bits either way.
cudaError_t split_decode_attention(const uint16_t* q, const ops::PagedKv& kv, int num_seqs,
                                   const ops::AttentionShape& s, uint16_t* out,
                                   cudaStream_t stream, int splits = 0,
                                   PredecessorWrites predecessor = PredecessorWrites::Anything,
                                   const DecodeRope* rope = nullptr,
                                   const int32_t* plan = nullptr);

}  // namespace tetra::model::cuda
