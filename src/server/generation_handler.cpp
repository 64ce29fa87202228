// /v1/completions, /v1/chat/completions and /generate: request -> prompt ids -> scheduler ->
// tokens -> text (streamed detokenizer, stop strings) -> JSON or server-sent events.
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/logprobs_json.h"
#include "server/server.h"
#include "server/stop_strings.h"
#include "tokenizer/stream_decoder.h"

namespace tetra::server {
namespace {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

std::atomic<int64_t> g_next_id{1};

const char* finish_name(runtime::FinishReason r) {
  // A request we ended because a stop string appeared is a "stop" to the client.
  return r == runtime::FinishReason::Cancelled ? "stop" : runtime::finish_reason_name(r);
}

}  // namespace

void Server::handle_generation(Endpoint ep, const HttpRequest& req, HttpConnection& conn) {
  auto reply_error = [&](int status, const std::string& msg, const std::string& code = "") {
    metrics_.request_rejected(status);
    conn.respond(status, "application/json", error_json(status, msg, "", code));
  };
  GenerationRequest r;
  runtime::LogprobOptions logprobs;
  std::vector<int32_t> prompt;
  std::shared_ptr<RequestStream> stream;
  const bool text_out = ep != Endpoint::Generate;
  try {
    r = parse_generation_request(ep, req.body);
    if (r.model && *r.model != model_name_)
      throw ApiError(404, str("model '", *r.model, "' is not served here; this server has '", model_name_, "'"),
                     "model_not_found");
    const bool needs_text = ep == Endpoint::Chat || (ep == Endpoint::Completions && r.input_ids.empty());
    if ((needs_text || (text_out && !r.stop.empty())) && !tokenizer_)
      throw ApiError(400, "model has no tokenizer.json; use /generate with token ids");
    if (ep == Endpoint::Generate && !r.stop.empty())
      throw ApiError(400, "/generate takes stop_token_ids, not stop strings");
    if (ep == Endpoint::Chat)
      prompt = tokenizer_->encode(render_chat(chat_format_, r.messages), false);
    else if (needs_text)
      prompt = tokenizer_->encode(r.prompt, true);
    else
      prompt = r.input_ids;
    if (prompt.empty()) throw ApiError(400, "the prompt is empty");
    std::vector<int32_t> stop_ids = r.stop_token_ids;
    if (text_out && !r.ignore_eos) stop_ids.insert(stop_ids.end(), eos_ids_.begin(), eos_ids_.end());
    const int room = scheduler_->max_context() - int(prompt.size());
    const int max_new = r.max_tokens ? *r.max_tokens : std::max(room, 1);
    logprobs.top = r.logprobs;
    logprobs.prompt = r.logprobs >= 0 && r.echo && ep == Endpoint::Completions;
    stream = scheduler_->submit(prompt, r.sampling, max_new, stop_ids, logprobs);
  } catch (const ApiError& e) {
    return reply_error(e.status, e.what(), e.code);
  } catch (const Error& e) {  // tokenizer: invalid UTF-8 and the like
    return reply_error(400, e.what());
  }

  const int64_t num = g_next_id++;
  const std::string id = (ep == Endpoint::Chat ? "chatcmpl-" : ep == Endpoint::Completions ? "cmpl-" : "gen-") + std::to_string(num);
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count();
  std::optional<tok::StreamDecoder> decoder;
  if (tokenizer_) decoder.emplace(*tokenizer_, true);
  // Text endpoints add the ids to their choices when asked (return_token_ids), and always without
  // a tokenizer: a token-id prompt then gets no text, and the ids are the whole answer.
  const bool ids_out = text_out && (r.return_token_ids || !tokenizer_);
  bool prompt_ids_sent = false;  // streaming: prompt_token_ids ride on the first chunk
  StopStringMatcher stops(r.stop);
  std::vector<int32_t> output;  // every generated id, the stop token included
  std::string text;             // all text sent (non-streaming: the answer)
  if (r.echo && ep == Endpoint::Completions && tokenizer_) text = r.prompt.empty() ? tokenizer_->decode(prompt) : r.prompt;
  const bool want_logprobs = logprobs.top >= 0;
  LogprobsJson logprobs_json(ep, tokenizer_ ? &*tokenizer_ : nullptr);
  int64_t decoded_points = code_points(text);  // where the next token's text starts
  // Streaming with the prompt's logprobs: the echoed prompt waits for them (they come with the
  // first token) and goes out with them.
  bool echo_pending = r.stream && logprobs.prompt && !text.empty();
  bool prompt_logprobs_added = !logprobs.prompt;
  auto add_prompt_logprobs = [&](const std::vector<ops::PositionLogprobs>& lps) {
    if (lps.size() + 1 != prompt.size()) return;  // the request ended before its prefill
    std::optional<tok::StreamDecoder> prompt_decoder;
    if (tokenizer_) prompt_decoder.emplace(*tokenizer_, true);
    int64_t offset = 0;
    for (size_t i = 0; i < prompt.size(); ++i) {
      logprobs_json.add(prompt[i], i == 0 ? nullptr : &lps[i - 1], offset);
      if (!prompt_decoder) continue;
      try {
        offset += code_points(prompt_decoder->push(prompt[i]));
      } catch (const Error&) {
      }
    }
  };

  auto chunk = [&](const std::string& piece, const std::vector<int32_t>& ids, const char* finish,
                   json lp = nullptr) -> json {
    json c;
    c["id"] = id;
    c["created"] = created;
    c["model"] = model_name_;
    const json fin = finish ? json(finish) : json(nullptr);
    if (ep == Endpoint::Chat) {
      c["object"] = "chat.completion.chunk";
      json delta = json::object();
      if (!piece.empty()) delta["content"] = piece;
      c["choices"] = json::array({{{"index", 0}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", fin}}});
    } else if (ep == Endpoint::Completions) {
      c["object"] = "text_completion";
      c["choices"] = json::array({{{"index", 0}, {"text", piece}, {"logprobs", lp}, {"finish_reason", fin}}});
    } else {
      c["object"] = "generate.chunk";
      c["token_ids"] = ids;
      c["finish_reason"] = fin;
    }
    if (ids_out) {
      c["choices"][0]["token_ids"] = ids;
      if (!prompt_ids_sent) c["choices"][0]["prompt_token_ids"] = prompt;
      prompt_ids_sent = true;
    }
    return c;
  };
  auto usage = [&]() {
    return json{{"prompt_tokens", prompt.size()}, {"completion_tokens", output.size()},
                {"total_tokens", prompt.size() + output.size()}};
  };

  if (r.stream) {
    if (!conn.begin_stream(200, "text/event-stream")) return stream->cancel();
    if (ep == Endpoint::Chat) {
      json first = chunk("", {}, nullptr);
      first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
      if (!conn.send_chunk(sse(first))) return stream->cancel();
    }
    if (!text.empty() && !echo_pending && !conn.send_chunk(sse(chunk(text, {}, nullptr))))
      return stream->cancel();
  }

  runtime::FinishReason finish = runtime::FinishReason::None;
  std::string error;
  while (finish == runtime::FinishReason::None) {
    StreamUpdate u = stream->wait(std::chrono::milliseconds(50));
    if (conn.peer_closed()) return stream->cancel();  // client gone: free its KV blocks now
    if (!prompt_logprobs_added && !u.tokens.empty()) {  // they come with the first token
      prompt_logprobs_added = true;
      add_prompt_logprobs(u.prompt_logprobs);
    }
    if (echo_pending && (!u.tokens.empty() || u.done())) {
      echo_pending = false;
      json lp = logprobs_json.empty() ? json(nullptr) : logprobs_json.take();
      if (!conn.send_chunk(sse(chunk(text, {}, nullptr, std::move(lp))))) return stream->cancel();
    }
    std::string piece;
    std::vector<int32_t> taken;  // u.tokens up to a stop string
    for (size_t i = 0; i < u.tokens.size(); ++i) {
      const int32_t t = u.tokens[i];
      if (stops.stopped()) break;
      output.push_back(t);
      taken.push_back(t);
      if (want_logprobs && i < u.logprobs.size()) logprobs_json.add(t, &u.logprobs[i], decoded_points);
      if (!decoder) continue;
      std::string t_text;
      try {
        t_text = decoder->push(t);
      } catch (const Error&) {
        // An id the tokenizer lacks (vocabularies are padded past the tokenizer): no text.
      }
      decoded_points += code_points(t_text);
      piece += stops.push(t_text);
    }
    if (stops.stopped()) {
      stream->cancel();
      finish = runtime::FinishReason::Stop;
    } else if (u.done()) {
      finish = u.finish;
      error = u.error;
      if (decoder) piece += stops.push(decoder->finish());
      if (!stops.stopped()) piece += stops.flush();
    }
    if (!r.stream) {
      text += piece;
      continue;
    }
    if (finish == runtime::FinishReason::Error) break;
    if ((!piece.empty() || ((!text_out || ids_out || want_logprobs) && !taken.empty())) &&
        !conn.send_chunk(sse(chunk(piece, taken, nullptr, want_logprobs ? logprobs_json.take() : json(nullptr)))))
      return stream->cancel();
  }

  if (finish == runtime::FinishReason::Error) {
    metrics_.request_rejected(500);
    if (r.stream) {
      conn.send_chunk(sse(json::parse(error_json(500, error))));
      conn.end_stream();
    } else {
      conn.respond(500, "application/json", error_json(500, error));
    }
    return;
  }
  const char* fin = finish_name(finish);
  if (r.stream) {
    conn.send_chunk(sse(chunk("", {}, fin)));
    if (r.include_usage) {
      json u = chunk("", {}, nullptr);
      u["choices"] = json::array();
      u["usage"] = usage();
      conn.send_chunk(sse(u));
    }
    conn.send_chunk("data: [DONE]\n\n");
    conn.end_stream();
    return;
  }
  json body{{"id", id}, {"created", created}, {"model", model_name_}, {"usage", usage()}};
  const json lp = want_logprobs ? logprobs_json.take() : json(nullptr);
  if (ep == Endpoint::Chat) {
    body["object"] = "chat.completion";
    body["choices"] = json::array({{{"index", 0},
                                    {"message", {{"role", "assistant"}, {"content", text}}},
                                    {"logprobs", lp},
                                    {"finish_reason", fin}}});
  } else if (ep == Endpoint::Completions) {
    body["object"] = "text_completion";
    body["choices"] = json::array({{{"index", 0}, {"text", text}, {"logprobs", lp}, {"finish_reason", fin}}});
  } else {
    body["object"] = "generate";
    body["output_ids"] = output;
    body["finish_reason"] = fin;
    if (tokenizer_) body["text"] = tokenizer_->decode(output, true);
  }
  if (ids_out) {
    body["choices"][0]["token_ids"] = output;
    body["choices"][0]["prompt_token_ids"] = prompt;
  }
  conn.respond(200, "application/json", dump(body));
}

}  // namespace tetra::server
