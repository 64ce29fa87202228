#include "server/logprobs_json.h"

#include <cmath>

#include "core/error.h"

namespace tetra::server {
namespace {

using nlohmann::json;

double finite_logprob(float lp) { return std::isnan(lp) || lp < -9999.0f ? -9999.0 : double(lp); }

json byte_values(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(int(c));
  return out;
}

}  // namespace

int64_t code_points(std::string_view utf8) {
  int64_t n = 0;
  for (unsigned char c : utf8) n += (c & 0xC0) != 0x80;
  return n;
}

std::string LogprobsJson::text(int32_t token) const {
  if (tok_) {
    try {
      return tok_->token_bytes(token);
    } catch (const Error&) {
      // An id past the tokenizer's vocabulary (padded embeddings): named by its id below.
    }
  }
  return "token_id:" + std::to_string(token);
}

void LogprobsJson::add(int32_t token, const ops::PositionLogprobs* lp, int64_t text_offset) {
  ++count_;
  const std::string t = text(token);
  if (chat_) {
    json entry{{"token", t}, {"logprob", lp ? finite_logprob(lp->logprob) : 0.0}, {"bytes", byte_values(t)}};
    json top = json::array();
    if (lp)
      for (const ops::TokenLogprob& alt : lp->top) {
        const std::string at = text(alt.token);
        top.push_back({{"token", at}, {"logprob", finite_logprob(alt.logprob)}, {"bytes", byte_values(at)}});
      }
    entry["top_logprobs"] = std::move(top);
    content_.push_back(std::move(entry));
    return;
  }
  tokens_.push_back(t);
  offsets_.push_back(text_offset);
  if (!lp) {
    values_.push_back(nullptr);
    tops_.push_back(nullptr);
    return;
  }
  values_.push_back(finite_logprob(lp->logprob));
  json top = json::object();
  for (const ops::TokenLogprob& alt : lp->top) top.emplace(text(alt.token), finite_logprob(alt.logprob));
  top.emplace(t, finite_logprob(lp->logprob));  // the chosen token, if not among them already
  tops_.push_back(std::move(top));
}

json LogprobsJson::take() {
  json out;
  if (chat_) {
    out = {{"content", std::move(content_)}};
    content_ = json::array();
  } else {
    out = {{"tokens", std::move(tokens_)}, {"token_logprobs", std::move(values_)},
           {"top_logprobs", std::move(tops_)}, {"text_offset", std::move(offsets_)}};
    tokens_ = values_ = tops_ = offsets_ = json::array();
  }
  count_ = 0;
  return out;
}

}  // namespace tetra::server
