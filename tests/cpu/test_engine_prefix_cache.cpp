// Prefix caching in the engine (CPU backend, tiny models): requests that share a prefix with
// earlier ones (the same prompt, a common system prompt, a later chat turn holding an earlier
// answer) skip the cached blocks' prefill and generate exactly what an engine without prefix
// caching generates, GQA and MLA alike, also under preemption; prompt logprobs never come from
// the cache; the KV pool is whole again at the end.
#include <gtest/gtest.h>

#include <random>

#include "model_fixture.h"
#include "runtime/engine.h"

namespace tetra {
namespace {

using runtime::Engine;

std::unique_ptr<Engine> engine(bool prefix_caching, const char* preset = "tiny-glm4.5-air", int kv_blocks = 0) {
  runtime::EngineOptions o;
  o.max_batch = 4;
  o.max_context = 96;
  o.kv_block_size = 4;
  o.kv_num_blocks = kv_blocks;
  o.prefix_caching = prefix_caching;
  return Engine::load(test::tiny_model(preset, "nvfp4"), o);
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Job {
  std::vector<int32_t> prompt;
  ops::SamplingParams params;
  int max_new = 8;
};

// Runs `waves` of jobs (each wave submitted together, run to completion before the next);
// returns every job's output in order.
std::vector<std::vector<int32_t>> run_waves(Engine& e, const std::vector<std::vector<Job>>& waves) {
  std::vector<std::vector<int32_t>> outs;
  for (const std::vector<Job>& wave : waves) {
    std::vector<int64_t> ids;
    for (const Job& j : wave) ids.push_back(e.add_request(j.prompt, j.params, j.max_new));
    e.run_to_completion();
    for (int64_t id : ids) outs.push_back(e.request(id).output);
  }
  return outs;
}

class EnginePrefixCache : public ::testing::TestWithParam<const char*> {};

TEST_P(EnginePrefixCache, SharedPrefixesGiveTheSameTokensForLessPrefill) {
  const std::vector<int32_t> system = test::test_prompt(37, 512, 81);
  const std::vector<int32_t> q1 = concat(system, test::test_prompt(6, 512, 82));
  const std::vector<int32_t> q2 = concat(system, test::test_prompt(9, 512, 83));
  const std::vector<std::vector<Job>> waves = {
      {{q1, test::sampling(0, 0)}},
      {{q1, test::sampling(0, 0)}, {q2, test::sampling(0.8f, 5)}, {q2, test::sampling(0.8f, 6)}},
  };
  auto off = engine(false, GetParam());
  auto on = engine(true, GetParam());
  const auto want = run_waves(*off, waves);
  EXPECT_EQ(run_waves(*on, waves), want);
  // Wave 2: q1 again (its 44 - 1 tokens hold 10 full blocks of 4), q2 (the 37-token system
  // prompt: 9 full blocks), and q2 again a step later (all of the first q2's 45 - 1: 11 blocks).
  EXPECT_EQ(on->stats().prefix_cached_tokens, 40 + 36 + 44);
  EXPECT_EQ(off->stats().prefix_cached_tokens, 0);
  EXPECT_EQ(on->stats().prefill_tokens + on->stats().prefix_cached_tokens, off->stats().prefill_tokens);
  EXPECT_EQ(on->kv_blocks_used(), 0);
}

// n samples of one prompt submitted together: the first prefills it, the others wait one step
// and take its blocks from the cache.
TEST_P(EnginePrefixCache, SamplesSubmittedTogetherSharePrefill) {
  const std::vector<int32_t> prompt = test::test_prompt(40, 512, 88);
  std::vector<Job> wave;
  for (uint64_t i = 0; i < 3; ++i) wave.push_back({prompt, test::sampling(1.0f, 60 + i)});
  auto on = engine(true, GetParam());
  auto off = engine(false, GetParam());
  EXPECT_EQ(run_waves(*on, {wave}), run_waves(*off, {wave}));
  EXPECT_EQ(on->stats().prefix_cached_tokens, 2 * 36);  // 39 tokens before the last: 9 blocks of 4
  EXPECT_EQ(on->stats().prefill_tokens, 40 + 2 * 4);
}

TEST_P(EnginePrefixCache, ALaterTurnReusesTheEarlierAnswer) {
  const std::vector<int32_t> turn1 = test::test_prompt(13, 512, 84);
  auto on = engine(true, GetParam());
  auto off = engine(false, GetParam());
  const std::vector<int32_t> answer = run_waves(*on, {{{turn1, test::sampling(0, 0), 12}}})[0];
  ASSERT_EQ(answer, run_waves(*off, {{{turn1, test::sampling(0, 0), 12}}})[0]);
  // The next turn: the conversation so far plus a new question. Its KV up to the answer's last
  // written token (the last sampled one was never fed back) is cached, decode blocks included.
  const std::vector<int32_t> turn2 = concat(concat(turn1, answer), test::test_prompt(5, 512, 85));
  const int64_t before = on->stats().prefix_cached_tokens;
  EXPECT_EQ(run_waves(*on, {{{turn2, test::sampling(0.7f, 9)}}}), run_waves(*off, {{{turn2, test::sampling(0.7f, 9)}}}));
  EXPECT_EQ(on->stats().prefix_cached_tokens - before, ((13 + 12 - 1) / 4) * 4);
}

TEST_P(EnginePrefixCache, SmallPoolWithPreemptionGivesTheSameTokens) {
  const std::vector<int32_t> system = test::test_prompt(11, 512, 86);
  std::vector<Job> wave;
  for (int i = 0; i < 4; ++i)
    wave.push_back({concat(system, test::test_prompt(3 + i, 512, 90 + uint32_t(i))), test::sampling(i % 2 ? 0.9f : 0.0f, 40 + uint64_t(i)), 18});
  auto off = engine(false, GetParam(), 16);
  auto on = engine(true, GetParam(), 16);
  EXPECT_EQ(run_waves(*on, {wave, wave}), run_waves(*off, {wave, wave}));
  EXPECT_GT(on->stats().preemptions + off->stats().preemptions, 0);
  EXPECT_GT(on->stats().prefix_cached_tokens, 0);
  EXPECT_EQ(on->kv_blocks_used(), 0);
}

TEST_P(EnginePrefixCache, PromptLogprobsAreNeverCached) {
  const std::vector<int32_t> prompt = test::test_prompt(21, 512, 87);
  auto on = engine(true, GetParam());
  run_waves(*on, {{{prompt, test::sampling(0, 0), 2}}});
  const int64_t before = on->stats().prefix_cached_tokens;
  const int64_t id = on->add_request(prompt, test::sampling(0, 0), 2, {}, {.logprobs = {1, true}});
  on->run_to_completion();
  EXPECT_EQ(on->stats().prefix_cached_tokens, before);
  auto off = engine(false, GetParam());
  const int64_t ref = off->add_request(prompt, test::sampling(0, 0), 2, {}, {.logprobs = {1, true}});
  off->run_to_completion();
  const auto& got = on->request(id).prompt_logprobs;
  const auto& want = off->request(ref).prompt_logprobs;
  ASSERT_EQ(got.size(), want.size());
  for (size_t p = 0; p < got.size(); ++p) EXPECT_FLOAT_EQ(got[p].logprob, want[p].logprob) << p;
}

// Random workloads: requests drawn from a few shared prefixes, arriving in waves while earlier
// ones still run, some with biases, minimum lengths, stop ids or logprobs, in a pool small
// enough to preempt. Every output equals the one without prefix caching, and the pool ends whole.
TEST_P(EnginePrefixCache, RandomWorkloadsMatchTheEngineWithoutIt) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    std::vector<std::vector<int32_t>> prefixes;
    for (uint32_t k = 0; k < 3; ++k) prefixes.push_back(test::test_prompt(5 + int(rng() % 20), 512, seed * 10 + k));
    struct Request {
      std::vector<int32_t> prompt;
      ops::SamplingParams params;
      int max_new;
      std::vector<int32_t> stops;
      runtime::RequestExtras extras;
      int wave;
    };
    std::vector<Request> reqs;
    for (int i = 0; i < 14; ++i) {
      Request r;
      r.prompt = concat(prefixes[rng() % 3], test::test_prompt(1 + int(rng() % 9), 512, seed * 100 + uint32_t(i)));
      r.params = test::sampling(rng() % 2 ? 0.0f : 0.9f, 1000 + uint64_t(i));
      r.max_new = 4 + int(rng() % 12);
      if (rng() % 3 == 0) r.stops = {int32_t(rng() % 512), int32_t(rng() % 512)};
      if (rng() % 4 == 0) r.extras.logit_bias = {{int32_t(rng() % 512), 2.5f}, {int32_t(rng() % 512), -100.0f}};
      if (rng() % 4 == 0) r.extras.min_tokens = int(rng() % 4);
      if (rng() % 5 == 0) r.extras.logprobs = {1, rng() % 2 == 0};
      r.wave = i / 4;
      reqs.push_back(std::move(r));
    }
    auto run_all = [&](bool prefix_caching, int64_t* cached) {
      auto e = engine(prefix_caching, GetParam(), 20);
      std::vector<int64_t> ids;
      for (int wave = 0; wave <= reqs.back().wave; ++wave) {
        for (const Request& r : reqs)
          if (r.wave == wave) ids.push_back(e->add_request(r.prompt, r.params, r.max_new, r.stops, r.extras));
        for (int s = 0; s < 3 && e->has_work(); ++s) e->step();  // the next wave arrives mid-run
      }
      e->run_to_completion();
      EXPECT_EQ(e->kv_blocks_used(), 0);
      *cached = e->stats().prefix_cached_tokens;
      std::vector<std::vector<int32_t>> outs;
      for (int64_t id : ids) outs.push_back(e->request(id).output);
      return outs;
    };
    int64_t cached_on = 0, cached_off = 0;
    EXPECT_EQ(run_all(true, &cached_on), run_all(false, &cached_off)) << "seed " << seed;
    EXPECT_GT(cached_on, 0) << "seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(TinyPresets, EnginePrefixCache, ::testing::Values("tiny-glm4.5-air", "tiny-deepseek-v3", "tiny-qwen3-30b-a3b", "tiny-glm5"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

}  // namespace
}  // namespace tetra
