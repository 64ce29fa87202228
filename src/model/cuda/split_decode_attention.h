// Paged GQA decode attention split finely along the sequence (flash-decoding), for the CUDA
// model backend. Same contract as ops::cuda::paged_decode_attention (ops/attention/
// attention_cuda.h) and checked against ops::paged_decode_attention_cpu.
//
// Why a second kernel: at batch 1 the ops/attention kernel runs n_kv_heads x ceil(max/512)
// blocks, each warp walking its tokens one dependent load after another; measured on the H200
// for GLM-4.5-Air at context 1024 it took ~300 us per layer (65% of the decode step). Here a
// block takes 64-token chunks: it stages the chunk's K and V rows in shared memory with every
// load in flight at once, scores (head, token) pairs one per thread, and keeps a running
// softmax over its chunks; splits = ceil(max_tokens / 64) capped at kMaxSplits, so a 1024-token
// sequence spreads over 16+ blocks per kv head. The last block of a (sequence, kv head) to finish
// merges its splits (an arrival counter in the workspace), so the op is one launch.
// The launch shape depends only on the limits (max_blocks_per_seq * block_size), not on the
// device-side seq_lens, so it can be captured in a CUDA graph.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/attention/attention.h"

namespace tetra::model::cuda {

inline constexpr int kSplitChunkTokens = 64;
inline constexpr int kMaxSplits = 64;

// Why this shape cannot run here ("" when it can): head_dim 64 or 128, group <= 16, 16-byte rows.
std::string split_decode_unsupported_reason(const ops::AttentionShape& s);

// Scratch for num_seqs sequences under kv's limits. Zero it once before the first call (it holds
// arrival counters; every call leaves them at zero again).
size_t split_decode_workspace_bytes(int num_seqs, const ops::AttentionShape& s,
                                    const ops::PagedKv& kv);

// q [num_seqs, n_heads, head_dim] (token stride s.q_step()) -> out [num_seqs, n_heads, head_dim].
// tensor_cores: Q.K^T and P.V by mma.sync (P rounded to bf16, as FlashAttention does); false:
// float FMAs from shared memory (exact float P; slower when many sequences decode at once).
cudaError_t split_decode_attention(const uint16_t* q, const ops::PagedKv& kv, int num_seqs,
                                   const ops::AttentionShape& s, void* workspace,
                                   size_t workspace_bytes, uint16_t* out, cudaStream_t stream,
                                   bool tensor_cores = true);

}  // namespace tetra::model::cuda
