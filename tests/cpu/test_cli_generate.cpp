// `tetra generate`, `tetra logits` and `tetra demo` through the real binary: output agrees with
// the library engine (as ids, or as text through the model's tokenizer.json), stop ids, the demo's
// floor and efficiency, and one clear error line for bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "format/checkpoint.h"
#include "model_fixture.h"
#include "perf/roofline.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_fixture.h"
#include "tools/demo_model.h"

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

// The MLA models (GLM-5 with its DSA indexer past index_topk 16, DeepSeek-V3 with YaRN)
// generate through the CLI what the library engine does.
TEST(CliGenerate, MlaModelsGenerate) {
  for (const char* preset : {"tiny-glm5", "tiny-deepseek-v3"}) {
    const auto dir = tiny_model(preset, "nvfp4");
    const auto r = run_tetra("generate --model " + dir.string() +
                             " --prompt-ids 9,4,33,2 --max-new-tokens 30 --ignore-eos");
    ASSERT_EQ(r.code, 0) << preset << "\n" << r.output;
    EXPECT_EQ(first_line_ids(r.output), engine_greedy(dir, {9, 4, 33, 2}, 30)) << preset;
    EXPECT_NE(r.output.find("finish: length, 30 tokens"), std::string::npos) << r.output;
  }
}

// A run that ended on `token`, the last of at most `most` ids it printed.
void expect_stopped_at(const test::RunResult& r, int32_t token, size_t most) {
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<int32_t> got = first_line_ids(r.output);
  ASSERT_FALSE(got.empty()) << r.output;
  EXPECT_EQ(got.back(), token);
  EXPECT_LE(got.size(), most);
  EXPECT_NE(r.output.find("finish: stop"), std::string::npos) << r.output;
}

TEST(CliGenerate, StopIdsEndGeneration) {
  const auto dir = tiny_model("tiny-glm4.7", "bf16");
  const std::vector<int32_t> free_run = engine_greedy(dir, {9, 10, 11}, 8);
  const int32_t stop = free_run[2];
  const auto r = run_tetra("generate --model " + dir.string() +
                           " --prompt-ids 9,10,11 --max-new-tokens 8 --stop-ids " + std::to_string(stop));
  expect_stopped_at(r, stop, 3);
}

// generation_config.json's eos_token_id ends generation as a stop id does (a list whose other
// entries are out of the vocabulary or not ids), unless --ignore-eos.
TEST(CliGenerate, EosOfGenerationConfigEndsGenerationUnlessIgnored) {
  const auto shared = tiny_model("tiny-glm4.7", "bf16");
  const test::TempDir tmp("generate-eos");
  const std::filesystem::path dir = tmp.path() / "model";
  std::filesystem::copy(shared, dir, std::filesystem::copy_options::recursive);
  const std::vector<int32_t> free_run = engine_greedy(dir, {9, 10, 11}, 8);
  const int32_t eos = free_run[2];
  std::ofstream(dir / "generation_config.json")
      << R"({"eos_token_id": [99999999, "x", )" << eos << "]}";
  const std::string cmd = "generate --model " + dir.string() + " --prompt-ids 9,10,11 --max-new-tokens 8";
  expect_stopped_at(run_tetra(cmd), eos, 3);
  const auto ignored = run_tetra(cmd + " --ignore-eos");
  ASSERT_EQ(ignored.code, 0) << ignored.output;
  EXPECT_EQ(first_line_ids(ignored.output), free_run);
  EXPECT_NE(ignored.output.find("finish: length, 8 tokens"), std::string::npos) << ignored.output;
}

// --prompt TEXT: encoded with the checkpoint's tokenizer.json; the generated tokens stream as
// text (special tokens left out, as serve and vLLM do), or as ids with --output ids.
TEST(CliGenerate, TextPromptIsEncodedAndTheTokensStreamAsText) {
  const auto dir = test::tiny_model_with_tokenizer();
  const tok::Tokenizer t = tok::Tokenizer::from_file(dir / "tokenizer.json");
  const std::vector<int32_t> prompt = t.encode("hello world");
  const std::vector<int32_t> want = engine_greedy(dir, prompt, 6);
  const std::string want_text = t.decode(want, /*skip_special_tokens=*/true);
  ASSERT_FALSE(want_text.empty());
  const std::string gen = "generate --model " + dir.string() + " --max-new-tokens 6 ";

  const auto text = run_tetra(gen + "--prompt 'hello world'");
  ASSERT_EQ(text.code, 0) << text.output;
  const size_t end = text.output.find("\nfinish: length, 6 tokens");
  ASSERT_NE(end, std::string::npos) << text.output;
  EXPECT_EQ(text.output.substr(0, end), want_text);
  EXPECT_NE(text.output.find("prefill: " + std::to_string(prompt.size()) + " tokens"),
            std::string::npos) << text.output;

  const auto ids = run_tetra(gen + "--prompt 'hello world' --output ids");
  ASSERT_EQ(ids.code, 0) << ids.output;
  EXPECT_EQ(first_line_ids(ids.output), want);

  std::string prompt_ids;
  for (int32_t id : prompt) prompt_ids += (prompt_ids.empty() ? "" : ",") + std::to_string(id);
  const auto from_ids = run_tetra(gen + "--prompt-ids " + prompt_ids + " --output text");
  ASSERT_EQ(from_ids.code, 0) << from_ids.output;
  EXPECT_EQ(from_ids.output.substr(0, from_ids.output.find("\nfinish: ")), want_text);
}

TEST(CliGenerate, TextNeedsTheTokenizerAndExactlyOnePrompt) {
  const std::string plain = "generate --model " + tiny_model("tiny-glm4.5-air", "nvfp4").string();
  const auto no_tok = run_tetra(plain + " --prompt hello");
  EXPECT_EQ(no_tok.code, 1) << no_tok.output;
  EXPECT_NE(no_tok.output.find("tokenizer.json does not exist"), std::string::npos) << no_tok.output;
  EXPECT_NE(no_tok.output.find("--prompt-ids"), std::string::npos) << no_tok.output;
  const auto no_tok_out = run_tetra(plain + " --prompt-ids 1,2 --output text");
  EXPECT_EQ(no_tok_out.code, 1) << no_tok_out.output;
  EXPECT_NE(no_tok_out.output.find("--output ids"), std::string::npos) << no_tok_out.output;

  const std::string with_tok = "generate --model " + test::tiny_model_with_tokenizer().string();
  for (const std::string& args : {with_tok, with_tok + " --prompt hi --prompt-ids 1,2"}) {
    const auto r = run_tetra(args);
    EXPECT_GE(r.code, 100) << args << "\n" << r.output;  // a malformed command line
    EXPECT_NE(r.output.find("Exactly 1 option from [--prompt,--prompt-ids]"), std::string::npos)
        << r.output;
  }
  const auto bad_output = run_tetra(with_tok + " --prompt hi --output words");
  EXPECT_GE(bad_output.code, 100) << bad_output.output;
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
      {"generate --model " + air + " --prompt-ids 1 --temperature -0.5", "must be >= 0"},
      {"generate --model " + air + " --prompt-ids 1 --temperature nan", "must be >= 0"},
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

// The demo's decode floor counts the bytes bench decode's roofline does for the steps it ran
// (prompt of 8, step j reads 9 + j positions), over the host bandwidth it measured and names;
// the efficiency it prints is that floor over the decode time it prints.
TEST(CliDemo, PrintsTheDecodeFloorAndAnEfficiencyThatAgree) {
  test::TempDir tmp("demo-floor");
  const auto r = run_tetra("demo --tokens 4 --cache-dir " + tmp.path().string());
  ASSERT_EQ(r.code, 0) << r.output;
  const auto number = [&](const std::string& pattern, int group = 1) {
    std::smatch m;
    if (!std::regex_search(r.output, m, std::regex(pattern))) {
      ADD_FAILURE() << "no match for " << pattern << " in\n" << r.output;
      return 0.0;
    }
    return std::stod(m[group].str());
  };
  const std::string num = "([0-9]+(?:\\.[0-9]+)?(?:e[-+][0-9]+)?)";
  const double decode_ms = number("decode " + num + " ms/token over 3 steps");
  const double floor_ms = number("decode floor " + num + " ms/token");
  const double mb = number("ms/token: " + num + " MB per token");
  const double gbs = number("MB per token .* at " + num + " GB/s");
  const double efficiency = number("decode efficiency " + num + "%");
  EXPECT_NE(r.output.find("bandwidth: host memory read, measured now"), std::string::npos) << r.output;
  ASSERT_GT(decode_ms, 0);
  ASSERT_GT(gbs, 0);

  const Checkpoint ck = Checkpoint::open(demo_model_path(tmp.path().string(), "tiny-glm4.5-air"));
  RooflineOptions ro;
  ro.bandwidth_bytes_per_s = 1e12;  // any: only the bytes are compared
  double bytes = 0;
  for (int64_t context : {9, 10, 11}) {
    ro.context = context;
    bytes += decode_roofline(ck.config(), ck.quant(), GpuSpec{}, ro).memory_bytes;
  }
  EXPECT_NEAR(mb, bytes / 3 / 1e6, 1e-3 * mb);
  // Each figure is printed to 3-4 significant digits: agree within 1-2%.
  EXPECT_NEAR(floor_ms, mb * 1e6 / (gbs * 1e9) * 1e3, 1e-2 * floor_ms);
  EXPECT_NEAR(efficiency, 100 * floor_ms / decode_ms, 2e-2 * efficiency);
}

}  // namespace
}  // namespace tetra
