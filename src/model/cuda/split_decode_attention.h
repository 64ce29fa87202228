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
// the whole read latency chain (lengths -> tables -> K/V) behind it.
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

// q [num_seqs, n_heads, head_dim] (token stride s.q_step()) -> out [num_seqs, n_heads, head_dim].
// No scratch: the splits merge on chip. splits: 0 picks split_decode_auto_splits, else
// 1..kMaxSplits blocks per (sequence, kv head). Results are the same bits for either
// `predecessor`; only what may overlap the predecessor differs.
cudaError_t split_decode_attention(const uint16_t* q, const ops::PagedKv& kv, int num_seqs,
                                   const ops::AttentionShape& s, uint16_t* out,
                                   cudaStream_t stream, int splits = 0,
                                   PredecessorWrites predecessor = PredecessorWrites::Anything);

}  // namespace tetra::model::cuda
