#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "ops/sampling/logprobs.h"
#include "ops/sampling/sampling.h"

namespace tetra::server {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& msg) { throw ApiError(400, msg); }

const json* field(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

double number(const json& j, const char* name, double lo, double hi) {
  if (!j.is_number()) bad(std::string("'") + name + "' must be a number");
  const double v = j.get<double>();
  if (!(v >= lo && v <= hi)) bad(std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + j.dump());
  return v;
}

int64_t integer(const json& j, const char* name, int64_t lo, int64_t hi) {
  if (!j.is_number_integer()) bad(std::string("'") + name + "' must be an integer");
  if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad(std::string("'") + name + "' is out of range");
  const int64_t v = j.get<int64_t>();
  if (v < lo || v > hi) bad(std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(v));
  return v;
}

bool boolean(const json& j, const char* name) {
  if (!j.is_boolean()) bad(std::string("'") + name + "' must be true or false");
  return j.get<bool>();
}

std::vector<int32_t> token_ids(const json& j, const char* name) {
  if (!j.is_array()) bad(std::string("'") + name + "' must be an array of token ids");
  std::vector<int32_t> out;
  for (const json& t : j) out.push_back(int32_t(integer(t, name, 0, std::numeric_limits<int32_t>::max())));
  return out;
}

std::string message_content(const json& c, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(where + " must be a string or an array of text parts");
  std::string text;
  for (const json& part : c) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string())
      bad(where + ": only {\"type\":\"text\",\"text\":...} parts are supported");
    text += part["text"].get<std::string>();
  }
  return text;
}

// Completions: `logprobs` N (false: none). Chat: `logprobs` true/false and `top_logprobs` N,
// which needs `logprobs` true (as OpenAI's API has it).
void parse_logprobs(const json& j, Endpoint endpoint, GenerationRequest& r) {
  const json* v = field(j, "logprobs");
  const json* top = field(j, "top_logprobs");
  const int max_top = ops::kMaxTopLogprobs;
  switch (endpoint) {
    case Endpoint::Completions:
      if (top) bad("'top_logprobs' is a chat parameter; completions take 'logprobs': N");
      if (v && !(v->is_boolean() && !v->get<bool>())) {
        if (!v->is_number_integer()) bad("'logprobs' must be an integer in [0, " + std::to_string(max_top) + "]");
        r.logprobs = int(integer(*v, "logprobs", 0, max_top));
      }
      break;
    case Endpoint::Chat:
      if (v && boolean(*v, "logprobs")) r.logprobs = top ? int(integer(*top, "top_logprobs", 0, max_top)) : 0;
      else if (top) bad("'top_logprobs' needs 'logprobs': true");
      break;
    case Endpoint::Generate:
      if ((v && !(v->is_boolean() && !v->get<bool>())) || top)
        bad("logprobs are offered on /v1/completions and /v1/chat/completions, not /generate");
      break;
  }
}

}  // namespace

GenerationRequest parse_generation_request(Endpoint endpoint, std::string_view body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers like 1e999
    const std::string what = e.what();
    if (what.find("UTF-8") != std::string::npos) bad("request body is not valid UTF-8: " + what);
    bad("request body is not valid JSON: " + what);
  }
  if (!j.is_object()) bad("request body must be a JSON object");
  GenerationRequest r;
  r.endpoint = endpoint;
  if (const json* m = field(j, "model")) {
    if (!m->is_string()) bad("'model' must be a string");
    r.model = m->get<std::string>();
  }
  if (const json* n = field(j, "n")) r.n = int(integer(*n, "n", 1, kMaxChoices));
  if (const json* b = field(j, "best_of"); b && integer(*b, "best_of", 1, kMaxChoices) != r.n)
    bad("'best_of' must equal n (choosing the best of more samples is not supported)");
  if (endpoint == Endpoint::Generate && r.n != 1) bad("/generate answers one sequence: n must be 1");
  switch (endpoint) {
    case Endpoint::Completions: {
      const json* p = field(j, "prompt");
      if (!p) bad("'prompt' is required");
      auto all = [&](auto is) { return std::all_of(p->begin(), p->end(), is); };
      if (p->is_string()) {
        r.prompts.push_back(p->get<std::string>());
      } else if (!p->is_array() || p->empty()) {
        bad("'prompt' must be a string, an array of strings, an array of token ids or an array of those");
      } else if (all([](const json& e) { return e.is_string(); })) {
        for (const json& e : *p) r.prompts.push_back(e.get<std::string>());
      } else if (all([](const json& e) { return e.is_number(); })) {
        r.token_prompts.push_back(token_ids(*p, "prompt"));
      } else if (all([](const json& e) { return e.is_array() && !e.empty(); })) {
        for (const json& e : *p) r.token_prompts.push_back(token_ids(e, "prompt"));
      } else {
        bad("'prompt' must be a string, an array of strings, an array of token ids or an array of "
            "non-empty token-id arrays, not a mix");
      }
      const size_t prompts = r.prompts.size() + r.token_prompts.size();
      if (prompts * size_t(r.n) > size_t(kMaxChoices))
        bad(std::to_string(prompts) + " prompts x n = " + std::to_string(r.n) + " asks for more than " +
            std::to_string(kMaxChoices) + " choices");
      if (const json* e = field(j, "echo")) r.echo = boolean(*e, "echo");
      break;
    }
    case Endpoint::Chat: {
      const json* m = field(j, "messages");
      if (!m || !m->is_array() || m->empty()) bad("'messages' must be a non-empty array");
      for (size_t i = 0; i < m->size(); ++i) {
        const json& msg = (*m)[i];
        if (!msg.is_object()) bad("messages[" + std::to_string(i) + "] must be an object");
        const json* role = field(msg, "role");
        if (!role || !role->is_string()) bad("messages[" + std::to_string(i) + "].role must be a string");
        const std::string rs = role->get<std::string>();
        if (rs != "system" && rs != "user" && rs != "assistant" && rs != "developer")
          bad("messages[" + std::to_string(i) + "].role '" + rs + "' is not system, user or assistant");
        const json* content = field(msg, "content");
        if (!content) bad("messages[" + std::to_string(i) + "].content is required");
        r.messages.push_back({rs == "developer" ? "system" : rs, message_content(*content, i)});
      }
      break;
    }
    case Endpoint::Generate: {
      const json* ids = field(j, "input_ids");
      if (!ids) bad("'input_ids' is required");
      r.token_prompts.push_back(token_ids(*ids, "input_ids"));
      break;
    }
  }
  const char* max_name = endpoint == Endpoint::Chat && field(j, "max_completion_tokens") ? "max_completion_tokens"
                         : endpoint == Endpoint::Generate && field(j, "max_new_tokens") ? "max_new_tokens"
                                                                                         : "max_tokens";
  if (const json* mt = field(j, max_name)) r.max_tokens = int(integer(*mt, max_name, 1, std::numeric_limits<int32_t>::max()));
  ops::SamplingParams& s = r.sampling;
  if (const json* v = field(j, "temperature")) s.temperature = float(number(*v, "temperature", 0.0, 2.0));
  if (const json* v = field(j, "top_p")) {
    s.top_p = float(number(*v, "top_p", 0.0, 1.0));
    if (s.top_p <= 0) bad("'top_p' must be > 0");
  }
  if (const json* v = field(j, "top_k")) s.top_k = int(integer(*v, "top_k", -1, std::numeric_limits<int32_t>::max()));
  if (const json* v = field(j, "min_p")) s.min_p = float(number(*v, "min_p", 0.0, 1.0));
  if (const json* v = field(j, "frequency_penalty")) s.frequency_penalty = float(number(*v, "frequency_penalty", -2.0, 2.0));
  if (const json* v = field(j, "presence_penalty")) s.presence_penalty = float(number(*v, "presence_penalty", -2.0, 2.0));
  if (const json* v = field(j, "repetition_penalty")) {
    s.repetition_penalty = float(number(*v, "repetition_penalty", 0.0, 100.0));
    if (s.repetition_penalty <= 0) bad("'repetition_penalty' must be > 0");
  }
  if (const json* v = field(j, "seed")) {
    if (!v->is_number_integer()) bad("'seed' must be an integer");
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>() : uint64_t(v->get<int64_t>());
  }
  if (const json* v = field(j, "stop")) {
    if (v->is_string()) {
      r.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const json& s2 : *v) {
        if (!s2.is_string()) bad("'stop' must be a string or an array of strings");
        r.stop.push_back(s2.get<std::string>());
      }
    } else {
      bad("'stop' must be a string or an array of strings");
    }
    if (r.stop.size() > 16) bad("'stop' holds at most 16 strings");
    for (const std::string& st : r.stop)
      if (st.empty()) bad("'stop' strings must not be empty");
  }
  if (const json* v = field(j, "stop_token_ids")) r.stop_token_ids = token_ids(*v, "stop_token_ids");
  if (const json* v = field(j, "ignore_eos")) r.ignore_eos = boolean(*v, "ignore_eos");
  if (const json* v = field(j, "return_token_ids")) r.return_token_ids = boolean(*v, "return_token_ids");
  if (const json* v = field(j, "stream")) r.stream = boolean(*v, "stream");
  if (const json* v = field(j, "stream_options")) {
    if (!v->is_object()) bad("'stream_options' must be an object");
    if (const json* u = field(*v, "include_usage")) r.include_usage = boolean(*u, "stream_options.include_usage");
  }
  parse_logprobs(j, endpoint, r);
  if (const json* v = field(j, "logit_bias")) {
    if (!v->is_object()) bad("'logit_bias' must be an object of token id -> bias");
    if (v->size() > size_t(ops::kMaxLogitBias))
      bad("'logit_bias' holds at most " + std::to_string(ops::kMaxLogitBias) + " tokens");
    for (const auto& [key, bias] : v->items()) {
      const bool digits = !key.empty() && key.size() <= 10 &&
                          std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits || std::stoll(key) > std::numeric_limits<int32_t>::max())
        bad("'logit_bias' keys must be token ids, got '" + key + "'");
      r.logit_bias.emplace_back(int32_t(std::stoll(key)), float(number(bias, "logit_bias", -100.0, 100.0)));
    }
  }
  if (const json* v = field(j, "min_tokens")) r.min_tokens = int(integer(*v, "min_tokens", 0, std::numeric_limits<int32_t>::max()));
  if (r.max_tokens && r.min_tokens > *r.max_tokens) bad("'min_tokens' must not be over 'max_tokens'");
  if (const json* v = field(j, "include_stop_str_in_output"))
    r.include_stop_str_in_output = boolean(*v, "include_stop_str_in_output");
  if (const json* v = field(j, "skip_special_tokens")) r.skip_special_tokens = boolean(*v, "skip_special_tokens");
  return r;
}

}  // namespace tetra::server
