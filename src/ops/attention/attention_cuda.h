// CUDA twins of ops/attention/attention.h. Same shapes and meaning; device pointers; one stream;
// shapes are checked on the host (tetra::Error) before any launch; each returns the launch's
// cudaError_t. Nothing allocates or synchronises, so all of it can be captured in a CUDA graph.
// Supported: head_dim 64 or 128; prefill any GQA ratio; decode n_heads / n_kv_heads <= 16.
// q/k/v rows and strides must allow 16-byte loads (pointers 16-byte aligned, strides multiples
// of 8 elements).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/attention/attention.h"

namespace tetra::ops::cuda {

// What the model runtime's attention kernels are built for: head_dim of prefill and both decode
// kernels, and query heads per kv head in decode (the decode MMA's M side).
inline constexpr bool attention_head_dim_supported(int head_dim) {
  return head_dim == 64 || head_dim == 128;
}
inline constexpr int kDecodeMaxGroup = 16;

// Causal varlen prefill, flash-attention style on tensor cores (mma.sync m16n8k16 bf16, fp32
// accumulation, online softmax; P is rounded to bf16 for the P.V product as FlashAttention does).
//   q [T, n_heads, head_dim], k/v [T, n_kv_heads, head_dim] (strides per shape),
//   cu_seqlens [num_seqs + 1] int32 on the device, max_seqlen >= every sequence's length (host),
//   out [T, n_heads, head_dim] packed.
cudaError_t prefill_attention(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                              const int32_t* cu_seqlens, int num_seqs, int max_seqlen,
                              const AttentionShape& s, uint16_t* out, cudaStream_t stream);

// Tokens per split of the decode kernel: sequences longer than this are cut into several splits
// that run in parallel and are merged by a second kernel.
inline constexpr int kDecodeSplitTokens = 512;

// Scratch for paged_decode_attention (0 when no sequence can exceed one split).
size_t paged_decode_workspace_bytes(int num_seqs, const AttentionShape& s, const PagedKv& kv);

// Paged decode, one query token per sequence, GQA-aware (a block serves all query heads of one
// kv head, reading each k/v row once) and split along the sequence; the number of splits comes
// from kv.max_blocks_per_seq * kv.block_size, so the launch shape does not depend on the
// device-side seq_lens (capturable). q [num_seqs, n_heads, head_dim] (q stride per shape),
// out [num_seqs, n_heads, head_dim]. workspace: paged_decode_workspace_bytes.
// Block ids are trusted here (the CPU twin checks them): the host's block tables must be valid.
cudaError_t paged_decode_attention(const uint16_t* q, const PagedKv& kv, int num_seqs,
                                   const AttentionShape& s, void* workspace,
                                   size_t workspace_bytes, uint16_t* out, cudaStream_t stream);

// k/v [T, n_kv_heads, head_dim] (kv stride per shape) -> caches at slots [T] int64; negative
// slots and slots past num_blocks * block_size are skipped (the device cannot throw).
cudaError_t write_kv_cache(const uint16_t* k, const uint16_t* v, const int64_t* slots, int T,
                           const AttentionShape& s, int num_blocks, int block_size,
                           uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream);

// Copy-on-write block copies as copy_kv_blocks_cpu; pairs [n, 2] int32 on the device. Pairs
// with an id outside [0, num_blocks) are skipped. v_cache may be null (MLA's one cache).
cudaError_t copy_kv_blocks(uint16_t* k_cache, uint16_t* v_cache, const int32_t* pairs, int n,
                           int num_blocks, int64_t block_elems, cudaStream_t stream);

}  // namespace tetra::ops::cuda
