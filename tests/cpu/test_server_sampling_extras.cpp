// logit_bias, min_tokens, include_stop_str_in_output and skip_special_tokens over real HTTP
// (loopback, CPU backend, tiny model with a tokenizer), against the engine or the text of a
// plain run; /tokenize and /detokenize against the tokenizer; and 400s for bad values.
#include <gtest/gtest.h>

#include "runtime/engine.h"
#include "tiny_server_suite.h"

namespace tetra {
namespace {

using nlohmann::json;
using test::parse_json;
using test::post;

class ServerExtras : public test::TinyServerSuite {
 protected:
  static json complete(const json& req) {
    const auto r = post(port_, "/v1/completions", req);
    EXPECT_EQ(r.status, 200) << r.body;
    return parse_json(r.body)["choices"][0];
  }
};

TEST_F(ServerExtras, LogitBiasForcesAndBans) {
  const json forced = complete({{"prompt", "x"}, {"max_tokens", 6}, {"temperature", 1.0}, {"seed", 1},
                                {"ignore_eos", true}, {"return_token_ids", true}, {"logit_bias", {{"321", 100}}}});
  EXPECT_EQ(forced["token_ids"].get<std::vector<int32_t>>(), std::vector<int32_t>(6, 321));
  json ban = json::object();
  for (int t = 0; t < 512; t += 3) ban[std::to_string(t)] = -100;
  const json banned = complete({{"prompt", "y"}, {"max_tokens", 30}, {"temperature", 1.5}, {"seed", 2},
                                {"ignore_eos", true}, {"return_token_ids", true}, {"logit_bias", ban}});
  for (int32_t t : banned["token_ids"].get<std::vector<int32_t>>()) EXPECT_NE(t % 3, 0) << t;
}

TEST_F(ServerExtras, MinTokensHoldsTheStopTokens) {
  const std::vector<int32_t> prompt = {11, 12, 13, 14};
  const auto plain = parse_json(post(port_, "/generate", {{"input_ids", prompt}, {"max_new_tokens", 10},
                                                          {"temperature", 0}}).body)["output_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(plain.size(), 10u);
  const json stop_first = {{"input_ids", prompt}, {"max_new_tokens", 10}, {"temperature", 0},
                           {"stop_token_ids", {plain[0]}}};
  EXPECT_EQ(parse_json(post(port_, "/generate", stop_first).body)["output_ids"].size(), 1u);
  json held = stop_first;
  held["min_tokens"] = 4;
  const auto out = parse_json(post(port_, "/generate", held).body)["output_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(out.size(), 4u);
  for (size_t k = 0; k < 4; ++k) EXPECT_NE(out[k], plain[0]) << k;
}

TEST_F(ServerExtras, IncludeStopStringInOutput) {
  const json req = {{"prompt", "Hello world"}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
  const std::string whole = complete(req)["text"];
  ASSERT_GE(whole.size(), 8u) << whole;
  const std::string stop = whole.substr(3, 3);
  const size_t at = whole.find(stop);
  json cut = req;
  cut["stop"] = stop;
  EXPECT_EQ(complete(cut)["text"], whole.substr(0, at));
  cut["include_stop_str_in_output"] = true;
  const json kept = complete(cut);
  EXPECT_EQ(kept["text"], whole.substr(0, at + stop.size()));
  EXPECT_EQ(kept["finish_reason"], "stop");
  cut["stream"] = true;  // streamed, the same text
  std::string streamed;
  const auto events = test::sse_events(post(port_, "/v1/completions", cut).body);
  for (size_t i = 0; i + 1 < events.size(); ++i) streamed += parse_json(events[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, whole.substr(0, at + stop.size()));
}

TEST_F(ServerExtras, SkipSpecialTokensFalseKeepsThemInTheText) {
  const int32_t special = tok_->token_to_id("<|assistant|>").value();
  ASSERT_TRUE(tok_->is_special(special));
  json req = {{"prompt", "z"}, {"max_tokens", 2}, {"temperature", 0}, {"ignore_eos", true},
              {"logit_bias", {{std::to_string(special), 100}}}};
  EXPECT_EQ(complete(req)["text"], "");
  req["skip_special_tokens"] = false;
  EXPECT_EQ(complete(req)["text"], "<|assistant|><|assistant|>");
}

TEST_F(ServerExtras, TokenizeAndDetokenizeUseTheServedTokenizer) {
  const std::string text = "Hello tokenizer, \u00e9t\u00e9!";
  const json t = parse_json(post(port_, "/tokenize", {{"prompt", text}}).body);
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), tok_->encode(text, true));
  EXPECT_EQ(t["count"], t["tokens"].size());
  EXPECT_EQ(t["max_model_len"], test::kTinyServerContext);
  const json bare = parse_json(post(port_, "/tokenize", {{"prompt", text}, {"add_special_tokens", false}}).body);
  EXPECT_EQ(bare["tokens"].get<std::vector<int32_t>>(), tok_->encode(text, false));
  EXPECT_LT(bare["count"].get<int>(), t["count"].get<int>());  // GLM's [gMASK]<sop> left out
  const json d = parse_json(post(port_, "/detokenize", {{"tokens", bare["tokens"]}}).body);
  EXPECT_EQ(d["prompt"], text);
  // Chat messages count as the chat endpoint renders them: its prompt_tokens.
  const json msgs = {{{"role", "user"}, {"content", "count me"}}};
  const json c = parse_json(post(port_, "/tokenize", {{"messages", msgs}}).body);
  const json chat = parse_json(post(port_, "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 1}}).body);
  EXPECT_EQ(c["count"], chat["usage"]["prompt_tokens"]);
  EXPECT_EQ(post(port_, "/tokenize", {{"prompt", 5}}).status, 400);
  EXPECT_EQ(post(port_, "/tokenize", {{"prompt", "x"}, {"add_special_tokens", "no"}}).status, 400);
  EXPECT_EQ(post(port_, "/tokenize", json::array()).status, 400);
  EXPECT_EQ(post(port_, "/detokenize", {{"tokens", {1, 512}}}).status, 400);
  EXPECT_EQ(post(port_, "/detokenize", {{"tokens", "1 2"}}).status, 400);
  EXPECT_EQ(test::get(port_, "/tokenize").status, 405);
}

TEST_F(ServerExtras, BadValuesAre400) {
  auto status = [&](const json& extra) {
    json req = {{"prompt", "x"}, {"max_tokens", 3}};
    req.update(extra);
    return post(port_, "/v1/completions", req).status;
  };
  EXPECT_EQ(status({{"logit_bias", {1, 2}}}), 400);
  EXPECT_EQ(status({{"logit_bias", {{"abc", 1}}}}), 400);
  EXPECT_EQ(status({{"logit_bias", {{"-1", 1}}}}), 400);
  EXPECT_EQ(status({{"logit_bias", {{"99999999999", 1}}}}), 400);
  EXPECT_EQ(status({{"logit_bias", {{"5", 101}}}}), 400);
  EXPECT_EQ(status({{"logit_bias", {{"5", "big"}}}}), 400);
  EXPECT_EQ(status({{"logit_bias", {{"512", 1}}}}), 400);  // past the vocabulary
  EXPECT_EQ(status({{"min_tokens", 4}}), 400);              // over max_tokens
  EXPECT_EQ(status({{"min_tokens", -1}}), 400);
  EXPECT_EQ(status({{"include_stop_str_in_output", "yes"}}), 400);
  EXPECT_EQ(status({{"skip_special_tokens", 0}}), 400);
  EXPECT_EQ(status({{"logit_bias", {{"5", -100}}}, {"min_tokens", 3}}), 200);
}

}  // namespace
}  // namespace tetra
