// RoPE and the KV-cache write in one launch (decode and prefill): the op pair rope(q, k) then
// write_kv(k, v) ran as two kernels per layer, each a few microseconds of launch-bound work at
// batch 1. Results are bit-identical to ops::cuda::apply_rope followed by
// ops::cuda::write_kv_cache (same sincosf angles, same rounding steps, same slot rule).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/rope/rope.h"

namespace tetra::ops::cuda {

// q, k rotated in place per `shape` (k must not be null); then, for each token t whose slot is in
// [0, num_slots), k's rotated row and v's row ([n_k_heads * head_dim] bf16 each; v rows
// v_stride elements apart) are copied to k_cache / v_cache [num_slots, n_k_heads * head_dim].
// positions [T] int32, slots [T] int64, inv_freq [rotary_dim / 2] f32, all on the device.
// Launched as a programmatic dependent: q, k, v may come from the kernel just before; positions,
// slots and inv_freq may not (they are read, and the first angles computed, before the wait).
cudaError_t rope_and_write_kv(uint16_t* q, uint16_t* k, const uint16_t* v, int64_t v_stride,
                              const int32_t* positions, const int64_t* slots, int T,
                              const float* inv_freq, const RopeShape& shape, int64_t num_slots,
                              uint16_t* k_cache, uint16_t* v_cache, cudaStream_t stream);

}  // namespace tetra::ops::cuda
