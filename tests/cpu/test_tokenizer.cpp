// tokenizer.json loading, encode, decode and streaming decode on the small tokenizers in
// tests/data/tokenizers (made by make_tokenizers.py: byte b has id b, merges add 256.. in order,
// so every expected id below is worked out by hand from the merge list there).
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "core/error.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using namespace tetra;
using namespace tetra::tok;
using V = std::vector<int32_t>;

namespace {

std::string data(const std::string& name) { return std::string(TETRA_TEST_DATA_DIR) + "/tokenizers/" + name; }
const Tokenizer& qwen() { static const Tokenizer t = Tokenizer::from_file(data("qwen2_style.json")); return t; }
const Tokenizer& glm() { static const Tokenizer t = Tokenizer::from_file(data("glm4_style.json")); return t; }
const Tokenizer& deepseek() { static const Tokenizer t = Tokenizer::from_file(data("deepseek_v3_style.json")); return t; }
const Tokenizer& gpt2() { static const Tokenizer t = Tokenizer::from_file(data("gpt2_style.json")); return t; }

nlohmann::json qwen_json() {
  std::ifstream f(data("qwen2_style.json"));
  return nlohmann::json::parse(f);
}

std::string load_error(const nlohmann::json& j) {
  try {
    Tokenizer::from_json(j, "bad.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Tokenizer, MergesInRankOrder) {
  EXPECT_EQ(qwen().encode("hello world"), (V{259, 264}));
  EXPECT_EQ(qwen().encode("Hello"), (V{'H', 'e', 257, 'o'}));  // only lowercase h+e merges
  EXPECT_EQ(qwen().encode("  hello"), (V{' ', ' ', 259}));      // " " then " hello" = Ġ + hello
  EXPECT_EQ(qwen().encode("a   "), (V{'a', 267, ' '}));          // trailing run: ĠĠ then Ġ
  EXPECT_EQ(qwen().encode("\xC3\xA9"), (V{265}));
  EXPECT_EQ(qwen().encode(""), V{});
}

TEST(Tokenizer, Qwen2PreTokenizationAndNfc) {
  EXPECT_EQ(qwen().encode("it'S"), (V{'i', 't', '\'', 'S'}));
  EXPECT_EQ(qwen().encode("a\n\nb"), (V{'a', '\n', '\n', 'b'}));
  EXPECT_EQ(qwen().encode("12345"), (V{'1', '2', '3', '4', '5'}));  // \p{N}: one digit per piece
  EXPECT_EQ(qwen().encode("!hello"), (V{269}));                     // one piece: ! joins the word
  // NFC composes e + U+0301 into é (C3 A9 -> merge 265).
  EXPECT_EQ(qwen().encode("e\xCC\x81"), (V{265}));
}

TEST(Tokenizer, Glm4DigitsTemplateAndStrip) {
  // \p{N}{1,3}: "123" "45" -> 12 merges only inside the first piece.
  EXPECT_EQ(glm().encode("12345", false), (V{268, '3', '4', '5'}));
  EXPECT_EQ(glm().encode("4512", false), (V{'4', '5', '1', '2'}));  // "451" "2": no 1+2 merge
  EXPECT_EQ(glm().encode("hello"), (V{271, 272, 259}));             // [gMASK] <sop> prepended
  // No normalizer: e + U+0301 stays two pieces (the mark is not a letter).
  EXPECT_EQ(glm().encode("e\xCC\x81", false), (V{'e', 0xCC, 0x81}));
  // <|user|> has lstrip and rstrip: the spaces around it go with it.
  EXPECT_EQ(glm().encode("hi <|user|> there", false), (V{'h', 'i', 273, 't', 256, 'r', 'e'}));
}

TEST(Tokenizer, DeepSeekSplitsAndBos) {
  EXPECT_EQ(deepseek().encode("hello, world"), (V{270, 259, ',', 264}));
  EXPECT_EQ(deepseek().encode("12345", false), (V{268, '3', '4', '5'}));
  EXPECT_EQ(deepseek().encode("!hello", false), (V{269}));  // [punct][A-Za-z]+ is one piece
  // CJK run isolated by the second Split, bytes of 中文 then abc.
  EXPECT_EQ(deepseek().encode("\xE4\xB8\xAD\xE6\x96\x87" "abc", false),
            (V{0xE4, 0xB8, 0xAD, 0xE6, 0x96, 0x87, 'a', 'b', 'c'}));
}

TEST(Tokenizer, Gpt2ByteLevelRegex) {
  EXPECT_EQ(gpt2().encode("hello world"), (V{259, 264}));
  EXPECT_EQ(gpt2().encode("!hello"), (V{'!', 259}));  // GPT-2 splits punctuation from letters
}

TEST(Tokenizer, AddedTokens) {
  EXPECT_EQ(qwen().encode("<|im_start|>hello<|im_end|>"), (V{271, 259, 272}));
  EXPECT_EQ(qwen().encode("x<|endoftext|>"), (V{'x', 270}));
  EXPECT_EQ(qwen().encode("<|im_start"), (V{'<', '|', 'i', 'm', '_', 's', 't', 'a', 'r', 't'}));
  EXPECT_TRUE(qwen().is_special(270));
  EXPECT_FALSE(qwen().is_special(273));
  EXPECT_EQ(qwen().token_to_id("<think>"), 273);
  EXPECT_EQ(qwen().token_to_id("hello"), 259);
  EXPECT_FALSE(qwen().token_to_id("nope").has_value());
}

TEST(Tokenizer, DecodeRoundTripsAndSkipsSpecials) {
  for (const std::string s : {"hello world", "  hello", "a\n\n\tb  ", "\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80!!",
                              "int main() { return 0; }\n", "caf\xC3\xA9 na\xC3\xAFve"}) {
    EXPECT_EQ(qwen().decode(qwen().encode(s)), s);
    EXPECT_EQ(glm().decode(glm().encode(s, false)), s);
    EXPECT_EQ(deepseek().decode(deepseek().encode(s), true), s);
  }
  const V ids = qwen().encode("<|im_start|>hi<think>");
  EXPECT_EQ(qwen().decode(ids), "<|im_start|>hi<think>");
  EXPECT_EQ(qwen().decode(ids, true), "hi<think>");  // <think> is not special
  // Added tokens outside the byte-level alphabet decode as their own UTF-8.
  EXPECT_EQ(deepseek().decode(deepseek().encode("hi")),
            "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>hi");
  // A lone continuation byte decodes to U+FFFD.
  EXPECT_EQ(qwen().decode(V{'a', 0x80}), "a\xEF\xBF\xBD");
  EXPECT_THROW(qwen().decode(V{9999}), Error);
  EXPECT_THROW(qwen().decode(V{-1}), Error);
}

TEST(Tokenizer, RefusesInvalidUtf8Input) {
  EXPECT_THROW(qwen().encode("ok\xFF"), Error);
  EXPECT_THROW(qwen().encode("\xE2\x82"), Error);
}

TEST(TokenizerStream, HoldsPartialCharacters) {
  StreamDecoder s(qwen());
  // 😀 = F0 9F 98 80, one byte token at a time.
  EXPECT_EQ(s.push(0xF0), "");
  EXPECT_EQ(s.push(0x9F), "");
  EXPECT_EQ(s.push(0x98), "");
  EXPECT_EQ(s.pending_bytes(), 3u);
  EXPECT_EQ(s.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.push(259), "hello");
  // A broken sequence becomes U+FFFD once it cannot complete.
  EXPECT_EQ(s.push(0xE2), "");
  EXPECT_EQ(s.push('A'), "\xEF\xBF\xBD" "A");
  EXPECT_EQ(s.push(0xE4), "");
  EXPECT_EQ(s.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(s.finish(), "");
}

TEST(TokenizerStream, JoinedEqualsDecodeAndEveryPieceIsValid) {
  std::mt19937 rng(7);
  // Ids biased to multi-byte lead and continuation bytes, plus merges and added tokens.
  std::vector<int32_t> pool;
  for (int b = 0x80; b < 0x100; ++b) pool.push_back(b);
  for (int32_t id : V{'a', ' ', 259, 264, 265, 270, 271, 273}) pool.push_back(id);
  for (int trial = 0; trial < 2000; ++trial) {
    V ids(rng() % 12);
    for (auto& id : ids) id = pool[rng() % pool.size()];
    for (bool skip : {false, true}) {
      StreamDecoder s(qwen(), skip);
      std::string joined;
      for (int32_t id : ids) {
        const std::string piece = s.push(id);
        EXPECT_NO_THROW(utf8_to_u32(piece)) << "trial " << trial;
        joined += piece;
      }
      joined += s.finish();
      ASSERT_EQ(joined, qwen().decode(ids, skip)) << "trial " << trial;
    }
  }
}

TEST(TokenizerLoad, ClearErrors) {
  auto j = qwen_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(load_error(j).find("pre-tokenizer 'Whitespace' is not supported"), std::string::npos) << load_error(j);
  j = qwen_json();
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(load_error(j).find("WordPiece"), std::string::npos);
  j = qwen_json();
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_NE(load_error(j).find("NFKC"), std::string::npos);
  j = qwen_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = R"(\d+)";
  EXPECT_NE(load_error(j).find("unsupported pre-tokenizer regex"), std::string::npos);
  j = qwen_json();
  j["model"]["merges"].push_back("zz qq");
  EXPECT_NE(load_error(j).find("missing from the vocab"), std::string::npos);
  j = qwen_json();
  j["pre_tokenizer"]["pretokenizers"].erase(1);
  EXPECT_NE(load_error(j).find("byte-level"), std::string::npos);
  j = qwen_json();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(load_error(j).find("decoder 'WordPiece'"), std::string::npos);
  j = qwen_json();
  j["model"]["vocab"]["x"] = "seven";
  EXPECT_NE(load_error(j).find("bad.json"), std::string::npos);
  j = qwen_json();
  j["added_tokens"][0]["id"] = 300;  // the reference would renumber it to 270
  EXPECT_NE(load_error(j).find("has id 300 but would get id 270"), std::string::npos) << load_error(j);
  j = qwen_json();
  j["model"]["vocab"]["far"] = 2000000000;  // a table indexed by id would need ~64 GB
  EXPECT_NE(load_error(j).find("token id 2000000000 is over 4194303"), std::string::npos)
      << load_error(j);
  j = qwen_json();
  j["model"]["vocab"]["neg"] = -1;
  EXPECT_NE(load_error(j).find("non-negative integer"), std::string::npos) << load_error(j);
  j = qwen_json();
  j.erase("model");
  EXPECT_NE(load_error(j).find("missing \"model\""), std::string::npos);
  try {
    Tokenizer::from_string("{not json", "t.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.json: not valid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::from_file(data("does_not_exist.json")), Error);
}

TEST(TokenizeCli, IdsDecodeBatchAndErrors) {
  const std::string tok = "--tokenizer " + data("qwen2_style.json");
  auto r = test::run_tetra("tokenize " + tok + " --text 'hello world'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, "259,264\n");
  r = test::run_tetra("tokenize " + tok + " --decode 271,259,272");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, "<|im_start|>hello<|im_end|>\n");
  r = test::run_tetra("tokenize " + tok + " --decode 271,259,272 --skip-special-tokens");
  EXPECT_EQ(r.output, "hello\n");
  test::TempDir dir("tokcli");
  const auto batch = dir.path() / "batch.json";
  std::ofstream(batch) << R"(["hello world", "a\n\nb", ""])";
  r = test::run_tetra("tokenize " + tok + " --batch-json " + batch.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output), nlohmann::json::parse(R"([[259,264],[97,10,10,98],[]])"));
  r = test::run_tetra("tokenize " + tok + " --decode 1,x");
  EXPECT_EQ(r.code, 1) << r.output;
  r = test::run_tetra("tokenize " + tok + " --decode 99999");
  EXPECT_EQ(r.code, 1) << r.output;
  r = test::run_tetra("tokenize --tokenizer /nonexistent.json --text hi");
  EXPECT_EQ(r.code, 1) << r.output;
  r = test::run_tetra("tokenize " + tok);
  EXPECT_EQ(r.code, 1) << r.output;
}
