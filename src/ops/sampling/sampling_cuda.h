// CUDA twin of ops/sampling/sampling.h: the same steps and the same per-element math
// (sampling_math.h), so it returns the same token ids as sample_cpu for the same inputs, greedy
// and seeded alike. One block per row; top-k and top-p cuts by radix select on the order keys
// (four 8-bit passes, exact: counts and integer top-p weights), no sort.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/sampling/sampling.h"

namespace tetra::ops::cuda {

// Scratch: the processed logits and the history counts of every row, [rows, vocab] f32 + i32.
size_t sampling_workspace_bytes(int rows, int vocab);

// logits [rows, vocab] f32, params [rows] (device copies; validate them on the host with
// check_sampling_params), history as in sample_cpu but device pointers (tokens outside the
// vocab are ignored here, refused by the CPU twin) -> tokens [rows] int32.
cudaError_t sample(const float* logits, int rows, int vocab, const SamplingParams* params,
                   const TokenHistory& history, void* workspace, size_t workspace_bytes,
                   int32_t* tokens, cudaStream_t stream);

}  // namespace tetra::ops::cuda
