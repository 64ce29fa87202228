// The prefill side of mla_absorb_q and mla_up_v (mla.cu): the per-head products as cuBLAS
// strided-batched GEMMs on tensor cores (batch = heads, bf16 in and out, f32 accumulation), for
// T above the decode kernels' 64 tokens. Each call binds this thread's handle for the current
// device (created on first use, with its own workspace) to `stream`. Not for stream capture:
// the first call allocates. Throws tetra::Error on a cuBLAS failure.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/attention/mla.h"

namespace tetra::ops::cuda {

// q_abs[t, h, :Dl] = q[t, h, :nope] . W_uk[h] for all t, h (the rotary part is not written).
// q [T, H, nope + Dr], kv_b [H * (nope + v), Dl], q_abs [T, H, Dl + Dr], bf16.
void mla_absorb_gemm(const uint16_t* q, const uint16_t* kv_b, int T, const MlaShape& s,
                     uint16_t* q_abs, cudaStream_t stream);

// out[t, h, :] = W_uv[h] . out_lat[t, h, :]. out_lat [T, H, Dl], out [T, H, v], bf16.
void mla_up_v_gemm(const uint16_t* out_lat, const uint16_t* kv_b, int T, const MlaShape& s,
                   uint16_t* out, cudaStream_t stream);

}  // namespace tetra::ops::cuda
