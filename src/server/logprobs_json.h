// The `logprobs` objects of OpenAI responses, built token by token from the engine's
// ops::PositionLogprobs. Completions: {"tokens", "token_logprobs", "top_logprobs" (text -> logprob,
// the chosen token included, so up to N + 1 entries), "text_offset"}; chat: {"content": [{"token",
// "logprob", "bytes", "top_logprobs": [N entries]}]}. A token's text is its raw bytes (invalid
// UTF-8 becomes U+FFFD when the JSON is written), or "token_id:N" without a tokenizer (vLLM's
// spelling). -inf logprobs are written as -9999.0, as OpenAI and vLLM do (JSON has no infinity).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>

#include "ops/sampling/logprobs.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace tetra::server {

class LogprobsJson {
 public:
  // tokenizer may be null.
  LogprobsJson(Endpoint endpoint, const tok::Tokenizer* tokenizer)
      : chat_(endpoint == Endpoint::Chat), tok_(tokenizer) {}
  // One token: lp null where there is none (a completion's first prompt token); text_offset:
  // where its text starts in the choice's text, in code points (completions only).
  void add(int32_t token, const ops::PositionLogprobs* lp, int64_t text_offset);
  bool empty() const { return count_ == 0; }
  // What was added since the last take(), as the choice's "logprobs" value; starts over.
  nlohmann::json take();

 private:
  std::string text(int32_t token) const;
  bool chat_;
  const tok::Tokenizer* tok_;
  int count_ = 0;
  nlohmann::json content_ = nlohmann::json::array();                          // chat
  nlohmann::json tokens_ = nlohmann::json::array(), values_ = nlohmann::json::array(),  // completions
      tops_ = nlohmann::json::array(), offsets_ = nlohmann::json::array();
};

// Code points in UTF-8 text (bytes that do not continue a sequence): OpenAI's text offsets.
int64_t code_points(std::string_view utf8);

}  // namespace tetra::server
