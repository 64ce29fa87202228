// CUDA twins of the MLA ops (semantics, shapes and the CPU reference: ops/attention/mla.h).
// Same arguments as the CPU functions with device pointers (T, S and the shape on the host).
// Shapes are checked on the host; slots, block ids and positions are trusted (the engine's
// tables are valid). No allocation and no synchronisation: every op can be captured in a CUDA
// graph. Launched eagerly with T > 64 (prefill), mla_absorb_q and mla_up_v run cuBLAS GEMMs (a
// handle per thread and device, created on first use); captured, they keep to their own kernels.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/attention/mla.h"

namespace tetra::ops::cuda {

// Why the CUDA MLA kernels cannot run this shape; empty when they can (the ops refuse such a
// shape with this reason; `tetra check` and the model backend list it before loading).
std::string mla_unsupported_reason(const MlaShape& s);

cudaError_t mla_cache_write(const uint16_t* kv_a, const uint16_t* norm_w, float eps,
                            const int32_t* positions, const int64_t* slots, int T,
                            const float* inv_freq, const MlaShape& s, int64_t num_slots,
                            uint16_t* cache, cudaStream_t stream);

// kv_b 16-byte aligned, q_abs 4-byte aligned.
cudaError_t mla_absorb_q(const uint16_t* q, const uint16_t* kv_b, const int32_t* positions, int T,
                         const float* inv_freq, const MlaShape& s, uint16_t* q_abs,
                         cudaStream_t stream);

// Scratch mla_attention may use for any T <= max_tokens on the current device: the partials of
// its key splits (T * H small, i.e. decode: the keys of a row are spread over several blocks and
// merged after). 0 when the shape never splits. Allocate it once, e.g. at prepare.
size_t mla_attention_workspace_bytes(const MlaShape& s, int max_tokens);

// The grid depends on T, the shape and the SM count only (key counts are read on the device), so
// a captured decode step stays valid as its sequences grow. workspace: mla_attention_workspace_
// bytes(s, max_tokens) bytes for some max_tokens >= T, 16-byte aligned; null runs without key
// splits (same results up to rounding, slower at small T * H).
cudaError_t mla_attention(const uint16_t* q_abs, const uint16_t* cache, int64_t num_slots,
                          const int32_t* cu_seqlens, int S, int T, const int32_t* positions,
                          const MlaKeys& keys, const MlaShape& s, uint16_t* out_lat,
                          void* workspace, size_t workspace_bytes, cudaStream_t stream);

// out_lat and kv_b 16-byte aligned.
cudaError_t mla_up_v(const uint16_t* out_lat, const uint16_t* kv_b, int T, const MlaShape& s,
                     uint16_t* out, cudaStream_t stream);

}  // namespace tetra::ops::cuda
