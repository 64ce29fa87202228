// OpenAI `logprobs` over real HTTP (loopback, CPU backend, tiny model with a tokenizer): the
// completions and chat shapes, the values equal to the engine's for the same request, the
// prompt's logprobs with echo (lm-eval's loglikelihood request), streamed pieces adding up to the
// whole answer, token-id spellings without a tokenizer, and 400s for bad values.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/engine.h"
#include "tiny_server_suite.h"

namespace tetra {
namespace {

using nlohmann::json;
using test::parse_json;
using test::post;

constexpr int kContext = test::kTinyServerContext;

// A token's text as the server writes it (its raw bytes, invalid UTF-8 replaced).
std::string token_text(const tok::Tokenizer& tok, int32_t id) {
  return json::parse(json(tok.token_bytes(id)).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

struct EngineRun {
  std::vector<int32_t> output;
  std::vector<ops::PositionLogprobs> logprobs, prompt_logprobs;
};

EngineRun engine_run(const std::vector<int32_t>& prompt, const ops::SamplingParams& params, int n,
                     runtime::LogprobOptions lp) {
  runtime::EngineOptions o;
  o.max_batch = 1;
  o.max_context = kContext;
  auto e = runtime::Engine::load(test::tiny_model_with_tokenizer(), o);
  const int64_t id = e->add_request(prompt, params, n, {}, {.logprobs = lp});
  EngineRun run;
  while (e->has_work())
    for (const runtime::TokenEvent& ev : e->step()) run.logprobs.push_back(*ev.logprobs);
  run.output = e->request(id).output;
  run.prompt_logprobs = e->request(id).prompt_logprobs;
  return run;
}

using ServerLogprobs = test::TinyServerSuite;

// A completion choice's logprobs entry k against the engine's logprobs of `token`.
void expect_completion_entry(const json& lp, size_t k, const tok::Tokenizer& tok, int32_t token,
                             const ops::PositionLogprobs& want) {
  EXPECT_EQ(lp["tokens"][k], token_text(tok, token)) << k;
  EXPECT_NEAR(lp["token_logprobs"][k].get<double>(), want.logprob, 1e-5) << k;
  const json& top = lp["top_logprobs"][k];
  ASSERT_TRUE(top.is_object()) << k;
  EXPECT_LE(top.size(), want.top.size() + 1) << k;  // the chosen token is always there
  EXPECT_NEAR(top.at(token_text(tok, token)).get<double>(), want.logprob, 1e-5) << k;
  for (const ops::TokenLogprob& alt : want.top) {
    ASSERT_TRUE(top.contains(token_text(tok, alt.token))) << k;
    EXPECT_GE(top.at(token_text(tok, alt.token)).get<double>(), alt.logprob - 1e-5) << k;  // a same-text id may rank higher
  }
}

TEST_F(ServerLogprobs, CompletionLogprobsAreTheEngines) {
  const std::string prompt = "Hello world, this is a test";
  const auto r = post(port_, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0.7},
                                                 {"seed", 3}, {"ignore_eos", true}, {"logprobs", 3}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = parse_json(r.body)["choices"][0];
  const EngineRun want = engine_run(tok_->encode(prompt, true), test::sampling(0.7f, 3), 6, {3, false});
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u) << r.body;
  ASSERT_EQ(lp["token_logprobs"].size(), 6u);
  ASSERT_EQ(lp["top_logprobs"].size(), 6u);
  ASSERT_EQ(lp["text_offset"].size(), 6u);
  int64_t last_offset = 0;
  for (size_t k = 0; k < 6; ++k) {
    expect_completion_entry(lp, k, *tok_, want.output[k], want.logprobs[k]);
    EXPECT_LE(lp["token_logprobs"][k].get<double>(), 0.0);
    EXPECT_GE(lp["text_offset"][k].get<int64_t>(), last_offset);
    last_offset = lp["text_offset"][k].get<int64_t>();
  }
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(c["text"], tok_->decode(want.output, true));
}

// lm-eval's loglikelihood request: echo, logprobs 1, one new token. The prompt's tokens come
// first, the first without a logprob.
TEST_F(ServerLogprobs, EchoGivesThePromptsLogprobs) {
  const std::string prompt = "The quick brown fox jumps over the lazy dog";
  const json req = {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"echo", true}, {"logprobs", 1}};
  const auto r = post(port_, "/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = parse_json(r.body)["choices"][0];
  const std::vector<int32_t> ids = tok_->encode(prompt, true);
  const EngineRun want = engine_run(ids, test::sampling(0, 0), 1, {1, true});
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size() + 1) << r.body;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["tokens"][0], token_text(*tok_, ids[0]));
  for (size_t k = 1; k < ids.size(); ++k) expect_completion_entry(lp, k, *tok_, ids[k], want.prompt_logprobs[k - 1]);
  expect_completion_entry(lp, ids.size(), *tok_, want.output[0], want.logprobs[0]);
  EXPECT_EQ(c["text"].get<std::string>().rfind(prompt, 0), 0u);
  // The generated token's offset is where its text starts: after the echoed prompt.
  EXPECT_EQ(lp["text_offset"][ids.size()].get<int64_t>(), int64_t(prompt.size()));

  // Streamed: the echoed prompt arrives with its logprobs, the token after; together the same.
  json sreq = req;
  sreq["stream"] = true;
  sreq["max_tokens"] = 4;
  json whole_req = sreq;
  whole_req.erase("stream");
  const json whole = parse_json(post(port_, "/v1/completions", whole_req).body)["choices"][0];
  const auto events = test::sse_events(post(port_, "/v1/completions", sreq).body);
  json joined = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                 {"text_offset", json::array()}};
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = parse_json(events[i])["choices"][0];
    text += e["text"].get<std::string>();
    if (e["logprobs"].is_null()) continue;
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
      for (const json& v : e["logprobs"][key]) joined[key].push_back(v);
  }
  EXPECT_EQ(text, whole["text"]);
  EXPECT_EQ(joined, whole["logprobs"]);
  EXPECT_EQ(joined["tokens"].size(), ids.size() + 4);
}

TEST_F(ServerLogprobs, ChatLogprobsAreTheEngines) {
  const json messages = {{{"role", "user"}, {"content", "say something"}}};
  const json req = {{"messages", messages}, {"max_tokens", 5}, {"temperature", 0.9}, {"seed", 8},
                    {"ignore_eos", true}, {"logprobs", true}, {"top_logprobs", 2}};
  const auto r = post(port_, "/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = parse_json(r.body)["choices"][0];
  const json& content = c["logprobs"]["content"];
  ASSERT_EQ(content.size(), 5u) << r.body;
  const int completion_tokens = parse_json(r.body)["usage"]["completion_tokens"];
  EXPECT_EQ(completion_tokens, 5);
  double total = 0;
  for (const json& entry : content) {
    ASSERT_EQ(entry["top_logprobs"].size(), 2u);
    EXPECT_GE(entry["top_logprobs"][0]["logprob"].get<double>(), entry["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_LE(entry["logprob"].get<double>(), 0.0);
    std::string bytes;
    for (const json& b : entry["bytes"]) bytes.push_back(char(b.get<int>()));
    total += entry["logprob"].get<double>();
    // The bytes are the token's: decoding them back gives the text field.
    EXPECT_EQ(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace), entry["token"].dump());
  }
  EXPECT_LT(total, 0.0);
  // Streamed: the content entries of the chunks add up to the same list.
  json sreq = req;
  sreq["stream"] = true;
  const auto events = test::sse_events(post(port_, "/v1/chat/completions", sreq).body);
  json joined = json::array();
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = parse_json(events[i])["choices"][0];
    if (e.contains("logprobs") && !e["logprobs"].is_null())
      for (const json& v : e["logprobs"]["content"]) joined.push_back(v);
  }
  EXPECT_EQ(joined, content);
  // logprobs true without top_logprobs: the chosen tokens only.
  json plain = req;
  plain.erase("top_logprobs");
  const json p = parse_json(post(port_, "/v1/chat/completions", plain).body)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(p.size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_TRUE(p[k]["top_logprobs"].empty());
    EXPECT_EQ(p[k]["token"], content[k]["token"]);
    EXPECT_NEAR(p[k]["logprob"].get<double>(), content[k]["logprob"].get<double>(), 1e-6);
  }
}

TEST_F(ServerLogprobs, NotAskedMeansNull) {
  const auto c = post(port_, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}, {"logprobs", false}});
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_TRUE(parse_json(c.body)["choices"][0]["logprobs"].is_null());
  const auto h = post(port_, "/v1/chat/completions",
                      {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"max_tokens", 2}, {"logprobs", false}});
  ASSERT_EQ(h.status, 200) << h.body;
  EXPECT_TRUE(parse_json(h.body)["choices"][0]["logprobs"].is_null());
}

TEST_F(ServerLogprobs, BadValuesAre400) {
  auto expect_400 = [&](const char* path, const json& body, const std::string& part) {
    const auto r = post(port_, path, body);
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.body;
    EXPECT_NE(r.body.find(part), std::string::npos) << r.body;
  };
  const json msgs = {{{"role", "user"}, {"content", "x"}}};
  expect_400("/v1/completions", {{"prompt", "x"}, {"logprobs", 21}}, "logprobs");
  expect_400("/v1/completions", {{"prompt", "x"}, {"logprobs", -1}}, "logprobs");
  expect_400("/v1/completions", {{"prompt", "x"}, {"logprobs", true}}, "logprobs");
  expect_400("/v1/completions", {{"prompt", "x"}, {"logprobs", 1.5}}, "logprobs");
  expect_400("/v1/completions", {{"prompt", "x"}, {"top_logprobs", 2}}, "top_logprobs");
  expect_400("/v1/chat/completions", {{"messages", msgs}, {"top_logprobs", 2}}, "needs 'logprobs': true");
  expect_400("/v1/chat/completions", {{"messages", msgs}, {"logprobs", 1}}, "logprobs");
  expect_400("/v1/chat/completions", {{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs");
  expect_400("/generate", {{"input_ids", {1, 2}}, {"logprobs", 1}}, "/generate");
}

// Without a tokenizer a token-id completion names its tokens by id.
TEST(ServerLogprobsNoTokenizer, TokensAreNamedByTheirIds) {
  server::ServerOptions o;
  o.model_dir = test::server_model_plain();
  o.engine.backend = "cpu";
  o.engine.max_context = kContext;
  server::Server s(o);
  const int port = s.start("127.0.0.1", 0);
  const auto r = post(port, "/v1/completions",
                      {{"prompt", {3, 4, 5}}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", 2}, {"echo", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const json c = parse_json(r.body)["choices"][0];
  const std::vector<int32_t> out = c["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(out.size(), 3u);
  const json& tokens = c["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), 6u) << r.body;
  EXPECT_EQ(tokens[0], "token_id:3");
  EXPECT_EQ(tokens[2], "token_id:5");
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(tokens[3 + k], "token_id:" + std::to_string(out[k]));
  for (size_t k = 1; k < 6; ++k) EXPECT_TRUE(c["logprobs"]["top_logprobs"][k].contains(tokens[k].get<std::string>()));
}

}  // namespace
}  // namespace tetra
