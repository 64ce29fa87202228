// `tetra generate`, `tetra logits` and `tetra demo` through the real binary: output agrees with
// the library engine, stop ids, and one clear error line for bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model_fixture.h"
#include "runtime/engine.h"

namespace tetra {
namespace {

using test::run_tetra;
using test::tiny_model;

std::vector<int32_t> first_line_ids(const std::string& out) {
  std::istringstream is(out.substr(0, out.find('\n')));
  std::vector<int32_t> ids;
  int32_t v;
  while (is >> v) ids.push_back(v);
  return ids;
}

std::vector<int32_t> engine_greedy(const std::filesystem::path& dir, std::vector<int32_t> prompt, int n) {
  runtime::EngineOptions o;
  o.max_batch = 1;
  o.max_context = int(prompt.size()) + n;
  auto e = runtime::Engine::load(dir, o);
  ops::SamplingParams p;
  p.temperature = 0.0f;
  const int64_t id = e->add_request(std::move(prompt), p, n);
  e->run_to_completion();
  return e->request(id).output;
}

TEST(CliGenerate, StreamsTheEnginesGreedyTokensAndTiming) {
  const auto dir = tiny_model("tiny-qwen3-30b-a3b", "nvfp4");
  const auto r = run_tetra("generate --model " + dir.string() + " --prompt-ids 5,6,7,8 --max-new-tokens 7");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(first_line_ids(r.output), engine_greedy(dir, {5, 6, 7, 8}, 7));
  EXPECT_NE(r.output.find("finish: length, 7 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ms/token"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
}

TEST(CliGenerate, StopIdsEndGeneration) {
  const auto dir = tiny_model("tiny-glm4.7", "bf16");
  const std::vector<int32_t> free_run = engine_greedy(dir, {9, 10, 11}, 8);
  const int32_t stop = free_run[2];
  const auto r = run_tetra("generate --model " + dir.string() +
                           " --prompt-ids 9,10,11 --max-new-tokens 8 --stop-ids " + std::to_string(stop));
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<int32_t> got = first_line_ids(r.output);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back(), stop);
  EXPECT_LE(got.size(), 3u);
  EXPECT_NE(r.output.find("finish: stop"), std::string::npos) << r.output;
}

TEST(CliGenerate, BadInputGivesOneClearLine) {
  const std::string air = tiny_model("tiny-glm4.5-air", "bf16").string();
  struct Bad {
    std::string args, says;
  } cases[] = {
      {"generate --model /nonexistent/model --prompt-ids 1", "not found"},
      {"generate --model " + air + " --prompt-ids 1,,2", "not a token id"},
      {"generate --model " + air + " --prompt-ids 1,abc", "not a token id"},
      {"generate --model " + air + " --prompt-ids 1,-4", "out of range"},
      {"generate --model " + air + " --prompt-ids 1,512", "outside the vocabulary"},
      {"generate --model " + air + " --prompt-ids 1 --backend tpu", "unknown backend"},
      {"generate --model " + air + " --prompt-ids 1 --max-new-tokens 0", "at least 1"},
      {"generate --model " + tiny_model("tiny-glm5", "bf16").string() + " --prompt-ids 1", "MLA"},
      {"generate --model " + tiny_model("tiny-deepseek-v3", "nvfp4").string() + " --prompt-ids 1", "MLA"},
  };
  for (const Bad& b : cases) {
    const auto r = run_tetra(b.args);
    EXPECT_EQ(r.code, 1) << b.args << "\n" << r.output;
    EXPECT_NE(r.output.find(b.says), std::string::npos) << b.args << "\n" << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  }
}

TEST(CliLogits, WritesTheEnginesScoredLogits) {
  const auto dir = tiny_model("tiny-glm4.5-air", "nvfp4");
  test::TempDir tmp("logits");
  const auto prompts = tmp.path() / "p.json";
  std::ofstream(prompts) << "[[1,2,3,4,5],[7,8]]";
  const auto out = tmp.path() / "o";
  const auto r = run_tetra("logits --model " + dir.string() + " --prompts " + prompts.string() +
                           " --out " + out.string() + " --decode-steps 4");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json meta = nlohmann::json::parse(std::ifstream(out.string() + ".json"));
  ASSERT_EQ(meta["vocab"], 512);
  ASSERT_EQ(meta["prompts"].size(), 2u);
  EXPECT_EQ(meta["prompts"][0]["rows"], 9);
  EXPECT_EQ(meta["prompts"][1]["rows"], 6);
  std::ifstream bin(out.string() + ".bin", std::ios::binary);
  std::vector<float> got((9 + 6) * 512);
  bin.read(reinterpret_cast<char*>(got.data()), std::streamsize(got.size() * 4));
  ASSERT_TRUE(bin.good());
  EXPECT_EQ(bin.peek(), EOF);

  runtime::EngineOptions o;
  o.max_batch = 2;
  o.max_context = 16;
  auto e = runtime::Engine::load(dir, o);
  std::vector<std::vector<int32_t>> gen;
  const auto want = e->score({{1, 2, 3, 4, 5}, {7, 8}}, 4, &gen);
  std::vector<float> flat = want[0];
  flat.insert(flat.end(), want[1].begin(), want[1].end());
  EXPECT_EQ(got, flat);
  EXPECT_EQ(meta["prompts"][0]["generated"].get<std::vector<int32_t>>(), gen[0]);
}

TEST(CliDemo, MakesCachesAndGenerates) {
  test::TempDir tmp("demo");
  const auto first = run_tetra("demo --tokens 4 --cache-dir " + tmp.path().string());
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_NE(first.output.find("made "), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("generate (cpu backend"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("ms/token"), std::string::npos) << first.output;
  const auto second = run_tetra("demo --tokens 4 --cache-dir " + tmp.path().string());
  ASSERT_EQ(second.code, 0) << second.output;
  EXPECT_NE(second.output.find("using cached"), std::string::npos) << second.output;
  // The same cached model and greedy decoding: the same tokens both times.
  const auto tokens_line = [](const std::string& s) {
    const size_t a = s.find("generate (");
    return s.substr(a, s.find('\n', a) - a);
  };
  EXPECT_EQ(tokens_line(first.output), tokens_line(second.output));
}

}  // namespace
}  // namespace tetra
