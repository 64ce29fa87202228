// CUDA twin of ops/sampling/sampling.h: the same steps and the same per-element math
// (sampling_math.h), so it returns the same token ids as sample_cpu for the same inputs, greedy
// and seeded alike. Plain greedy rows: a many-block argmax; the others one block per row, with top-k
// and top-p cuts by radix select on the order keys (four 8-bit passes, exact: counts and integer
// top-p weights), no sort.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/sampling/sampling.h"

namespace tetra::ops::cuda {

// Rows per launch: their params travel by value as kernel parameters (4 KB), and the scratch of
// a launch is bounded whatever the batch.
constexpr int kMaxRowsPerLaunch = 64;

// The workspace: the argmax kernel's per-row keys and counters (zero them once when allocating:
// every launch leaves them zero), then, for `rows` that are not plain greedy, their processed
// logits and history counts, [min(rows, kMaxRowsPerLaunch), vocab] f32 + i32.
size_t sampling_workspace_bytes(int rows, int vocab);
// False when every row is greedy without penalties or biases: sampling_workspace_bytes(0, vocab)
// is enough. bias: offsets on the host, as for sample.
bool sampling_needs_scratch(const SamplingParams* params, int rows, const LogitBias& bias = {});

// logits [rows, vocab] f32 on the device; params [rows] on the host (validate them with
// check_sampling_inputs); history as in sample_cpu but device pointers, read only for rows with
// penalties (tokens outside the vocab are ignored here, refused by the CPU twin); bias as in
// sample_cpu with its tokens and values in device memory and its offsets [rows + 1] on the host
// (they travel with the params) -> tokens [rows] int32, device or mapped host memory. Greedy
// rows without penalties or biases run an argmax kernel (many blocks per row when rows are few),
// the others one block per row.
cudaError_t sample(const float* logits, int rows, int vocab, const SamplingParams* params,
                   const TokenHistory& history, const LogitBias& bias, void* workspace,
                   size_t workspace_bytes, int32_t* tokens, cudaStream_t stream);

}  // namespace tetra::ops::cuda
