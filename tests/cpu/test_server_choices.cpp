// Several choices per request over real HTTP (loopback, CPU backend, tiny model with a
// tokenizer): a completions batch of prompts (text or token ids) answers each prompt as the
// engine does alone; n samples of one prompt draw with seed + i; streamed chunks carry their
// choice's index and add up to the whole answer; chat takes n too; a dropped stream of several
// choices frees every KV block; limits are 400s.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <thread>

#include "runtime/engine.h"
#include "tiny_server_suite.h"

namespace tetra {
namespace {

using nlohmann::json;
using test::get;
using test::parse_json;
using test::post;

constexpr int kContext = test::kTinyServerContext;

// One engine request alone: the reference for each choice.
std::vector<int32_t> engine_alone(const std::vector<int32_t>& prompt, const ops::SamplingParams& params, int n) {
  runtime::EngineOptions o;
  o.max_batch = 1;
  o.max_context = kContext;
  auto e = runtime::Engine::load(test::tiny_model_with_tokenizer(), o);
  const int64_t id = e->add_request(prompt, params, n);
  e->run_to_completion();
  return e->request(id).output;
}

using ServerChoices = test::TinyServerSuite;

TEST_F(ServerChoices, BatchedTextPromptsAnswerEachPrompt) {
  const std::vector<std::string> prompts = {"first prompt", "the second one", "3"};
  const auto r = post(port_, "/v1/completions",
                      {{"prompt", prompts}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = parse_json(r.body);
  ASSERT_EQ(j["choices"].size(), 3u);
  size_t prompt_tokens = 0;
  for (size_t k = 0; k < 3; ++k) {
    const std::vector<int32_t> ids = tok_->encode(prompts[k], true);
    prompt_tokens += ids.size();
    EXPECT_EQ(j["choices"][k]["index"], k);
    EXPECT_EQ(j["choices"][k]["text"], tok_->decode(engine_alone(ids, test::sampling(0, 0), 5), true)) << k;
    EXPECT_EQ(j["choices"][k]["finish_reason"], "length");
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], 15);
}

TEST_F(ServerChoices, BatchedTokenPromptsWithEcho) {
  const std::vector<std::vector<int32_t>> prompts = {{5, 6, 7}, {100, 3}};
  const auto r = post(port_, "/v1/completions",
                      {{"prompt", prompts}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true},
                       {"return_token_ids", true}, {"echo", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = parse_json(r.body);
  ASSERT_EQ(j["choices"].size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const std::vector<int32_t> out = engine_alone(prompts[k], test::sampling(0, 0), 4);
    EXPECT_EQ(j["choices"][k]["token_ids"].get<std::vector<int32_t>>(), out);
    EXPECT_EQ(j["choices"][k]["prompt_token_ids"].get<std::vector<int32_t>>(), prompts[k]);
    EXPECT_EQ(j["choices"][k]["text"], tok_->decode(prompts[k]) + tok_->decode(out, true)) << k;
  }
}

TEST_F(ServerChoices, NSamplesDrawWithSeedPlusIndex) {
  const std::string prompt = "sample me";
  const auto r = post(port_, "/v1/completions", {{"prompt", prompt}, {"n", 5}, {"max_tokens", 6}, {"temperature", 1.0},
                                                 {"seed", 40}, {"ignore_eos", true}, {"return_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = parse_json(r.body);
  ASSERT_EQ(j["choices"].size(), 5u);
  const std::vector<int32_t> ids = tok_->encode(prompt, true);
  std::set<std::vector<int32_t>> distinct;
  for (size_t k = 0; k < 5; ++k) {
    const std::vector<int32_t> got = j["choices"][k]["token_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(got, engine_alone(ids, test::sampling(1.0f, 40 + k), 6)) << "choice " << k;
    distinct.insert(got);
  }
  EXPECT_GT(distinct.size(), 1u);
  EXPECT_EQ(j["usage"]["prompt_tokens"], ids.size());  // one prompt, counted once
  EXPECT_EQ(j["usage"]["completion_tokens"], 30);
}

TEST_F(ServerChoices, NSamplesPrefillTheirPromptOnce) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(200 + (i * 7) % 97);
  const double before = test::settled_metrics(port_)["tetra_prefix_cache_hit_tokens_total"];
  const auto r = post(port_, "/v1/completions", {{"prompt", prompt}, {"n", 3}, {"max_tokens", 3}, {"temperature", 1.0},
                                                 {"seed", 70}, {"ignore_eos", true}, {"return_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = parse_json(r.body);
  for (size_t k = 0; k < 3; ++k)
    EXPECT_EQ(j["choices"][k]["token_ids"].get<std::vector<int32_t>>(), engine_alone(prompt, test::sampling(1.0f, 70 + k), 3));
  // Blocks of 16: two of the three read the first 32 prompt tokens from the first's blocks.
  EXPECT_EQ(test::settled_metrics(port_)["tetra_prefix_cache_hit_tokens_total"] - before, 64);
}

TEST_F(ServerChoices, StreamedChoicesAddUpToTheWholeAnswer) {
  const json req = {{"prompt", {"alpha", "beta gamma"}}, {"n", 3}, {"max_tokens", 7}, {"temperature", 0.9},
                    {"seed", 2}, {"ignore_eos", true}, {"logprobs", 1}};
  const json whole = parse_json(post(port_, "/v1/completions", req).body);
  ASSERT_EQ(whole["choices"].size(), 6u) << whole.dump();
  json sreq = req;
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  const auto events = test::sse_events(post(port_, "/v1/completions", sreq).body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::vector<std::string> text(6);
  std::vector<int> finishes(6, 0);
  std::vector<json> tokens(6, json::array());
  int usage_tokens = -1;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = parse_json(events[i]);
    ASSERT_TRUE(c.is_object()) << events[i];
    if (c.contains("usage")) {
      usage_tokens = c["usage"]["completion_tokens"];
      continue;
    }
    ASSERT_EQ(c["choices"].size(), 1u);
    const size_t k = c["choices"][0]["index"];
    ASSERT_LT(k, 6u);
    EXPECT_EQ(finishes[k], 0) << "a chunk of choice " << k << " after its finish";
    text[k] += c["choices"][0]["text"].get<std::string>();
    finishes[k] += !c["choices"][0]["finish_reason"].is_null();
    if (!c["choices"][0]["logprobs"].is_null())
      for (const json& t : c["choices"][0]["logprobs"]["tokens"]) tokens[k].push_back(t);
  }
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_EQ(text[k], whole["choices"][k]["text"]) << k;
    EXPECT_EQ(finishes[k], 1) << k;
    EXPECT_EQ(tokens[k], whole["choices"][k]["logprobs"]["tokens"]) << k;
  }
  EXPECT_EQ(usage_tokens, 42);
}

TEST_F(ServerChoices, ChatTakesN) {
  const json req = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"n", 3}, {"max_tokens", 4},
                    {"temperature", 1.0}, {"seed", 9}, {"ignore_eos", true}};
  const json whole = parse_json(post(port_, "/v1/chat/completions", req).body);
  ASSERT_EQ(whole["choices"].size(), 3u) << whole.dump();
  json sreq = req;
  sreq["stream"] = true;
  const auto events = test::sse_events(post(port_, "/v1/chat/completions", sreq).body);
  std::vector<std::string> content(3);
  std::vector<int> roles(3, 0);
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = parse_json(events[i])["choices"][0];
    const size_t k = c["index"];
    ASSERT_LT(k, 3u);
    roles[k] += c["delta"].contains("role");
    if (c["delta"].contains("content")) content[k] += c["delta"]["content"].get<std::string>();
  }
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(whole["choices"][k]["index"], k);
    EXPECT_EQ(whole["choices"][k]["message"]["content"], content[k]) << k;
    EXPECT_EQ(roles[k], 1) << k;
  }
}

TEST_F(ServerChoices, DroppedStreamOfSeveralChoicesFreesEveryBlock) {
  const double before = test::settled_metrics(port_)["tetra_generation_tokens_total"];
  int events = 0;
  server::SseReader reader;
  const auto r = server::http_call("127.0.0.1", port_, "POST", "/v1/completions",
                                   json({{"prompt", "go"}, {"n", 6}, {"max_tokens", 100}, {"stream", true},
                                         {"ignore_eos", true}}).dump(),
                                   [&](std::string_view bytes) {
                                     reader.feed(bytes, [&](const std::string&) { ++events; });
                                     return events < 3;
                                   });
  EXPECT_EQ(r.status, 200);
  std::map<std::string, double> m = test::settled_metrics(port_);
  EXPECT_EQ(m["tetra_kv_cache_blocks_used"], 0);
  EXPECT_EQ(m["tetra_requests_running"], 0);
  EXPECT_EQ(m["tetra_requests_waiting"], 0);
  EXPECT_LT(m["tetra_generation_tokens_total"] - before, 600);  // cancelled, not run to the end
}

TEST_F(ServerChoices, LimitsAre400) {
  auto status = [&](const char* path, const json& body) { return post(port_, path, body).status; };
  EXPECT_EQ(status("/v1/completions", {{"prompt", "x"}, {"n", server::kMaxChoices + 1}}), 400);
  EXPECT_EQ(status("/v1/completions", {{"prompt", {"a", "b"}}, {"n", server::kMaxChoices / 2 + 1}}), 400);
  EXPECT_EQ(status("/v1/completions", {{"prompt", {"a", ""}}, {"max_tokens", 2}}), 200);  // "" still has BOS ids
  EXPECT_EQ(status("/v1/completions", {{"prompt", {{1, 2}, json::array()}}}), 400);
  EXPECT_EQ(status("/generate", {{"input_ids", {1, 2}}, {"n", 2}}), 400);
  // A prompt too long for the context refuses the whole request; nothing is left running.
  std::vector<int32_t> long_prompt(kContext, 7);
  EXPECT_EQ(status("/v1/completions", {{"prompt", {std::vector<int32_t>{1, 2}, long_prompt}}, {"max_tokens", 100}}), 400);
  std::map<std::string, double> m = test::settled_metrics(port_);
  EXPECT_EQ(m["tetra_kv_cache_blocks_used"], 0);
  EXPECT_EQ(m["tetra_requests_running"], 0);
  EXPECT_EQ(m["tetra_requests_waiting"], 0);
}

}  // namespace
}  // namespace tetra
