// Token sampling, CPU reference. One row of logits per sequence, each row with its own params.
// Per row, in this order (vLLM's order):
//   0. logit bias (LogitBias): x = logit + bias, or -inf where the bias is -inf (a ban);
//   1. penalties (sampling_math::penalised): repetition over prompt and output tokens,
//      frequency and presence over output tokens;
//   2. temperature <= 0: greedy, the highest penalised logit (lowest id on ties); stop here;
//   3. x = logit / temperature;
//   4. min-p: drop tokens with p < min_p * p_max;
//   5. top-k: keep tokens whose x is >= the k-th largest kept x (ties at the cut stay);
//   6. top-p: keep the smallest set of the highest x whose softmax mass reaches top_p (ties at
//      the cut stay; mass in exact integer units, sampling_math::top_p_weight);
//   7. draw: argmax over kept tokens of x + Gumbel(seed, step, token), the exact softmax draw
//      over the kept set. The noise is counter-based (Philox4x32-10 on (token, step) keyed by
//      the seed), so the CPU and the CUDA kernel draw the same token for the same inputs, and a
//      request's draws do not depend on which row it occupies or what else is in the batch.
// NaN and -inf logits are never drawn; a row with nothing drawable gives token -1.
// The CUDA twin is ops/sampling/sampling_cuda.h.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace tetra::ops {

struct SamplingParams {
  float temperature = 1.0f;         // <= 0: greedy
  int top_k = 0;                    // <= 0 or >= vocab: off
  float top_p = 1.0f;               // (0, 1]; 1: off
  float min_p = 0.0f;               // [0, 1]; 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  uint64_t seed = 0;  // the request's seed (the engine picks one for unseeded requests)
  uint64_t step = 0;  // tokens this request has generated so far: a fresh draw each step
};

// The most (token, bias) pairs one request may add to its logits (OpenAI's logit_bias).
constexpr int kMaxLogitBias = 1024;

// Token history for penalties: row r's prompt tokens are prompt_tokens[prompt_offsets[r] ..
// prompt_offsets[r+1]) (ids in [0, vocab)); likewise its output (generated) tokens. Null
// pointers mean empty histories. All int32.
struct TokenHistory {
  const int32_t* prompt_tokens = nullptr;   // [prompt_offsets[rows]]
  const int32_t* prompt_offsets = nullptr;  // [rows + 1]
  const int32_t* output_tokens = nullptr;   // [output_offsets[rows]]
  const int32_t* output_offsets = nullptr;  // [rows + 1]
};

// Additive logit biases, applied to the raw logits before everything else (step 0): row r's are
// tokens[offsets[r] .. offsets[r+1]) with their values alike; the ids of a row are distinct and
// in [0, vocab); a value of -inf bans its token (min_tokens bans the stop tokens so). Null
// pointers mean no biases. The engine builds them from logit_bias and min_tokens.
struct LogitBias {
  const int32_t* tokens = nullptr;   // [offsets[rows]]
  const float* values = nullptr;     // [offsets[rows]]
  const int32_t* offsets = nullptr;  // [rows + 1]
};
TETRA_HD bool has_logit_bias(const LogitBias& b, int row) {
  return b.tokens != nullptr && b.values != nullptr && b.offsets != nullptr &&
         b.offsets[row + 1] > b.offsets[row];
}

// Whether a row's logits are penalised by its history (then the history is read).
TETRA_HD bool has_penalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

// Refuses out-of-range params with a tetra::Error naming the row and field.
void check_sampling_params(const SamplingParams& p, int row);
// Every row's params, then its history ids (prompt, then output) within [0, vocab), then its
// bias ids (within [0, vocab), distinct; values not NaN or +inf): a tetra::Error naming the
// first bad row. Both samplers check their inputs with it.
void check_sampling_inputs(const SamplingParams* params, int rows, int vocab,
                           const TokenHistory& history, const LogitBias& bias = {});

// logits [rows, vocab] f32, params [rows] -> tokens [rows] int32.
void sample_cpu(const float* logits, int rows, int vocab, const SamplingParams* params,
                const TokenHistory& history, int32_t* tokens, const LogitBias& bias = {});

}  // namespace tetra::ops
