// Log-probabilities of tokens under one row of logits, for the OpenAI `logprobs` fields.
// They are the model's own distribution: log-softmax of the raw logits, before penalties,
// temperature or top-k/top-p/min-p filtering (vLLM's default, "raw_logprobs"). NaN logits count
// as -inf; a row with nothing finite gives -inf everywhere.
#pragma once
#include <cstdint>
#include <vector>

namespace tetra::ops {

// The most alternatives a request may ask for (OpenAI's top_logprobs limit; vLLM's default).
constexpr int kMaxTopLogprobs = 20;

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// One position: the logprob of the token that was there (sampled, or the next prompt token)
// and the most likely tokens, highest first (lowest id first among equals).
struct PositionLogprobs {
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // [min(top, vocab)]
};

// logits [vocab] f32; token in [0, vocab); top in [0, kMaxTopLogprobs].
PositionLogprobs position_logprobs(const float* logits, int64_t vocab, int32_t token, int top);

// One position asked of a step's logits: the logprob of `token` under logit row `row`, and the
// `top` most likely tokens. The CUDA twin (logprobs_cuda.h) answers many at once.
struct LogprobQuery {
  int32_t row = 0;
  int32_t token = 0;
  int32_t top = 0;
};
// Refuses a query outside [0, rows) x [0, vocab) x [0, kMaxTopLogprobs] with a tetra::Error.
void check_logprob_query(const LogprobQuery& q, int rows, int64_t vocab);

}  // namespace tetra::ops
