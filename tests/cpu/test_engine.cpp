// The generation engine on the CPU backend: stopping rules, batching of concurrent requests,
// greedy decoding agreeing with an independent argmax over score()'s logits, seeded sampling,
// request validation.
#include <gtest/gtest.h>

#include "core/error.h"
#include "format/model_config.h"
#include "model_fixture.h"
#include "runtime/engine.h"

namespace tetra {
namespace {

using runtime::Engine;
using runtime::EngineOptions;
using runtime::FinishReason;

std::unique_ptr<Engine> tiny_engine(const std::string& preset = "tiny-glm4.5-air",
                                    const std::string& dtype = "nvfp4") {
  EngineOptions o;
  o.max_batch = 4;
  o.max_context = 64;
  o.kv_block_size = 4;
  return Engine::load(test::tiny_model(preset, dtype), o);
}

ops::SamplingParams greedy() {
  ops::SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

std::vector<int32_t> generate_alone(const std::vector<int32_t>& prompt, int n,
                                    const ops::SamplingParams& params) {
  auto e = tiny_engine();
  const int64_t id = e->add_request(prompt, params, n);
  e->run_to_completion();
  return e->request(id).output;
}

TEST(Engine, GreedyStopsAtMaxNewTokens) {
  auto e = tiny_engine();
  const int64_t id = e->add_request(test::test_prompt(5, e->config().vocab_size, 1), greedy(), 9);
  std::vector<int32_t> streamed;
  while (e->has_work())
    for (const runtime::TokenEvent& ev : e->step()) {
      EXPECT_EQ(ev.request, id);
      streamed.push_back(ev.token);
      EXPECT_EQ(ev.finish == FinishReason::Length, streamed.size() == 9u);
    }
  EXPECT_EQ(streamed.size(), 9u);
  EXPECT_EQ(e->request(id).output, streamed);
  EXPECT_EQ(e->request(id).finish, FinishReason::Length);
  EXPECT_EQ(e->stats().prefill_tokens, 5);
  EXPECT_EQ(e->stats().decode_steps, 8);  // the first token comes from the prefill
}

TEST(Engine, StopsAtAStopToken) {
  const std::vector<int32_t> prompt = test::test_prompt(6, 512, 2);
  const std::vector<int32_t> free_run = generate_alone(prompt, 12, greedy());
  ASSERT_EQ(free_run.size(), 12u);
  const int32_t stop = free_run[4];
  size_t first = 0;
  while (free_run[first] != stop) ++first;
  auto e = tiny_engine();
  const int64_t id = e->add_request(prompt, greedy(), 12, {stop});
  e->run_to_completion();
  EXPECT_EQ(e->request(id).finish, FinishReason::Stop);
  EXPECT_EQ(e->request(id).output,
            std::vector<int32_t>(free_run.begin(), free_run.begin() + long(first) + 1));
}

TEST(Engine, GreedyMatchesArgmaxOfScoredLogits) {
  // Two independent paths: the engine samples (temperature 0) through ops::sample_cpu per
  // step; score() runs the same model and takes a host argmax.
  const std::vector<int32_t> prompt = test::test_prompt(7, 512, 3);
  const std::vector<int32_t> engine_tokens = generate_alone(prompt, 10, greedy());
  auto e = tiny_engine();
  std::vector<std::vector<int32_t>> gen;
  const auto logits = e->score({prompt}, 9, &gen);
  ASSERT_EQ(logits.size(), 1u);
  EXPECT_EQ(logits[0].size(), size_t(7 + 9) * 512);
  ASSERT_EQ(gen[0].size(), 9u);
  EXPECT_EQ(std::vector<int32_t>(engine_tokens.begin(), engine_tokens.begin() + 9), gen[0]);
}

TEST(Engine, ConcurrentRequestsEqualEachAlone) {
  const std::vector<std::vector<int32_t>> prompts = {test::test_prompt(3, 512, 4),
                                                     test::test_prompt(11, 512, 5),
                                                     test::test_prompt(6, 512, 6)};
  ops::SamplingParams sampled;
  sampled.temperature = 0.8f;
  sampled.top_k = 50;
  sampled.seed = 1234;
  auto e = tiny_engine();
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i)
    ids.push_back(e->add_request(prompts[i], i == 1 ? sampled : greedy(), 8 + int(i)));
  // A late arrival joins while the others decode.
  e->step();
  e->step();
  const int64_t late = e->add_request(prompts[0], sampled, 5);
  e->run_to_completion();
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(e->request(ids[i]).output,
              generate_alone(prompts[i], 8 + int(i), i == 1 ? sampled : greedy()))
        << "request " << i;
  EXPECT_EQ(e->request(late).output, generate_alone(prompts[0], 5, sampled));
}

TEST(Engine, RefusesBadRequests) {
  auto e = tiny_engine();
  EXPECT_THROW(e->add_request({}, greedy(), 4), Error);
  EXPECT_THROW(e->add_request({1, 512}, greedy(), 4), Error);  // vocab is 512
  EXPECT_THROW(e->add_request({1, -1}, greedy(), 4), Error);
  EXPECT_THROW(e->add_request({1, 2}, greedy(), 0), Error);
  EXPECT_THROW(e->add_request(test::test_prompt(60, 512, 7), greedy(), 5), Error);  // > 64
  ops::SamplingParams bad;
  bad.top_p = 0.0f;
  EXPECT_THROW(e->add_request({1, 2}, bad, 4), Error);
  EXPECT_FALSE(e->has_work());
}

// A context past the model's positions is refused before anything is sized for it (a billion
// tokens used to end in std::bad_alloc); the model's own limit loads.
TEST(Engine, RefusesAContextPastTheModelsPositions) {
  const auto dir = test::tiny_model("tiny-glm4.5-air", "nvfp4");
  const int64_t limit = load_model_config(dir).context_limit();
  ASSERT_EQ(limit, 4096);
  EngineOptions o;
  o.max_batch = 1;
  o.kv_block_size = 16;
  for (int ctx : {4097, 1000000000}) {
    o.max_context = ctx;
    try {
      Engine::load(dir, o);
      ADD_FAILURE() << "a context of " << ctx << " tokens was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("over the model's 4096 positions"), std::string::npos)
          << e.what();
    }
  }
  o.max_context = 4096;
  EXPECT_NO_THROW(Engine::load(dir, o));
}

TEST(Engine, MoreRequestsThanBatchAllFinish) {
  auto e = tiny_engine();
  std::vector<int64_t> ids;
  for (int i = 0; i < 7; ++i)
    ids.push_back(e->add_request(test::test_prompt(2 + i, 512, 10 + uint32_t(i)), greedy(), 3));
  e->run_to_completion();
  for (int64_t id : ids) {
    EXPECT_EQ(e->request(id).output.size(), 3u);
    EXPECT_EQ(e->request(id).finish, FinishReason::Length);
  }
}

}  // namespace
}  // namespace tetra
