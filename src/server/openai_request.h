// Parsing and validating the JSON bodies of /v1/completions, /v1/chat/completions and
// /generate into one GenerationRequest. Every problem is an ApiError (400) that names the field.
// A completion may carry a batch of prompts and any request n choices per prompt; choice
// prompt * n + i answers prompt `prompt`'s i-th sample (OpenAI's order).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ops/sampling/sampling.h"
#include "server/api_error.h"

namespace tetra::server {

enum class Endpoint { Completions, Chat, Generate };

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant"
  std::string content;
};

struct GenerationRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::optional<std::string> model;
  std::vector<std::string> prompts;    // Completions: text prompts (several: a batch)
  std::vector<ChatMessage> messages;   // Chat
  // Generate's input_ids, or Completions' token-id prompts (several: a batch)
  std::vector<std::vector<int32_t>> token_prompts;
  int n = 1;                           // choices per prompt (sampled independently)
  std::optional<int> max_tokens;       // absent: the rest of the context
  ops::SamplingParams sampling;        // temperature, top_p, top_k, min_p, penalties, seed
  std::vector<std::string> stop;       // stop strings (text endpoints)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage
  bool echo = false;                   // completions: prepend the prompt to the text
  bool return_token_ids = false;       // text endpoints: choices also carry the ids (vLLM's extension)
  // Alternatives per token in the choice's logprobs (-1: no logprobs): completions' `logprobs`
  // N; chat's `top_logprobs` (0 when absent) once `logprobs` is true. With echo, completions also
  // get the prompt's.
  int logprobs = -1;
  std::vector<std::pair<int32_t, float>> logit_bias;  // OpenAI's {"token id": bias in [-100, 100]}
  int min_tokens = 0;                      // vLLM's: no stop token (or stop string) before this many
  bool include_stop_str_in_output = false; // vLLM's: the matched stop string stays in the text
  bool skip_special_tokens = true;         // vLLM's: special tokens left out of the text
};

// Choices one request may ask for: prompts x n.
constexpr int kMaxChoices = 128;

// Throws ApiError(400) on malformed JSON, wrong types, out-of-range values, more than
// kMaxChoices choices, or best_of other than n.
// Logprobs are limited to ops::kMaxTopLogprobs alternatives and are not offered on /generate.
GenerationRequest parse_generation_request(Endpoint endpoint, std::string_view body);

}  // namespace tetra::server
