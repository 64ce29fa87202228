// Logprobs from the engine (CPU backend, tiny models): each generated token's logprob and top
// alternatives equal a log-softmax written out here over score()'s logits for the same positions;
// the prompt's logprobs likewise, also when the prompt is prefilled in chunks, when its rows
// exceed one step's read-back budget (kPromptLogprobRowsPerStep) and after preemption; asking for
// logprobs does not change the tokens drawn.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "model_fixture.h"
#include "runtime/engine.h"

namespace tetra {
namespace {

using runtime::Engine;
using runtime::EngineOptions;
using runtime::LogprobOptions;
using runtime::RequestExtras;

std::unique_ptr<Engine> engine(int max_context = 64, int max_prefill = 0, int kv_blocks = 0,
                               const char* preset = "tiny-glm4.5-air") {
  EngineOptions o;
  o.max_batch = 4;
  o.max_context = max_context;
  o.max_prefill_tokens = max_prefill;
  o.kv_block_size = 4;
  o.kv_num_blocks = kv_blocks;
  return Engine::load(test::tiny_model(preset, "nvfp4"), o);
}

ops::SamplingParams greedy() { return test::sampling(0); }

ops::SamplingParams seeded(uint64_t seed) {
  ops::SamplingParams p = test::sampling(0.8f, seed);
  p.top_k = 50;
  return p;
}

// Checks lp against log-softmax(row) for `token` and its `top` best (lowest id first on ties).
void expect_logprobs(const ops::PositionLogprobs& lp, const float* row, int64_t vocab, int32_t token,
                     int top, const std::string& where) {
  double peak = row[0];
  for (int64_t i = 0; i < vocab; ++i) peak = std::max(peak, double(row[i]));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - peak);
  auto logprob = [&](int64_t i) { return double(row[i]) - peak - std::log(sum); };
  EXPECT_NEAR(lp.logprob, logprob(token), 1e-4) << where;
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
  ASSERT_EQ(lp.top.size(), size_t(top)) << where;
  for (int k = 0; k < top; ++k) {
    EXPECT_EQ(lp.top[size_t(k)].token, order[size_t(k)]) << where << " rank " << k;
    EXPECT_NEAR(lp.top[size_t(k)].logprob, logprob(order[size_t(k)]), 1e-4) << where << " rank " << k;
  }
}

// [P + steps, vocab] logits of the prompt and of `generated` fed back, from a fresh engine.
std::vector<float> scored(const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated,
                          int max_context) {
  auto e = engine(max_context);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), generated.begin(), generated.end());
  return e->score({all}, 0)[0];
}

TEST(EngineLogprobs, GeneratedTokensAreTheLogSoftmaxOfTheirLogits) {
  auto e = engine();
  const int64_t V = e->config().vocab_size;
  const std::vector<int32_t> prompt = test::test_prompt(6, V, 31);
  const int64_t id = e->add_request(prompt, seeded(5), 8, {}, RequestExtras{.logprobs = {3, false}});
  std::vector<runtime::TokenEvent> events;
  while (e->has_work())
    for (runtime::TokenEvent& ev : e->step()) events.push_back(ev);
  const std::vector<int32_t>& out = e->request(id).output;
  ASSERT_EQ(events.size(), 8u);
  EXPECT_TRUE(e->request(id).prompt_logprobs.empty());
  const std::vector<float> logits = scored(prompt, out, 64);
  for (size_t k = 0; k < events.size(); ++k) {
    ASSERT_TRUE(events[k].logprobs.has_value());
    const float* row = logits.data() + (prompt.size() - 1 + k) * size_t(V);
    expect_logprobs(*events[k].logprobs, row, V, out[k], 3, "token " + std::to_string(k));
  }
}

TEST(EngineLogprobs, AskingForThemLeavesTheTokensAsTheyWere) {
  const std::vector<int32_t> prompt = test::test_prompt(9, 512, 32);
  for (const ops::SamplingParams& params : {greedy(), seeded(11), seeded(12)}) {
    std::vector<std::vector<int32_t>> outs;
    for (LogprobOptions lp : {LogprobOptions{}, LogprobOptions{0, false}, LogprobOptions{5, true}}) {
      auto e = engine();
      const int64_t id = e->add_request(prompt, params, 10, {}, {.logprobs = lp});
      e->run_to_completion();
      outs.push_back(e->request(id).output);
    }
    EXPECT_EQ(outs[0], outs[1]);
    EXPECT_EQ(outs[0], outs[2]);  // first token drawn on the host (prompt rows read back)
  }
}

// Prompt logprobs for prompts of `lengths`, submitted together to an engine of those limits.
void check_prompt_logprobs(const std::vector<int>& lengths, int max_context, int max_prefill,
                           int kv_blocks, int max_new = 6, int* preemptions = nullptr) {
  auto e = engine(max_context, max_prefill, kv_blocks);
  const int64_t V = e->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> ids;
  for (size_t i = 0; i < lengths.size(); ++i) {
    prompts.push_back(test::test_prompt(lengths[i], V, uint32_t(40 + i)));
    ids.push_back(e->add_request(prompts.back(), greedy(), max_new, {}, RequestExtras{.logprobs = {2, true}}));
  }
  std::vector<bool> first_seen(ids.size(), false);
  while (e->has_work())
    for (const runtime::TokenEvent& ev : e->step()) {
      const size_t i = size_t(std::find(ids.begin(), ids.end(), ev.request) - ids.begin());
      if (first_seen[i]) continue;
      first_seen[i] = true;  // complete by the first token: checked then, and again at the end
      const std::vector<ops::PositionLogprobs>& lps = e->request(ev.request).prompt_logprobs;
      ASSERT_EQ(lps.size(), prompts[i].size() - 1);
      for (const ops::PositionLogprobs& lp : lps) EXPECT_EQ(lp.top.size(), 2u) << "prompt " << i;
    }
  if (preemptions) *preemptions = int(e->stats().preemptions);
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::vector<float> logits = scored(prompts[i], {}, max_context);
    const std::vector<ops::PositionLogprobs>& lps = e->request(ids[i]).prompt_logprobs;
    ASSERT_EQ(lps.size(), prompts[i].size() - 1);
    for (size_t p = 0; p + 1 < prompts[i].size(); ++p)
      expect_logprobs(lps[p], logits.data() + p * size_t(V), V, prompts[i][p + 1], 2,
                      "prompt " + std::to_string(i) + " position " + std::to_string(p));
  }
}

TEST(EngineLogprobs, PromptLogprobsInOnePrefill) { check_prompt_logprobs({1, 2, 17}, 64, 0, 0); }

TEST(EngineLogprobs, PromptLogprobsOverChunkedPrefills) { check_prompt_logprobs({37, 12, 29}, 64, 8, 0); }

TEST(EngineLogprobs, PromptLogprobsPastOneStepsReadBackBudget) {
  // 300 + 270 prompt rows over a 256-row budget per step: three steps, the second prompt waiting.
  check_prompt_logprobs({301, 271}, 320, 0, 0);
}

TEST(EngineLogprobs, PromptLogprobsSurvivePreemption) {
  int preemptions = 0;
  // Each needs 7-9 blocks of 4 over its life, the pool has 12; prefills in chunks of 8.
  check_prompt_logprobs({14, 11, 15, 9}, 64, 8, 12, 20, &preemptions);
  EXPECT_GT(preemptions, 0);
}

TEST(EngineLogprobs, RefusesBadOptions) {
  auto e = engine();
  const std::vector<int32_t> prompt = test::test_prompt(4, 512, 33);
  EXPECT_THROW(e->add_request(prompt, greedy(), 2, {}, RequestExtras{.logprobs = {ops::kMaxTopLogprobs + 1, false}}), Error);
  EXPECT_THROW(e->add_request(prompt, greedy(), 2, {}, RequestExtras{.logprobs = {-2, false}}), Error);
  EXPECT_THROW(e->add_request(prompt, greedy(), 2, {}, RequestExtras{.logprobs = {-1, true}}), Error);
  EXPECT_FALSE(e->has_work());
}

}  // namespace
}  // namespace tetra
