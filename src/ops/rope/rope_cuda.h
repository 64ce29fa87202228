// CUDA twin of ops/rope/rope.h: same RopeShape, in place, device pointers.
//   positions [T] int32 and inv_freq [rotary_dim/2] f32 on the device.
// cos/sin by sincosf (within 2 ulp of the CPU's double-rounded values), then one bf16 rounding.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/rope/rope.h"

namespace tetra::ops::cuda {

cudaError_t apply_rope(uint16_t* q, uint16_t* k, const int32_t* positions, int T,
                       const float* inv_freq, const RopeShape& shape, cudaStream_t stream);

}  // namespace tetra::ops::cuda
