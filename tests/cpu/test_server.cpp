// The HTTP server end to end on loopback (ephemeral ports, real sockets, the CPU backend and a
// tiny random-weight model): every endpoint, streaming, several clients at once, cancellation,
// error paths, metrics, profiling, and the KV cache back to empty after all of it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "runtime/engine.h"
#include "server/server.h"
#include "server_fixture.h"
#include "tokenizer/tokenizer.h"

namespace tetra {
namespace {

using nlohmann::json;
using test::get;
using test::parse_json;
using test::post;

constexpr int kContext = 128;

server::ServerOptions options(const std::filesystem::path& dir, int max_running, int max_queued) {
  server::ServerOptions o;
  o.model_dir = dir;
  o.served_model_name = "tiny";
  o.engine.backend = "cpu";
  o.engine.max_batch = max_running;
  o.engine.max_context = kContext;
  o.max_queued = max_queued;
  o.max_body_bytes = 64 * 1024;
  return o;
}

class Server : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    srv_ = new server::Server(options(test::tiny_model_with_tokenizer(), 4, 64));
    port_ = srv_->start("127.0.0.1", 0);
    tok_ = new tok::Tokenizer(tok::Tokenizer::from_file(test::tiny_model_with_tokenizer() / "tokenizer.json"));
  }
  static void TearDownTestSuite() {
    delete srv_;
    delete tok_;
  }
  // Waits (up to 10 s) until no request runs or waits and no KV block is held.
  static std::map<std::string, double> settled_metrics(int port) {
    std::map<std::string, double> m;
    for (int i = 0; i < 200; ++i) {
      m = test::parse_metrics(get(port, "/metrics").body);
      if (m["tetra_requests_running"] == 0 && m["tetra_requests_waiting"] == 0 && m["tetra_kv_cache_blocks_used"] == 0)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return m;
  }
  static server::Server* srv_;
  static int port_;
  static tok::Tokenizer* tok_;
};
server::Server* Server::srv_ = nullptr;
int Server::port_ = 0;
tok::Tokenizer* Server::tok_ = nullptr;

void expect_error(const server::HttpResponse& r, int status, const std::string& message_part) {
  EXPECT_EQ(r.status, status) << r.body;
  const json j = parse_json(r.body);
  ASSERT_TRUE(j.is_object()) << r.body;
  ASSERT_TRUE(j.contains("error")) << r.body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"]["type"].is_string());
  EXPECT_TRUE(j["error"].contains("code"));
  EXPECT_NE(j["error"]["message"].get<std::string>().find(message_part), std::string::npos) << r.body;
}

// Greedy ids from the library engine alone: the reference the server must match.
std::vector<int32_t> engine_greedy(const std::vector<int32_t>& prompt, int n) {
  runtime::EngineOptions o;
  o.backend = "cpu";
  o.max_batch = 1;
  o.max_context = kContext;
  auto e = runtime::Engine::load(test::server_model_plain(), o);
  ops::SamplingParams p;
  p.temperature = 0;
  const int64_t id = e->add_request(prompt, p, n);
  e->run_to_completion();
  return e->request(id).output;
}

TEST_F(Server, HealthAndModels) {
  const auto h = get(port_, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(parse_json(h.body)["status"], "ok");
  const auto m = get(port_, "/v1/models");
  ASSERT_EQ(m.status, 200);
  const json j = parse_json(m.body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["max_model_len"], kContext);
}

TEST_F(Server, GenerateMatchesTheEngineGreedy) {
  const std::vector<int32_t> prompt = {5, 9, 200, 31, 7};
  const auto r = post(port_, "/generate", {{"input_ids", prompt}, {"max_new_tokens", 6}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = parse_json(r.body);
  EXPECT_EQ(j["output_ids"].get<std::vector<int32_t>>(), engine_greedy(prompt, 6));
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
}

TEST_F(Server, CompletionTextIsTheDecodedGreedyTokens) {
  const std::string prompt = "Hello world, this is a test";
  const auto r = post(port_, "/v1/completions",
                      {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = parse_json(r.body);
  const std::vector<int32_t> ids = tok_->encode(prompt, true);
  const std::vector<int32_t> out = engine_greedy(ids, 8);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], tok_->decode(out, true));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_EQ(j["usage"]["total_tokens"], ids.size() + 8);
}

// return_token_ids (vLLM's extension): the choices carry the generated ids, which decode to the
// text, and the prompt's ids; streamed, the chunks' ids add up to the same ids.
TEST_F(Server, ReturnTokenIdsGivesTheIdsBehindTheText) {
  const std::string prompt = "ids please";
  const json req = {{"prompt", prompt}, {"max_tokens", 7}, {"temperature", 0}, {"ignore_eos", true},
                    {"return_token_ids", true}};
  const auto r = post(port_, "/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = parse_json(r.body)["choices"][0];
  const std::vector<int32_t> ids = tok_->encode(prompt, true);
  const std::vector<int32_t> out = engine_greedy(ids, 7);
  EXPECT_EQ(c["token_ids"].get<std::vector<int32_t>>(), out);
  EXPECT_EQ(c["prompt_token_ids"].get<std::vector<int32_t>>(), ids);
  EXPECT_EQ(c["text"], tok_->decode(out, true));
  json sreq = req;
  sreq["stream"] = true;
  const auto events = test::sse_events(post(port_, "/v1/completions", sreq).body);
  std::vector<int32_t> streamed;
  int with_prompt_ids = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = parse_json(events[i])["choices"][0];
    for (int32_t t : e["token_ids"].get<std::vector<int32_t>>()) streamed.push_back(t);
    with_prompt_ids += e.contains("prompt_token_ids");
  }
  EXPECT_EQ(streamed, out);
  EXPECT_EQ(with_prompt_ids, 1);
  // Not asked: no ids in the choices.
  json plain = req;
  plain.erase("return_token_ids");
  EXPECT_FALSE(parse_json(post(port_, "/v1/completions", plain).body)["choices"][0].contains("token_ids"));
  expect_error(post(port_, "/v1/completions", {{"prompt", "x"}, {"return_token_ids", 1}}), 400,
               "return_token_ids");
}

TEST_F(Server, StreamedCompletionEqualsTheWholeOne) {
  const json req = {{"prompt", "stream me"}, {"max_tokens", 10}, {"temperature", 0.8}, {"seed", 11}, {"ignore_eos", true}};
  const auto whole = post(port_, "/v1/completions", req);
  ASSERT_EQ(whole.status, 200) << whole.body;
  json sreq = req;
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  const auto streamed = post(port_, "/v1/completions", sreq);
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(streamed.headers.at("content-type"), "text/event-stream");
  const auto events = test::sse_events(streamed.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text, finish;
  int usage_tokens = -1;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = parse_json(events[i]);
    ASSERT_TRUE(c.is_object()) << events[i];
    if (c.contains("usage")) {
      usage_tokens = c["usage"]["completion_tokens"];
      continue;
    }
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, parse_json(whole.body)["choices"][0]["text"]);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage_tokens, 10);
}

TEST_F(Server, ChatStreamsRoleThenContent) {
  const json req = {{"messages", {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}}},
                    {"max_tokens", 5}, {"temperature", 0}, {"stream", true}, {"ignore_eos", true}};
  const auto r = post(port_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const auto events = test::sse_events(r.body);
  ASSERT_GE(events.size(), 3u);
  const json first = parse_json(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    const json c = parse_json(events[i]);
    if (c["choices"][0]["delta"].contains("content")) text += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  // The same chat, whole: the prompt is the GLM format, encoded without extra specials.
  json whole_req = req;
  whole_req.erase("stream");
  const json whole = parse_json(post(port_, "/v1/chat/completions", whole_req).body);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], text);
  const std::vector<int32_t> ids =
      tok_->encode("[gMASK]<sop><|system|>\nbe brief<|user|>\nhi<|assistant|>\n", false);
  EXPECT_EQ(whole["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(whole["choices"][0]["message"]["content"], tok_->decode(engine_greedy(ids, 5), true));
}

TEST_F(Server, StopStringCutsTheText) {
  const json req = {{"prompt", "abc def"}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
  const std::string full = parse_json(post(port_, "/v1/completions", req).body)["choices"][0]["text"];
  // A stop string from the middle of the greedy text: what comes back is the text before it.
  ASSERT_GE(full.size(), 8u) << full;
  size_t cut = full.size() / 2;
  while (cut < full.size() && (static_cast<unsigned char>(full[cut]) & 0xC0) == 0x80) ++cut;
  const std::string stop = full.substr(cut, std::min<size_t>(3, full.size() - cut));
  ASSERT_FALSE(stop.empty());
  json sreq = req;
  sreq["stop"] = stop;
  for (bool stream : {false, true}) {
    sreq["stream"] = stream;
    const auto r = post(port_, "/v1/completions", sreq);
    ASSERT_EQ(r.status, 200) << r.body;
    std::string text, finish;
    if (!stream) {
      const json j = parse_json(r.body);
      text = j["choices"][0]["text"];
      finish = j["choices"][0]["finish_reason"];
    } else {
      for (const auto& e : test::sse_events(r.body)) {
        if (e == "[DONE]") continue;
        const json c = parse_json(e);
        text += c["choices"][0]["text"].get<std::string>();
        if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
      }
    }
    EXPECT_EQ(text, full.substr(0, full.find(stop))) << "stream=" << stream;
    EXPECT_EQ(finish, "stop");
  }
}

TEST_F(Server, ConcurrentClientsGetTheirOwnAnswers) {
  // Each alone first, then all at once (joining one running batch): the same tokens.
  constexpr int kClients = 6;
  std::vector<json> reqs;
  std::vector<std::vector<int32_t>> alone(kClients), together(kClients);
  for (int c = 0; c < kClients; ++c) {
    reqs.push_back({{"input_ids", {c + 1, 40 + c, 300 - c}}, {"max_new_tokens", 5 + c}, {"temperature", 0}});
    alone[size_t(c)] = parse_json(post(port_, "/generate", reqs[size_t(c)]).body)["output_ids"].get<std::vector<int32_t>>();
  }
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c)
    threads.emplace_back([&, c] {
      const auto r = post(port_, "/generate", reqs[size_t(c)]);
      if (r.status == 200) together[size_t(c)] = parse_json(r.body)["output_ids"].get<std::vector<int32_t>>();
    });
  for (auto& t : threads) t.join();
  for (int c = 0; c < kClients; ++c) {
    EXPECT_EQ(alone[size_t(c)].size(), size_t(5 + c));
    EXPECT_EQ(together[size_t(c)], alone[size_t(c)]) << "client " << c;
  }
}

TEST_F(Server, MetricsCountTokensAndLatencies) {
  const auto before = settled_metrics(port_);
  const auto r = post(port_, "/generate", {{"input_ids", {1, 2, 3}}, {"max_new_tokens", 7}});
  ASSERT_EQ(r.status, 200);
  const auto after = settled_metrics(port_);
  EXPECT_EQ(after.at("tetra_generation_tokens_total") - before.at("tetra_generation_tokens_total"), 7);
  EXPECT_EQ(after.at("tetra_prompt_tokens_total") - before.at("tetra_prompt_tokens_total"), 3);
  EXPECT_EQ(after.at("tetra_time_to_first_token_seconds_count") - before.at("tetra_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(after.at("tetra_inter_token_latency_seconds_count") - before.at("tetra_inter_token_latency_seconds_count"), 6);
  EXPECT_GT(after.at("tetra_kv_cache_blocks_total"), 0);
  EXPECT_EQ(after.at("tetra_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), after.at("tetra_time_to_first_token_seconds_count"));
}

TEST_F(Server, RepeatedPromptHitsThePrefixCache) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(300 + i);
  const json req = {{"input_ids", prompt}, {"max_new_tokens", 5}, {"temperature", 0}};
  const auto first = post(port_, "/generate", req);
  ASSERT_EQ(first.status, 200) << first.body;
  const auto before = settled_metrics(port_);
  const auto again = post(port_, "/generate", req);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(parse_json(again.body)["output_ids"], parse_json(first.body)["output_ids"]);
  EXPECT_EQ(parse_json(again.body)["output_ids"].get<std::vector<int32_t>>(), engine_greedy(prompt, 5));
  const auto after = settled_metrics(port_);
  // Blocks of 16: the first 32 of the 40 prompt tokens (the last one is always computed).
  EXPECT_EQ(after.at("tetra_prefix_cache_hit_tokens_total") - before.at("tetra_prefix_cache_hit_tokens_total"), 32);
}

TEST_F(Server, ProfileTraceHoldsStepsAndRequests) {
  expect_error(post(port_, "/stop_profile", json::object()), 400, "no profile is running");
  ASSERT_EQ(post(port_, "/start_profile", json::object()).status, 200);
  expect_error(post(port_, "/start_profile", json::object()), 400, "already running");
  ASSERT_EQ(post(port_, "/generate", {{"input_ids", {4, 5}}, {"max_new_tokens", 4}}).status, 200);
  const auto r = post(port_, "/stop_profile", json::object());
  ASSERT_EQ(r.status, 200);
  const json trace = parse_json(r.body);
  ASSERT_TRUE(trace.contains("traceEvents")) << r.body.substr(0, 500);
  int steps = 0, prefills = 0, decodes = 0, begins = 0, ends = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") {
      EXPECT_GE(e["dur"].get<double>(), 0);
      steps += e["name"] == "engine.step";
      prefills += e["name"] == "prefill";
      decodes += e["name"] == "decode";
    }
    begins += e["ph"] == "b";
    ends += e["ph"] == "e";
  }
  EXPECT_GE(steps, 4);  // one prefill step and three decode steps at least
  EXPECT_GE(prefills, 1);
  EXPECT_GE(decodes, 3);
  EXPECT_EQ(begins, 1);
  EXPECT_EQ(ends, 1);
  // The cpu backend runs no GPU kernels: the trace says so instead of showing an empty track.
  ASSERT_TRUE(trace.contains("otherData"));
  EXPECT_EQ(trace["otherData"]["gpu_kernel_events"], 0);
  EXPECT_NE(trace["otherData"]["gpu_kernels"].get<std::string>().find("none recorded"), std::string::npos);
  // The same trace was written to a file.
  ASSERT_TRUE(trace["otherData"].contains("trace_file")) << trace["otherData"].dump();
  const std::filesystem::path file = trace["otherData"]["trace_file"].get<std::string>();
  std::ifstream in(file);
  ASSERT_TRUE(in) << file;
  const json from_file = json::parse(in, nullptr, false);
  EXPECT_FALSE(from_file.is_discarded()) << file << " is not valid JSON";
  EXPECT_EQ(from_file, trace);
  in.close();
  std::filesystem::remove(file);
  expect_error(post(port_, "/stop_profile", json::object()), 400, "no profile");
}

TEST_F(Server, ErrorsAreOpenAiShaped) {
  const int p = port_;
  expect_error(server::http_call("127.0.0.1", p, "POST", "/v1/completions", "{bad json"), 400, "not valid JSON");
  expect_error(post(p, "/v1/completions", {{"prompt", "x"}, {"temperature", "hot"}}), 400, "temperature");
  expect_error(post(p, "/v1/completions", {{"prompt", "x"}, {"model", "gpt-9"}}), 404, "gpt-9");
  expect_error(post(p, "/v1/completions", {{"prompt", "x"}, {"n", 3}, {"best_of", 4}}), 400, "best_of");
  expect_error(post(p, "/v1/completions", {{"prompt", "x"}, {"max_tokens", kContext * 2}}), 400, "context limit");
  expect_error(post(p, "/generate", {{"input_ids", std::vector<int32_t>(kContext + 5, 3)}}), 400, "context limit");
  expect_error(post(p, "/generate", {{"input_ids", {1, 100000}}}), 400, "vocabulary");
  expect_error(post(p, "/generate", {{"input_ids", json::array()}}), 400, "empty");
  expect_error(server::http_call("127.0.0.1", p, "POST", "/v1/completions", "{\"prompt\":\"\xc3\x28\"}"), 400, "UTF-8");
  expect_error(server::http_call("127.0.0.1", p, "POST", "/v1/completions", std::string(70 * 1024, ' ')), 413, "exceeds");
  expect_error(get(p, "/nope"), 404, "/nope");
  expect_error(get(p, "/v1/completions"), 405, "POST");
  expect_error(post(p, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", 5}}}}}), 400, "content");
}

TEST_F(Server, ClientDisconnectCancelsAndFreesKv) {
  // A long stream dropped after two events: the request ends as cancelled, its blocks free.
  const auto before = settled_metrics(port_);
  int events = 0;
  server::SseReader reader;
  const auto r = server::http_call("127.0.0.1", port_, "POST", "/v1/completions",
                                   json({{"prompt", "go on"}, {"max_tokens", 120}, {"stream", true}, {"ignore_eos", true}}).dump(),
                                   [&](std::string_view bytes) {
                                     reader.feed(bytes, [&](const std::string&) { ++events; });
                                     return events < 2;
                                   });
  EXPECT_EQ(r.status, 200);
  const auto after = settled_metrics(port_);
  EXPECT_EQ(after.at("tetra_kv_cache_blocks_used"), 0);
  EXPECT_EQ(after.at("tetra_requests_running"), 0);
  const std::string key = "tetra_requests_finished_total{finish_reason=\"cancelled\"}";
  EXPECT_EQ(after.at(key) - (before.count(key) ? before.at(key) : 0.0), 1);
  // Fewer than the 120 asked for were made.
  EXPECT_LT(after.at("tetra_generation_tokens_total") - before.at("tetra_generation_tokens_total"), 120);
}

TEST_F(Server, ManyFailingAndCancelledRequestsLeaveNoKvBlocks) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int c = 0; c < 12; ++c)
    threads.emplace_back([&, c] {
      if (c % 3 == 0) {  // bad request
        post(port_, "/generate", {{"input_ids", {1, 2}}, {"max_new_tokens", kContext}});
      } else if (c % 3 == 1) {  // dropped stream
        server::http_call("127.0.0.1", port_, "POST", "/generate",
                          json({{"input_ids", {c, 3}}, {"max_new_tokens", 60}, {"stream", true}}).dump(),
                          [](std::string_view) { return false; });
      } else {  // stop string hit early, then the server cancels the rest
        const auto r = post(port_, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 60}, {"stop", "<w"}, {"ignore_eos", true}});
        ok += r.status == 200;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 4);
  const auto m = settled_metrics(port_);
  EXPECT_EQ(m.at("tetra_kv_cache_blocks_used"), 0);
  EXPECT_EQ(m.at("tetra_requests_running"), 0);
  EXPECT_EQ(m.at("tetra_requests_waiting"), 0);
}

TEST(ServerNoTokenizer, TextEndpointsSayUseGenerate) {
  server::Server s(options(test::server_model_plain(), 2, 8));
  const int port = s.start("127.0.0.1", 0);
  EXPECT_FALSE(s.has_tokenizer());
  expect_error(post(port, "/v1/completions", {{"prompt", "hi"}}), 400, "no tokenizer.json; use /generate");
  expect_error(post(port, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}}), 400,
               "no tokenizer.json");
  // Token-id prompts still work on /v1/completions and /generate; without text to carry them,
  // the completion's choice holds the generated ids (the same as /generate's, greedy), streamed
  // too.
  const json gen = {{"input_ids", {1, 2}}, {"max_new_tokens", 3}, {"temperature", 0}};
  const auto g = post(port, "/generate", gen);
  ASSERT_EQ(g.status, 200) << g.body;
  const auto want = parse_json(g.body)["output_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(want.size(), 3u);
  const json req = {{"prompt", {1, 2}}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}};
  const auto c = post(port, "/v1/completions", req);
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(parse_json(c.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want);
  json sreq = req;
  sreq["stream"] = true;
  const auto events = test::sse_events(post(port, "/v1/completions", sreq).body);
  std::vector<int32_t> streamed;
  for (size_t i = 0; i + 1 < events.size(); ++i)
    for (int32_t t : parse_json(events[i])["choices"][0]["token_ids"].get<std::vector<int32_t>>())
      streamed.push_back(t);
  EXPECT_EQ(streamed, want);
}

TEST(ServerLimits, SmallKvPoolPreemptsChunksAndCompletes) {
  // 14 blocks of 4 tokens: each request (12 + 24 tokens = 9 blocks) fits alone, four at once do
  // not; prompts are prefilled 5 tokens per step.
  server::ServerOptions o = options(test::server_model_plain(), 4, 16);
  o.engine.max_context = 64;
  o.engine.kv_block_size = 4;
  o.engine.kv_num_blocks = 14;
  o.engine.max_prefill_tokens = 5;
  server::Server s(o);
  const int port = s.start("127.0.0.1", 0);
  auto body = [](int i) {
    json b = {{"input_ids", test::test_prompt(12, 512, 60 + uint32_t(i))}, {"max_new_tokens", 24}};
    if (i % 2) b["seed"] = 100 + i, b["temperature"] = 0.9;
    else b["temperature"] = 0;
    return b;
  };
  std::vector<std::vector<int32_t>> alone(4), together(4);
  for (int i = 0; i < 4; ++i) {
    const auto r = post(port, "/generate", body(i));
    ASSERT_EQ(r.status, 200) << r.body;
    alone[size_t(i)] = parse_json(r.body)["output_ids"].get<std::vector<int32_t>>();
  }
  const auto before = test::parse_metrics(get(port, "/metrics").body);
  EXPECT_EQ(before.at("tetra_preemptions_total"), 0);
  EXPECT_GE(before.at("tetra_prefill_chunks_total"), 4 * 3);  // 12-token prompts in chunks of 5
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i)
    clients.emplace_back([&, i] {
      const auto r = post(port, "/generate", body(i));
      EXPECT_EQ(r.status, 200) << r.body;
      together[size_t(i)] = parse_json(r.body)["output_ids"].get<std::vector<int32_t>>();
    });
  for (auto& c : clients) c.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(together[size_t(i)].size(), 24u) << "client " << i;
    EXPECT_EQ(together[size_t(i)], alone[size_t(i)]) << "client " << i;
  }
  std::map<std::string, double> m;
  for (int i = 0; i < 200; ++i) {  // the loop publishes its gauges after the last step
    m = test::parse_metrics(get(port, "/metrics").body);
    if (m["tetra_kv_cache_blocks_used"] == 0 && m["tetra_requests_running"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(m.at("tetra_preemptions_total"), 0);
  EXPECT_EQ(m.at("tetra_kv_cache_blocks_used"), 0);
  // More than the whole pool (56 tokens) is refused at once, not queued forever.
  expect_error(post(port, "/generate", {{"input_ids", test::test_prompt(20, 512, 70)}, {"max_new_tokens", 40}}), 400,
               "KV cache");
}

TEST(ServerLimits, FullQueueGets429) {
  server::ServerOptions o = options(test::server_model_plain(), 1, 1);
  o.engine.max_context = 4096;  // request 1 must still be running when request 3 arrives
  server::Server s(o);
  const int port = s.start("127.0.0.1", 0);
  // Request 1 runs (the only running slot) until we drop it; request 2 waits in the queue.
  std::atomic<bool> first_token{false}, release{false};
  std::thread running([&] {
    server::http_call("127.0.0.1", port, "POST", "/generate",
                      json({{"input_ids", {1, 2}}, {"max_new_tokens", 4000}, {"stream", true}}).dump(),
                      [&](std::string_view) {
                        first_token = true;
                        while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
                        return false;
                      });
  });
  while (!first_token) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  server::HttpResponse queued;
  std::thread waiting([&] { queued = post(port, "/generate", {{"input_ids", {3, 4}}, {"max_new_tokens", 3}}); });
  for (int i = 0; i < 400 && test::parse_metrics(get(port, "/metrics").body)["tetra_requests_waiting"] < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  expect_error(post(port, "/generate", {{"input_ids", {5, 6}}, {"max_new_tokens", 3}}), 429, "queue is full");
  release = true;
  running.join();
  waiting.join();
  EXPECT_EQ(queued.status, 200) << queued.body;
  const auto m = test::parse_metrics(get(port, "/metrics").body);
  EXPECT_EQ(m.at("tetra_requests_rejected_total{status=\"429\"}"), 1);
}

}  // namespace
}  // namespace tetra
