// CUDA twins of the DSA indexer ops (semantics, shapes and the CPU reference:
// ops/attention/dsa.h). Same arguments as the CPU functions with device pointers (T, S, the
// shape and the bounds on the host). Shapes are checked on the host; slots, block ids and
// positions are trusted (the engine's tables are valid). No allocation and no synchronisation;
// grids depend on T, the shape and the device only (key counts are read on the device), so
// both ops can be captured in a CUDA graph that stays valid as the sequences grow.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/attention/dsa.h"

namespace tetra::ops::cuda {

// Why the CUDA DSA kernels cannot run this shape; empty when they can (the ops refuse such a
// shape with this reason).
std::string dsa_unsupported_reason(const DsaShape& s);

// key_cache[slots[t]] = rope(LayerNorm(wk_out[t])) for slots[t] >= 0, as dsa_index_keys_cpu:
// the same rounding steps (mean and variance in double, the normed key rounded to bf16 before
// the turn); sines and cosines from sincosf, so a turned element may differ by one bf16 ulp.
cudaError_t dsa_index_keys(const uint16_t* wk_out, const uint16_t* ln_w, const uint16_t* ln_b,
                           float eps, const int32_t* positions, const int64_t* slots, int T,
                           const float* inv_freq, const DsaShape& s, int64_t num_slots,
                           uint16_t* key_cache, cudaStream_t stream);

// The score workspace's budget: dsa_select_workspace_bytes gives at most this much (and never
// less than one token's row), so that long contexts times long prefill chunks do not claim
// gigabytes; dsa_select then takes the tokens in passes.
inline constexpr size_t kDsaScoreWorkspaceBudget = size_t(256) << 20;

// Bytes of workspace dsa_select is given for up to max_tokens tokens of up to max_keys keys
// each: a float score row [max_keys] per token, for as many of the max_tokens as fit in
// kDsaScoreWorkspaceBudget, at least one.
size_t dsa_select_workspace_bytes(int max_tokens, int max_keys);

// As dsa_select_cpu for the T = cu_seqlens[S] tokens. max_keys: a host-side bound on every
// positions[t] + 1, the row stride of the score workspace; a token with more keys has only its
// first max_keys scored (memory-safe, but not the reference's answer). The workspace must hold
// at least one row (max_keys floats); the tokens are scored and selected in passes of as many
// as it has rows for. Scores are float sums in another order
// than the CPU's, so where two keys' scores lie within float rounding of each other at the
// top-k boundary the selections may differ; exact ties go to the lower position, as on the CPU.
// key_cache must be 16-byte aligned.
cudaError_t dsa_select(const uint16_t* q, const uint16_t* weights, const uint16_t* key_cache,
                       int64_t num_slots, const int32_t* cu_seqlens, int S,
                       const int32_t* positions, const MlaKeys& keys, const float* inv_freq,
                       const DsaShape& s, int32_t* selected, int T, int max_keys, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream);

}  // namespace tetra::ops::cuda
