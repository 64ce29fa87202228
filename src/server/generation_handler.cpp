// /v1/completions, /v1/chat/completions and /generate: request -> prompt ids -> scheduler ->
// tokens -> text (streamed detokenizer, stop strings) -> JSON or server-sent events. Each choice
// (prompts x n) is one engine request; the handler waits on one bell for all of them, and a
// streamed chunk carries one choice with its index.
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

// One choice: its engine request and what has been made of its tokens so far.
struct Choice {
  Choice(int index, const std::vector<int32_t>& prompt, const GenerationRequest& r, const tok::Tokenizer* tok)
      : index(index), prompt(prompt), min_tokens(r.min_tokens), stops(r.stop, r.include_stop_str_in_output),
        logprobs(r.endpoint, tok) {
    if (tok) decoder.emplace(*tok, r.skip_special_tokens);
  }
  int index;
  const std::vector<int32_t>& prompt;
  int min_tokens;  // stop strings count from this many tokens on
  std::shared_ptr<RequestStream> stream;
  std::optional<tok::StreamDecoder> decoder;
  StopStringMatcher stops;
  LogprobsJson logprobs;
  int64_t decoded_points = 0;          // where the next token's text starts, in code points
  bool prompt_logprobs_added = true;   // false until the prompt's logprobs are in (when asked)
  bool echo_pending = false;           // streaming: the echoed prompt goes out with its logprobs
  bool prompt_ids_sent = false;        // streaming: prompt_token_ids ride on the first chunk
  std::vector<int32_t> output;         // every generated id, the stop token included
  std::string text;                    // all text sent (non-streaming: the answer)
  runtime::FinishReason finish = runtime::FinishReason::None;
  std::string error;
};

// The prompt's entries (the first token without logprobs), offsets into its decoded text.
void add_prompt_logprobs(Choice& c, const std::vector<ops::PositionLogprobs>& lps, const tok::Tokenizer* tok) {
  if (lps.size() + 1 != c.prompt.size()) return;  // the request ended before its prefill
  std::optional<tok::StreamDecoder> decoder;
  if (tok) decoder.emplace(*tok, true);
  int64_t offset = 0;
  for (size_t i = 0; i < c.prompt.size(); ++i) {
    c.logprobs.add(c.prompt[i], i == 0 ? nullptr : &lps[i - 1], offset);
    if (!decoder) continue;
    try {
      offset += code_points(decoder->push(c.prompt[i]));
    } catch (const Error&) {
    }
  }
}

// Takes an update's tokens up to a stop string into c; returns the text now safe to send and,
// in *taken, the ids it came from.
std::string take_update(Choice& c, const StreamUpdate& u, bool want_logprobs, std::vector<int32_t>* taken) {
  std::string piece;
  for (size_t i = 0; i < u.tokens.size() && !c.stops.stopped(); ++i) {
    const int32_t t = u.tokens[i];
    c.output.push_back(t);
    taken->push_back(t);
    if (want_logprobs && i < u.logprobs.size()) c.logprobs.add(t, &u.logprobs[i], c.decoded_points);
    if (!c.decoder) continue;
    std::string t_text;
    try {
      t_text = c.decoder->push(t);
    } catch (const Error&) {
      // An id the tokenizer lacks (vocabularies are padded past the tokenizer): no text.
    }
    c.decoded_points += code_points(t_text);
    piece += int(c.output.size()) < c.min_tokens ? t_text : c.stops.push(t_text);
  }
  if (c.stops.stopped()) {
    c.stream->cancel();
    c.finish = runtime::FinishReason::Stop;
  } else if (u.done()) {
    c.finish = u.finish;
    c.error = u.error;
    if (c.decoder) piece += c.stops.push(c.decoder->finish());
    if (!c.stops.stopped()) piece += c.stops.flush();
  }
  return piece;
}

}  // namespace

void Server::handle_generation(Endpoint ep, const HttpRequest& req, HttpConnection& conn) {
  auto reply_error = [&](int status, const std::string& msg, const std::string& code = "") {
    metrics_.request_rejected(status);
    conn.respond(status, "application/json", error_json(status, msg, "", code));
  };
  const tok::Tokenizer* tok = tokenizer_ ? &*tokenizer_ : nullptr;
  GenerationRequest r;
  runtime::RequestExtras extras;
  const runtime::LogprobOptions& logprobs = extras.logprobs;
  std::vector<std::vector<int32_t>> prompts;  // [prompts] ids
  std::vector<std::string> echo_texts;        // [prompts] completions with echo: the prompt's text
  std::vector<Choice> choices;                // [prompts x n]
  const auto bell = std::make_shared<StreamBell>();
  auto cancel_all = [&] {
    for (Choice& c : choices)
      if (c.stream) c.stream->cancel();
  };
  const bool text_out = ep != Endpoint::Generate;
  try {
    r = parse_generation_request(ep, req.body);
    if (r.model && *r.model != model_name_)
      throw ApiError(404, str("model '", *r.model, "' is not served here; this server has '", model_name_, "'"),
                     "model_not_found");
    const bool needs_text = ep == Endpoint::Chat || (ep == Endpoint::Completions && r.token_prompts.empty());
    if ((needs_text || (text_out && !r.stop.empty())) && !tok)
      throw ApiError(400, "model has no tokenizer.json; use /generate with token ids");
    if (ep == Endpoint::Generate && !r.stop.empty())
      throw ApiError(400, "/generate takes stop_token_ids, not stop strings");
    if (ep == Endpoint::Chat) {
      prompts.push_back(tok->encode(render_chat(chat_format_, r.messages), false));
    } else if (needs_text) {
      for (const std::string& p : r.prompts) prompts.push_back(tok->encode(p, true));
    } else {
      prompts = r.token_prompts;
    }
    for (size_t j = 0; j < prompts.size(); ++j)
      if (prompts[j].empty())
        throw ApiError(400, prompts.size() == 1 ? "the prompt is empty" : str("prompt ", j, " is empty"));
    if (r.echo && ep == Endpoint::Completions && tok)
      for (size_t j = 0; j < prompts.size(); ++j)
        echo_texts.push_back(needs_text ? r.prompts[j] : tok->decode(prompts[j]));
    std::vector<int32_t> stop_ids = r.stop_token_ids;
    if (text_out && !r.ignore_eos) stop_ids.insert(stop_ids.end(), eos_ids_.begin(), eos_ids_.end());
    extras.logprobs.top = r.logprobs;
    extras.logprobs.prompt = r.logprobs >= 0 && r.echo && ep == Endpoint::Completions;
    extras.logit_bias = r.logit_bias;
    extras.min_tokens = r.min_tokens;
    choices.reserve(prompts.size() * size_t(r.n));
    for (size_t j = 0; j < prompts.size(); ++j) {
      const int room = scheduler_->max_context() - int(prompts[j].size());
      const int max_new = r.max_tokens ? *r.max_tokens : std::max(room, 1);
      for (int i = 0; i < r.n; ++i) {
        Choice& c = choices.emplace_back(int(choices.size()), prompts[j], r, tok);
        if (!echo_texts.empty()) c.text = echo_texts[j];
        c.decoded_points = code_points(c.text);
        c.echo_pending = r.stream && logprobs.prompt && !c.text.empty();
        c.prompt_logprobs_added = !logprobs.prompt;
        // The samples of one prompt differ: a seeded request's choice i draws with seed + i.
        ops::SamplingParams sampling = r.sampling;
        if (sampling.seed != 0) sampling.seed += uint64_t(i);
        c.stream = scheduler_->submit(prompts[j], sampling, max_new, stop_ids, extras, bell);
      }
    }
  } catch (const ApiError& e) {
    cancel_all();
    return reply_error(e.status, e.what(), e.code);
  } catch (const Error& e) {  // tokenizer: invalid UTF-8 and the like
    cancel_all();
    return reply_error(400, e.what());
  }

  const int64_t num = g_next_id++;
  const std::string id = (ep == Endpoint::Chat ? "chatcmpl-" : ep == Endpoint::Completions ? "cmpl-" : "gen-") + std::to_string(num);
  const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count();
  // Text endpoints add the ids to their choices when asked (return_token_ids), and always without
  // a tokenizer: a token-id prompt then gets no text, and the ids are the whole answer.
  const bool ids_out = text_out && (r.return_token_ids || !tok);
  const bool want_logprobs = logprobs.top >= 0;

  auto chunk = [&](Choice& ch, const std::string& piece, const std::vector<int32_t>& ids, const char* finish,
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
      c["choices"] = json::array({{{"index", ch.index}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", fin}}});
    } else if (ep == Endpoint::Completions) {
      c["object"] = "text_completion";
      c["choices"] = json::array({{{"index", ch.index}, {"text", piece}, {"logprobs", lp}, {"finish_reason", fin}}});
    } else {
      c["object"] = "generate.chunk";
      c["token_ids"] = ids;
      c["finish_reason"] = fin;
    }
    if (ids_out) {
      c["choices"][0]["token_ids"] = ids;
      if (!ch.prompt_ids_sent) c["choices"][0]["prompt_token_ids"] = ch.prompt;
      ch.prompt_ids_sent = true;
    }
    return c;
  };
  auto usage = [&]() {
    size_t prompt_tokens = 0, completion_tokens = 0;
    for (const std::vector<int32_t>& p : prompts) prompt_tokens += p.size();
    for (const Choice& c : choices) completion_tokens += c.output.size();
    return json{{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}};
  };

  if (r.stream) {
    if (!conn.begin_stream(200, "text/event-stream")) return cancel_all();
    for (Choice& c : choices) {
      if (ep == Endpoint::Chat) {
        json first = chunk(c, "", {}, nullptr);
        first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
        if (!conn.send_chunk(sse(first))) return cancel_all();
      }
      if (!c.text.empty() && !c.echo_pending && !conn.send_chunk(sse(chunk(c, c.text, {}, nullptr))))
        return cancel_all();
    }
  }

  size_t unfinished = choices.size();
  const Choice* failed = nullptr;
  uint64_t rings = 0;
  while (unfinished > 0 && !failed) {
    rings = bell->wait(rings, std::chrono::milliseconds(50));
    if (conn.peer_closed()) return cancel_all();  // client gone: free the KV blocks now
    for (Choice& c : choices) {
      if (c.finish != runtime::FinishReason::None) continue;
      const StreamUpdate u = c.stream->poll();
      if (u.tokens.empty() && !u.done()) continue;
      if (!c.prompt_logprobs_added && !u.tokens.empty()) {  // they come with the first token
        c.prompt_logprobs_added = true;
        add_prompt_logprobs(c, u.prompt_logprobs, tok);
      }
      if (c.echo_pending) {
        c.echo_pending = false;
        json lp = c.logprobs.empty() ? json(nullptr) : c.logprobs.take();
        if (!conn.send_chunk(sse(chunk(c, c.text, {}, nullptr, std::move(lp))))) return cancel_all();
      }
      std::vector<int32_t> taken;
      const std::string piece = take_update(c, u, want_logprobs, &taken);
      if (c.finish != runtime::FinishReason::None) --unfinished;
      if (c.finish == runtime::FinishReason::Error) {
        failed = &c;
        break;
      }
      if (!r.stream) {
        c.text += piece;
        continue;
      }
      if ((!piece.empty() || ((!text_out || ids_out || want_logprobs) && !taken.empty())) &&
          !conn.send_chunk(sse(chunk(c, piece, taken, nullptr, want_logprobs ? c.logprobs.take() : json(nullptr)))))
        return cancel_all();
      if (c.finish != runtime::FinishReason::None && !conn.send_chunk(sse(chunk(c, "", {}, finish_name(c.finish)))))
        return cancel_all();
    }
  }

  if (failed) {
    cancel_all();
    metrics_.request_rejected(500);
    if (r.stream) {
      conn.send_chunk(sse(json::parse(error_json(500, failed->error))));
      conn.end_stream();
    } else {
      conn.respond(500, "application/json", error_json(500, failed->error));
    }
    return;
  }
  if (r.stream) {
    if (r.include_usage) {
      json u = chunk(choices[0], "", {}, nullptr);
      u["choices"] = json::array();
      u["usage"] = usage();
      conn.send_chunk(sse(u));
    }
    conn.send_chunk("data: [DONE]\n\n");
    conn.end_stream();
    return;
  }
  json body{{"id", id}, {"created", created}, {"model", model_name_}, {"usage", usage()}};
  if (ep == Endpoint::Generate) {
    const Choice& c = choices[0];
    body["object"] = "generate";
    body["output_ids"] = c.output;
    body["finish_reason"] = finish_name(c.finish);
    if (tok) body["text"] = tok->decode(c.output, r.skip_special_tokens);
    conn.respond(200, "application/json", dump(body));
    return;
  }
  body["object"] = ep == Endpoint::Chat ? "chat.completion" : "text_completion";
  body["choices"] = json::array();
  for (Choice& c : choices) {
    json choice{{"index", c.index}, {"logprobs", want_logprobs ? c.logprobs.take() : json(nullptr)},
                {"finish_reason", finish_name(c.finish)}};
    if (ep == Endpoint::Chat) choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else choice["text"] = c.text;
    if (ids_out) {
      choice["token_ids"] = c.output;
      choice["prompt_token_ids"] = c.prompt;
    }
    body["choices"].push_back(std::move(choice));
  }
  conn.respond(200, "application/json", dump(body));
}

}  // namespace tetra::server
