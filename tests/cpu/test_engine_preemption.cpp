// Preemption by recompute and on-demand KV blocks (CPU backend, tiny model): a KV pool too small
// for all requests at once still completes every request with the output it gets alone (greedy
// and seeded sampling), requests are actually preempted and recomputed, KV usage returns to
// zero, and a request that could not fit even alone is refused at once instead of looping.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model_fixture.h"
#include "runtime/engine.h"

namespace tetra {
namespace {

using runtime::Engine;
using runtime::EngineOptions;
using runtime::FinishReason;

std::unique_ptr<Engine> engine_with_blocks(int kv_blocks, int max_batch = 4,
                                           const char* preset = "tiny-glm4.5-air") {
  EngineOptions o;
  o.max_batch = max_batch;
  o.max_context = 64;
  o.kv_block_size = 4;
  o.kv_num_blocks = kv_blocks;  // 0: max_batch full contexts (nothing is ever preempted)
  return Engine::load(test::tiny_model(preset, "nvfp4"), o);
}

ops::SamplingParams greedy() {
  ops::SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

ops::SamplingParams seeded(uint64_t seed) {
  ops::SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 40;
  p.seed = seed;
  return p;
}

struct Job {
  std::vector<int32_t> prompt;
  ops::SamplingParams params;
  int max_new = 0;
};

std::vector<int32_t> alone(const Job& j, const char* preset = "tiny-glm4.5-air") {
  auto e = engine_with_blocks(0, 1, preset);
  const int64_t id = e->add_request(j.prompt, j.params, j.max_new);
  e->run_to_completion();
  EXPECT_EQ(e->stats().preemptions, 0);
  return e->request(id).output;
}

std::vector<Job> jobs() {
  // Each needs 6-9 blocks of 4 tokens over its life; together ~30, the small pool has 12.
  return {{test::test_prompt(7, 512, 21), greedy(), 20},
          {test::test_prompt(10, 512, 22), seeded(99), 22},
          {test::test_prompt(5, 512, 23), greedy(), 25},
          {test::test_prompt(12, 512, 24), seeded(7), 18}};
}

class EnginePreemptionPreset : public ::testing::TestWithParam<const char*> {};

// GQA (tiny-glm4.5-air) and MLA (tiny-deepseek-v3: one latent cache per layer, recompute
// through the paged extend path).
TEST_P(EnginePreemptionPreset, SmallPoolCompletesEveryRequestAsAlone) {
  const char* preset = GetParam();
  const std::vector<Job> js = jobs();
  auto e = engine_with_blocks(12, 4, preset);
  std::vector<int64_t> ids;
  for (const Job& j : js) ids.push_back(e->add_request(j.prompt, j.params, j.max_new));
  int max_used = 0;
  while (e->has_work()) {
    e->step();
    max_used = std::max(max_used, e->kv_blocks_used());
    ASSERT_LE(e->kv_blocks_used(), 12);
  }
  EXPECT_GT(e->stats().preemptions, 0) << "the pool was meant to be too small for all at once";
  EXPECT_EQ(max_used, 12);
  int64_t prompt_tokens = 0;
  for (const Job& j : js) prompt_tokens += int64_t(j.prompt.size());
  EXPECT_GT(e->stats().prefill_tokens, prompt_tokens) << "preempted requests are prefilled again";
  for (size_t i = 0; i < js.size(); ++i) {
    const auto& st = e->request(ids[i]);
    EXPECT_EQ(st.finish, FinishReason::Length) << "request " << i;
    EXPECT_EQ(st.output, alone(js[i], preset)) << "request " << i;
  }
  EXPECT_EQ(e->kv_blocks_used(), 0);
  EXPECT_EQ(e->num_running(), 0);
  EXPECT_EQ(e->num_waiting(), 0);
}

INSTANTIATE_TEST_SUITE_P(Presets, EnginePreemptionPreset,
                         ::testing::Values("tiny-glm4.5-air", "tiny-deepseek-v3"),
                         [](const auto& i) {
                           std::string n = i.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(EnginePreemption, StreamedTokensMatchTheFinalOutput) {
  // A preempted request must not stream a token twice or skip one.
  const std::vector<Job> js = jobs();
  auto e = engine_with_blocks(10);
  std::map<int64_t, std::vector<int32_t>> streamed;
  std::vector<int64_t> ids;
  for (const Job& j : js) ids.push_back(e->add_request(j.prompt, j.params, j.max_new));
  while (e->has_work())
    for (const runtime::TokenEvent& ev : e->step()) streamed[ev.request].push_back(ev.token);
  EXPECT_GT(e->stats().preemptions, 0);
  for (size_t i = 0; i < js.size(); ++i) {
    EXPECT_EQ(streamed[ids[i]], e->request(ids[i]).output) << "request " << i;
    EXPECT_EQ(streamed[ids[i]], alone(js[i])) << "request " << i;
  }
  EXPECT_EQ(e->kv_blocks_used(), 0);
}

TEST(EnginePreemption, ARequestFillingThePoolAloneCompletes) {
  // 8 blocks x 4 = 32 tokens: exactly prompt + max_new of the first request.
  auto e = engine_with_blocks(8);
  const Job big{test::test_prompt(12, 512, 31), greedy(), 20};
  const Job small{test::test_prompt(3, 512, 32), seeded(5), 6};
  const int64_t a = e->add_request(small.prompt, small.params, small.max_new);
  const int64_t b = e->add_request(big.prompt, big.params, big.max_new);
  e->run_to_completion();
  EXPECT_EQ(e->request(a).output, alone(small));
  EXPECT_EQ(e->request(b).output, alone(big));
  EXPECT_EQ(e->kv_blocks_used(), 0);
}

TEST(EnginePreemption, ARequestThatCannotFitAloneIsRefused) {
  auto e = engine_with_blocks(4);  // 16 tokens of cache
  try {
    e->add_request(test::test_prompt(10, 512, 41), greedy(), 7);
    FAIL() << "a 17-token request was queued on a 16-token cache";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("KV cache"), std::string::npos) << err.what();
  }
  EXPECT_FALSE(e->has_work());
  // 16 tokens exactly fit.
  const int64_t id = e->add_request(test::test_prompt(10, 512, 41), greedy(), 6);
  e->run_to_completion();
  EXPECT_EQ(e->request(id).output.size(), 6u);
  EXPECT_EQ(e->kv_blocks_used(), 0);
}

TEST(EnginePreemption, CancelOfAPreemptedRequestLeavesNoBlocks) {
  const std::vector<Job> js = jobs();
  auto e = engine_with_blocks(12);
  std::vector<int64_t> ids;
  for (const Job& j : js) ids.push_back(e->add_request(j.prompt, j.params, j.max_new));
  while (e->stats().preemptions == 0 && e->has_work()) e->step();
  ASSERT_GT(e->stats().preemptions, 0);
  ASSERT_GT(e->num_waiting(), 0);  // the preempted one waits at the front
  for (int64_t id : ids) e->cancel(id);
  EXPECT_FALSE(e->has_work());
  EXPECT_EQ(e->kv_blocks_used(), 0);
}

}  // namespace
}  // namespace tetra
