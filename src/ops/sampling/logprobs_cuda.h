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

// The workspace of n queries: per-query counters (zero them once when allocating: every launch
// leaves them zero), then each query's parts' partial results.
size_t logprobs_workspace_bytes(int n, int64_t vocab);

// logits [rows, vocab] f32 on the device; queries [n] (device or mapped host memory; checked by
// the caller with check_logprob_query) -> out [n] (device or mapped host memory). Each query's
// row is split over up to 256 blocks (about 512 in all); its last block writes the answer.
// sampled (device or mapped host memory, or null): each query's token is sampled[q.token] (q.token
// an index into it), e.g. the tokens a sampling kernel wrote earlier in the stream, so that a
// step's draws and their logprobs need one round trip; a token outside [0, vocab) read there
// gets logprob -inf (the top list is filled regardless).
cudaError_t position_logprobs(const float* logits, int64_t vocab, const LogprobQuery* queries,
                              int n, void* workspace, size_t workspace_bytes,
                              PositionLogprobsOut* out, cudaStream_t stream,
                              const int32_t* sampled = nullptr);

// The host form of one answer.
PositionLogprobs to_position_logprobs(const PositionLogprobsOut& o);

}  // namespace tetra::ops::cuda
