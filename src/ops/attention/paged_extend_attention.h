// CUDA extend attention (chunked prefill); semantics, shapes and the CPU twin:
// ops/attention/paged_extend_attention_cpu.h.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/attention/paged_extend_attention_cpu.h"

namespace tetra::ops::cuda {

// The CUDA twin: same arguments, device pointers (q, cu_seqlens, kv.*, out); num_tokens = T
// (host). One warp per (token, query head), keys 32 at a time with an online softmax, float
// math (no tensor cores yet). head_dim 64, 128 or 256. Shapes are checked on the host; block
// ids and lengths are trusted (the engine's tables are valid). No allocation, no sync: it can
// be captured in a CUDA graph.
cudaError_t paged_extend_attention(const uint16_t* q, const int32_t* cu_seqlens, int num_seqs,
                                   int num_tokens, const PagedKv& kv, const AttentionShape& s,
                                   uint16_t* out, cudaStream_t stream);

}  // namespace tetra::ops::cuda
