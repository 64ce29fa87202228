// /tokenize and /detokenize (vLLM's): the served tokenizer over HTTP, so that a client counts or
// builds token-id prompts exactly as this server will read them.
//   POST /tokenize   {"prompt": TEXT, "add_special_tokens": true} or {"messages": [...]} (rendered
//                    with the built-in chat format, as /v1/chat/completions does)
//                    -> {"tokens": [ids], "count": N, "max_model_len": L}
//   POST /detokenize {"tokens": [ids]} -> {"prompt": TEXT}
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/chat_format.h"
#include "server/server.h"

namespace tetra::server {

void Server::handle_tokenize(const HttpRequest& req, HttpConnection& conn, bool detokenize) {
  using nlohmann::json;
  auto reply_error = [&](int status, const std::string& msg) {
    metrics_.request_rejected(status);
    conn.respond(status, "application/json", error_json(status, msg));
  };
  if (!tokenizer_) return reply_error(400, "model has no tokenizer.json");
  json j = json::parse(req.body, nullptr, false);
  if (!j.is_object()) return reply_error(400, "request body must be a JSON object");
  try {
    if (detokenize) {
      const auto it = j.find("tokens");
      if (it == j.end() || !it->is_array()) return reply_error(400, "'tokens' must be an array of token ids");
      std::vector<int32_t> ids;
      for (const json& t : *it) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tokenizer_->vocab_size())
          return reply_error(400, str("'tokens' holds ", t.dump(), ", not a token id of this tokenizer (0 .. ",
                                      tokenizer_->vocab_size() - 1, ")"));
        ids.push_back(int32_t(t.get<int64_t>()));
      }
      const json out{{"prompt", tokenizer_->decode(ids)}};
      conn.respond(200, "application/json", out.dump(-1, ' ', false, json::error_handler_t::replace));
      return;
    }
    std::vector<int32_t> ids;
    if (j.contains("messages")) {
      const GenerationRequest r = parse_generation_request(Endpoint::Chat, req.body);
      ids = tokenizer_->encode(render_chat(chat_format_, r.messages), false);
    } else {
      const auto p = j.find("prompt");
      if (p == j.end() || !p->is_string()) return reply_error(400, "'prompt' (a string) or 'messages' is required");
      bool add_special = true;
      if (const auto a = j.find("add_special_tokens"); a != j.end()) {
        if (!a->is_boolean()) return reply_error(400, "'add_special_tokens' must be true or false");
        add_special = a->get<bool>();
      }
      ids = tokenizer_->encode(p->get<std::string>(), add_special);
    }
    conn.respond(200, "application/json",
                 json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", scheduler_->max_context()}}.dump());
  } catch (const ApiError& e) {
    reply_error(e.status, e.what());
  } catch (const Error& e) {  // text that is not UTF-8, an id the tokenizer cannot decode
    reply_error(400, e.what());
  }
}

}  // namespace tetra::server
