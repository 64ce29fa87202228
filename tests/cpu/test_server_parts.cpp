// Server pieces without sockets: HTTP head parsing, request validation, stop strings, chat
// formats, metrics text, SSE reading, the profiler's start/stop rules and its GPU kernel track
// (a fake kernel source; the CUPTI one only for its missing-library error).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "bench/serve_bench.h"
#include "core/error.h"
#include "server/chat_format.h"
#include "server/http_client.h"
#include "server/http_message.h"
#include "server/kernel_tracer.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/profiler.h"
#include "server/stop_strings.h"

namespace tetra::server {
namespace {

TEST(HttpHead, ParsesRequestLineHeadersAndLength) {
  HttpRequest r;
  size_t len = 99;
  auto err = parse_request_head("POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length:  12 \r\nX-Y: z", r, len);
  ASSERT_FALSE(err) << err->message;
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.path, "/v1/completions");
  EXPECT_EQ(r.query, "x=1");
  EXPECT_EQ(len, 12u);
  EXPECT_EQ(r.header("x-y").value_or(""), "z");
  EXPECT_FALSE(r.header("missing"));
}

TEST(HttpHead, RefusesMalformedHeads) {
  HttpRequest r;
  size_t len = 0;
  EXPECT_EQ(parse_request_head("GARBAGE", r, len).value().status, 400);
  EXPECT_EQ(parse_request_head("GET / HTTP/2.0", r, len).value().status, 505);
  EXPECT_EQ(parse_request_head("GET noslash HTTP/1.1", r, len).value().status, 400);
  EXPECT_EQ(parse_request_head("GET / HTTP/1.1\r\nno colon here", r, len).value().status, 400);
  EXPECT_EQ(parse_request_head("POST / HTTP/1.1\r\nContent-Length: -5", r, len).value().status, 400);
  EXPECT_EQ(parse_request_head("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999", r, len).value().status, 400);
  EXPECT_EQ(parse_request_head("POST / HTTP/1.1\r\nTransfer-Encoding: chunked", r, len).value().status, 411);
}

TEST(OpenAiRequest, ReadsSamplingAndStop) {
  const GenerationRequest r = parse_generation_request(
      Endpoint::Completions,
      R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":7,"seed":42,
          "stop":["a","bc"],"stream":true,"stream_options":{"include_usage":true}})");
  EXPECT_EQ(r.model.value(), "m");
  EXPECT_EQ(r.prompts, (std::vector<std::string>{"hi"}));
  EXPECT_TRUE(r.token_prompts.empty());
  EXPECT_EQ(r.n, 1);
  EXPECT_EQ(r.max_tokens.value(), 5);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 7);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiRequest, ChatMessagesAndTokenPrompts) {
  const GenerationRequest c = parse_generation_request(
      Endpoint::Chat, R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"u1"},{"type":"text","text":"u2"}]}]})");
  ASSERT_EQ(c.messages.size(), 2u);
  EXPECT_EQ(c.messages[1].content, "u1u2");
  const GenerationRequest t = parse_generation_request(Endpoint::Completions, R"({"prompt":[3,4,5]})");
  EXPECT_EQ(t.token_prompts, (std::vector<std::vector<int32_t>>{{3, 4, 5}}));
  const GenerationRequest g = parse_generation_request(Endpoint::Generate, R"({"input_ids":[1],"max_new_tokens":3})");
  EXPECT_EQ(g.max_tokens.value(), 3);
}

TEST(OpenAiRequest, BatchedPromptsAndChoices) {
  const GenerationRequest texts =
      parse_generation_request(Endpoint::Completions, R"({"prompt":["a","bc",""],"n":2,"best_of":2})");
  EXPECT_EQ(texts.prompts, (std::vector<std::string>{"a", "bc", ""}));
  EXPECT_EQ(texts.n, 2);
  const GenerationRequest ids = parse_generation_request(Endpoint::Completions, R"({"prompt":[[1,2],[3]]})");
  EXPECT_EQ(ids.token_prompts, (std::vector<std::vector<int32_t>>{{1, 2}, {3}}));
  const GenerationRequest chat = parse_generation_request(
      Endpoint::Chat, R"({"messages":[{"role":"user","content":"u"}],"n":3})");
  EXPECT_EQ(chat.n, 3);
}

int status_of(Endpoint ep, const std::string& body) {
  try {
    parse_generation_request(ep, body);
  } catch (const ApiError& e) {
    return e.status;
  }
  return 200;
}

TEST(OpenAiRequest, RefusesBadBodiesWith400) {
  EXPECT_EQ(status_of(Endpoint::Completions, "{not json"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, "[1,2]"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","n":0})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","n":129})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","n":2,"best_of":3})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","best_of":2})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":["a","b"],"n":65})"), 400);  // 130 choices
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":[]})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":["a",[1]]})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":[[1],[]]})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":[1,"a"]})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":[1.5]})"), 400);
  EXPECT_EQ(status_of(Endpoint::Generate, R"({"input_ids":[1],"n":2})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","temperature":"hot"})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","temperature":3})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","top_p":0})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","max_tokens":0})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","max_tokens":1.5})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","stop":[1]})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","stop":""})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","stream":"yes"})"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, "{\"prompt\":\"\xff\xfe\"}"), 400);
  EXPECT_EQ(status_of(Endpoint::Completions, R"({"prompt":"x","max_tokens":777e4400000})"), 400);  // fuzz find
  EXPECT_EQ(status_of(Endpoint::Chat, R"({"messages":[]})"), 400);
  EXPECT_EQ(status_of(Endpoint::Chat, R"({"messages":[{"role":"wizard","content":"x"}]})"), 400);
  EXPECT_EQ(status_of(Endpoint::Generate, R"({"input_ids":[-1]})"), 400);
  EXPECT_EQ(status_of(Endpoint::Generate, R"({"input_ids":"1,2"})"), 400);
  EXPECT_EQ(status_of(Endpoint::Generate, R"({"input_ids":[1]})"), 200);
}

TEST(StopStrings, HoldsBackPossibleStartsAndCutsAtTheStop) {
  StopStringMatcher m({"STOP", "xy"});
  EXPECT_EQ(m.push("hello S"), "hello ");  // "S" may start STOP
  EXPECT_EQ(m.push("T"), "");              // "ST" still may
  EXPECT_EQ(m.push("ar"), "STar");         // it did not
  EXPECT_EQ(m.push("x"), "");
  EXPECT_EQ(m.push("yz"), "");             // "xy" matched: rest dropped
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
  StopStringMatcher n({"END"});
  EXPECT_EQ(n.push("abcE"), "abc");
  EXPECT_EQ(n.flush(), "E");  // finished without a match: the held tail goes out
  EXPECT_FALSE(n.stopped());
  StopStringMatcher earliest({"bc", "ab"});
  EXPECT_EQ(earliest.push("zabc"), "z");  // the earliest match wins
  StopStringMatcher kept({"bc", "ab", "abcd"}, true);
  EXPECT_EQ(kept.push("zab"), "zab");  // "ab" matched (and kept) before "abcd" could complete
  StopStringMatcher longest({"ab", "abc"}, true);
  EXPECT_EQ(longest.push("x"), "x");
  EXPECT_EQ(longest.push("yabcq"), "yabc");  // both match at one place: the longer is kept
  EXPECT_TRUE(longest.stopped());
  StopStringMatcher split({"END"}, true);
  EXPECT_EQ(split.push("aE"), "a");
  EXPECT_EQ(split.push("ND tail"), "END");
}

TEST(ChatFormat, RendersEachFamily) {
  const std::vector<ChatMessage> msgs = {{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}};
  EXPECT_EQ(render_chat(ChatFormat::Qwen, msgs),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
            "<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(ChatFormat::Glm, msgs),
            "[gMASK]<sop><|system|>\nS<|user|>\nU<|assistant|>\nA<|user|>\nV<|assistant|>\n");
  EXPECT_EQ(chat_format_for(Arch::Glm4Moe), ChatFormat::Glm);
  EXPECT_EQ(chat_format_for(Arch::GlmMoeDsa), ChatFormat::Glm);
  EXPECT_EQ(chat_format_for(Arch::Qwen3Moe), ChatFormat::Qwen);
  EXPECT_EQ(chat_format_for(Arch::DeepseekV3), ChatFormat::DeepSeek);
  const std::string ds = render_chat(ChatFormat::DeepSeek, {{"user", "U"}});
  EXPECT_NE(ds.find("User"), std::string::npos);
  EXPECT_EQ(ds.substr(ds.size() - std::string("Assistant\xEF\xBD\x9C>").size()), "Assistant\xEF\xBD\x9C>");
}

TEST(Metrics, HistogramsAreCumulativeAndCountersAdd) {
  Metrics m;
  m.observe_ttft(0.003);
  m.observe_ttft(0.3);
  m.add_generated_tokens(7);
  m.request_finished("stop", 0.2);
  m.set_gauges({2, 3, 10, 40});
  const std::string t = m.prometheus_text();
  EXPECT_NE(t.find("tetra_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"), std::string::npos) << t;
  EXPECT_NE(t.find("tetra_time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("tetra_time_to_first_token_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(t.find("tetra_generation_tokens_total 7\n"), std::string::npos);
  EXPECT_NE(t.find("tetra_requests_finished_total{finish_reason=\"stop\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("tetra_kv_cache_usage_ratio 0.25\n"), std::string::npos);
  EXPECT_NE(t.find("tetra_requests_waiting 2\n"), std::string::npos);
}

TEST(Sse, SplitsEventsAcrossFeeds) {
  SseReader r;
  std::vector<std::string> got;
  auto on = [&](const std::string& d) { got.push_back(d); };
  r.feed("data: {\"a\"", on);
  EXPECT_TRUE(got.empty());
  r.feed(":1}\n\ndata: [DONE]\n", on);
  r.feed("\n", on);
  EXPECT_EQ(got, (std::vector<std::string>{"{\"a\":1}", "[DONE]"}));
}

TEST(Profiler, StopWithoutStartFailsAndTraceHoldsEvents) {
  Profiler p;
  std::string out;
  EXPECT_FALSE(p.stop(out));
  EXPECT_TRUE(p.start());
  EXPECT_FALSE(p.start());
  p.complete("engine.step", "step", 10, 5, 1);
  ASSERT_TRUE(p.stop(out));
  const nlohmann::json j = nlohmann::json::parse(out);
  bool found = false;
  for (const auto& e : j["traceEvents"])
    if (e["name"] == "engine.step") found = e["ph"] == "X" && e["dur"] == 5;
  EXPECT_TRUE(found) << out;
  p.complete("after", "step", 0, 1, 1);  // not recorded: no profile running
  EXPECT_TRUE(p.start());
  ASSERT_TRUE(p.stop(out));
  EXPECT_EQ(out.find("after"), std::string::npos);
}

// A kernel source with fixed records on a clock 1 s ahead of the host's.
class FakeKernels final : public KernelSource {
 public:
  void start() override {
    if (fail) TETRA_FAIL("no libcupti here");
    started = true;
  }
  std::vector<KernelRecord> stop() override {
    started = false;
    return {{"gemm_kernel", kBase + 2000, kBase + 5000, 0, 7, 0},
            {"attention_kernel", kBase + 6000, kBase + 6500, 0, 7, 3},
            {"gemm_kernel", kBase + 7000, kBase + 9000, 0, 13, 3},
            // void tetra::moe_detail::decode_kernel<4, true>(tetra::moe_detail::Args, int)
            {"_ZN5tetra10moe_detail13decode_kernelILi4ELb1EEEvNS0_4ArgsEi", kBase + 9000,
             kBase + 9500, 0, 7, 3}};
  }
  uint64_t now_ns() override { return kBase; }
  static constexpr uint64_t kBase = 1'000'000'000;
  bool fail = false, started = false;
};

TEST(Profiler, KernelRecordsBecomeGpuEventsPerStream) {
  Profiler p;
  FakeKernels k;
  std::string out;
  const double t0 = p.now_us();
  ASSERT_TRUE(p.start(&k));
  EXPECT_TRUE(k.started);
  p.complete("engine.step", "step", t0 + 1, 10, 1);
  ASSERT_TRUE(p.stop(out, {{"trace_file", "/x.json"}}));
  EXPECT_FALSE(k.started);
  const nlohmann::json j = nlohmann::json::parse(out);
  std::map<std::string, int> kernels;
  std::set<int> tids;
  int stream_names = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("cat", "") == "kernel") {
      ++kernels[e["name"].get<std::string>()];
      tids.insert(e["tid"].get<int>());
      EXPECT_EQ(e["pid"], 2);
      // start 2 us after the anchor taken at start(), which is after t0
      if (e["name"] == "gemm_kernel" && e["tid"] == 7) {
        EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 3.0);
        EXPECT_GE(e["ts"].get<double>(), t0 + 2.0);
        EXPECT_LT(e["ts"].get<double>(), t0 + 2.0 + 1e6);
      }
      if (e["name"] == "attention_kernel") EXPECT_EQ(e["args"]["graph"], 3);
      if (e["name"] == "decode_kernel<4, true>")  // shown demangled and short, the symbol kept
        EXPECT_EQ(e["args"]["symbol"], "_ZN5tetra10moe_detail13decode_kernelILi4ELb1EEEvNS0_4ArgsEi");
    }
    if (e["name"] == "thread_name" && e["pid"] == 2) ++stream_names;
  }
  EXPECT_EQ(kernels["gemm_kernel"], 2);
  EXPECT_EQ(kernels["attention_kernel"], 1);
  EXPECT_EQ(kernels["decode_kernel<4, true>"], 1);
  EXPECT_EQ(tids, (std::set<int>{7, 13}));
  EXPECT_EQ(stream_names, 2);
  EXPECT_EQ(j["otherData"]["gpu_kernel_events"], 4);
  EXPECT_EQ(j["otherData"]["gpu_kernels_by_name"]["gemm_kernel"], 2);
  EXPECT_EQ(j["otherData"]["trace_file"], "/x.json");
}

TEST(Profiler, AKernelSourceThatCannotStartLeavesTheProfileOff) {
  Profiler p;
  FakeKernels k;
  k.fail = true;
  EXPECT_THROW(p.start(&k), Error);
  EXPECT_FALSE(p.active());
  std::string out;
  EXPECT_FALSE(p.stop(out));
}

TEST(Profiler, MissingCuptiIsAClearError) {
  setenv("TETRA_CUPTI_LIBRARY", "/nonexistent/libcupti.so", 1);
  CuptiKernelSource c;
  try {
    c.start();
    FAIL() << "started without libcupti";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("libcupti"), std::string::npos) << e.what();
  }
  unsetenv("TETRA_CUPTI_LIBRARY");
}

TEST(HttpUrl, ParsesHostAndPort) {
  std::string host;
  int port = 0;
  parse_http_url("http://127.0.0.1:8000/", host, port);
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 8000);
  EXPECT_THROW(parse_http_url("https://x:1", host, port), std::exception);
  EXPECT_THROW(parse_http_url("http://x", host, port), std::exception);
  EXPECT_THROW(parse_http_url("http://x:99999", host, port), std::exception);
}

TEST(ServeBench, LatencyPercentilesInterpolateLikeNumpy) {
  const bench::LatencyStats s = bench::latency_stats({10, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_DOUBLE_EQ(s.p50, 5.5);
  EXPECT_NEAR(s.p90, 9.1, 1e-12);
  EXPECT_NEAR(s.p99, 9.91, 1e-12);
  const bench::LatencyStats one = bench::latency_stats({4});
  EXPECT_EQ(one.p99, 4);
  EXPECT_EQ(bench::latency_stats({}).mean, 0);
}

}  // namespace
}  // namespace tetra::server
