// CUDA twin of ops/sampling/logprobs.h: the same log-softmax and the same top tokens (ids equal,
// logprobs within the rounding of a double sum taken in another order), for many positions of a
// step's logits at once, so that a logprobs request copies ~170 bytes per position to the host
// instead of the position's [vocab] f32 logits.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/sampling/logprobs.h"

namespace tetra::ops::cuda {

// One position's answer, as the kernel writes it (device or mapped host memory).
struct PositionLogprobsOut {
  float logprob;                    // of the query's token
  int32_t top_count;                // min(top, vocab)
  int32_t top_ids[kMaxTopLogprobs];  // best first, lowest id among equals
  float top_logprobs[kMaxTopLogprobs];
};

// logits [rows, vocab] f32 on the device; queries [n] (device or mapped host memory; checked by
// the caller with check_logprob_query) -> out [n]. One block per query.
cudaError_t position_logprobs(const float* logits, int64_t vocab, const LogprobQuery* queries,
                              int n, PositionLogprobsOut* out, cudaStream_t stream);

// The host form of one answer.
PositionLogprobs to_position_logprobs(const PositionLogprobsOut& o);

}  // namespace tetra::ops::cuda
