// Token biases and a minimum length in the engine (CPU backend, tiny model): greedy picks follow
// the biased logits written out here over score()'s rows; +100 forces a token and -100 bans a
// set even at a high temperature; logprobs stay those of the raw logits; min_tokens keeps the
// stop ids out until then; a batch that mixes biased and plain rows leaves the plain ones as they
// are alone; bad values are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "model_fixture.h"
#include "runtime/engine.h"

namespace tetra {
namespace {

using runtime::Engine;
using runtime::RequestExtras;

std::unique_ptr<Engine> engine() {
  runtime::EngineOptions o;
  o.max_batch = 4;
  o.max_context = 64;
  o.kv_block_size = 4;
  return Engine::load(test::tiny_model("tiny-glm4.5-air", "nvfp4"), o);
}

std::vector<int32_t> run(const std::vector<int32_t>& prompt, const ops::SamplingParams& params, int n,
                         RequestExtras extras, std::vector<int32_t> stop_ids = {},
                         std::vector<runtime::TokenEvent>* events = nullptr) {
  auto e = engine();
  const int64_t id = e->add_request(prompt, params, n, std::move(stop_ids), std::move(extras));
  while (e->has_work())
    for (const runtime::TokenEvent& ev : e->step())
      if (events) events->push_back(ev);
  return e->request(id).output;
}

TEST(EngineLogitBias, GreedyFollowsTheBiasedLogits) {
  const std::vector<int32_t> prompt = test::test_prompt(7, 512, 61);
  const std::vector<int32_t> plain = run(prompt, test::sampling(0), 8, {});
  // Bias the runner-up of the first step's choice up and the choice down: the path changes.
  auto e = engine();
  const std::vector<float> first = e->score({prompt}, 0)[0];
  const float* row0 = first.data() + (prompt.size() - 1) * 512;
  std::vector<int32_t> order(512);
  for (int i = 0; i < 512; ++i) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row0[a] > row0[b]; });
  ASSERT_EQ(order[0], plain[0]);
  const std::vector<std::pair<int32_t, float>> bias = {{order[0], -5.0f}, {order[1], 3.0f}, {order[7], 2.5f}};
  const std::vector<int32_t> biased = run(prompt, test::sampling(0), 8, {.logit_bias = bias});
  EXPECT_NE(biased, plain);
  // Each biased pick is the argmax (lowest id on ties) of its raw row plus the biases.
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), biased.begin(), biased.end());
  const std::vector<float> rows = e->score({all}, 0)[0];
  for (size_t k = 0; k < biased.size(); ++k) {
    std::vector<float> row(rows.begin() + int64_t((prompt.size() - 1 + k) * 512),
                           rows.begin() + int64_t((prompt.size() + k) * 512));
    for (const auto& [t, b] : bias) row[size_t(t)] += b;
    EXPECT_EQ(biased[k], int32_t(std::max_element(row.begin(), row.end()) - row.begin())) << "step " << k;
  }
}

TEST(EngineLogitBias, PlusHundredForcesMinusHundredBans) {
  const std::vector<int32_t> prompt = test::test_prompt(5, 512, 62);
  for (float temperature : {0.0f, 1.0f, 1.8f}) {
    const std::vector<int32_t> forced = run(prompt, test::sampling(temperature, 3), 10, {.logit_bias = {{77, 100.0f}}});
    EXPECT_EQ(forced, std::vector<int32_t>(10, 77)) << "temperature " << temperature;
  }
  std::vector<std::pair<int32_t, float>> ban;
  for (int32_t t = 0; t < 512; t += 2) ban.emplace_back(t, -100.0f);  // every even id
  const std::vector<int32_t> odd = run(prompt, test::sampling(1.8f, 4), 40, {.logit_bias = ban});
  ASSERT_EQ(odd.size(), 40u);
  for (int32_t t : odd) EXPECT_EQ(t % 2, 1) << t;
  const std::vector<int32_t> free_run = run(prompt, test::sampling(1.8f, 4), 40, {});
  EXPECT_TRUE(std::any_of(free_run.begin(), free_run.end(), [](int32_t t) { return t % 2 == 0; }));
}

TEST(EngineLogitBias, LogprobsStayThoseOfTheRawLogits) {
  const std::vector<int32_t> prompt = test::test_prompt(6, 512, 63);
  std::vector<runtime::TokenEvent> events;
  const std::vector<int32_t> out =
      run(prompt, test::sampling(0), 4, {.logprobs = {0, false}, .logit_bias = {{200, 100.0f}}}, {}, &events);
  ASSERT_EQ(out, std::vector<int32_t>(4, 200));
  auto e = engine();
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out.begin(), out.end());
  const std::vector<float> rows = e->score({all}, 0)[0];
  for (size_t k = 0; k < 4; ++k) {
    const float* row = rows.data() + (prompt.size() - 1 + k) * 512;
    double peak = row[0], sum = 0;
    for (int i = 0; i < 512; ++i) peak = std::max(peak, double(row[i]));
    for (int i = 0; i < 512; ++i) sum += std::exp(double(row[i]) - peak);
    ASSERT_TRUE(events[k].logprobs.has_value());
    EXPECT_NEAR(events[k].logprobs->logprob, double(row[200]) - peak - std::log(sum), 1e-4) << k;
    EXPECT_LT(events[k].logprobs->logprob, -0.5) << "the bias must not leak into the logprob";
  }
}

TEST(EngineLogitBias, MinTokensKeepsTheStopIdsOut) {
  const std::vector<int32_t> prompt = test::test_prompt(8, 512, 64);
  const std::vector<int32_t> plain = run(prompt, test::sampling(0), 12, {});
  // Stopping on the greedy run's first and third tokens ends it at once...
  const std::vector<int32_t> stops = {plain[0], plain[2]};
  EXPECT_EQ(run(prompt, test::sampling(0), 12, {}, stops).size(), 1u);
  // ...unless they may not come before 5 tokens.
  const std::vector<int32_t> held = run(prompt, test::sampling(0), 12, {.min_tokens = 5}, stops);
  ASSERT_GE(held.size(), 5u);
  for (size_t k = 0; k < 5; ++k)
    EXPECT_TRUE(std::find(stops.begin(), stops.end(), held[k]) == stops.end()) << "token " << k;
  if (held.size() < 12) EXPECT_TRUE(std::find(stops.begin(), stops.end(), held.back()) != stops.end());
}

TEST(EngineLogitBias, PlainRowsBesideBiasedOnesAreAsAlone) {
  auto e = engine();
  const std::vector<int32_t> p1 = test::test_prompt(9, 512, 65), p2 = test::test_prompt(4, 512, 66);
  const int64_t a = e->add_request(p1, test::sampling(0.9f, 21), 10);
  const int64_t b = e->add_request(p2, test::sampling(0.9f, 22), 10, {}, {.logit_bias = {{5, 4.0f}}});
  e->run_to_completion();
  EXPECT_EQ(e->request(a).output, run(p1, test::sampling(0.9f, 21), 10, {}));
  EXPECT_EQ(e->request(b).output, run(p2, test::sampling(0.9f, 22), 10, {.logit_bias = {{5, 4.0f}}}));
}

TEST(EngineLogitBias, RefusesBadValues) {
  auto e = engine();
  const std::vector<int32_t> p = test::test_prompt(4, 512, 67);
  EXPECT_THROW(e->add_request(p, test::sampling(0), 3, {}, {.logit_bias = {{512, 1.0f}}}), Error);
  EXPECT_THROW(e->add_request(p, test::sampling(0), 3, {}, {.logit_bias = {{-1, 1.0f}}}), Error);
  EXPECT_THROW(e->add_request(p, test::sampling(0), 3, {}, {.logit_bias = {{3, 100.5f}}}), Error);
  EXPECT_THROW(e->add_request(p, test::sampling(0), 3, {}, {.logit_bias = {{3, std::nanf("")}}}), Error);
  std::vector<std::pair<int32_t, float>> many(size_t(ops::kMaxLogitBias) + 1, {1, 1.0f});
  EXPECT_THROW(e->add_request(p, test::sampling(0), 3, {}, {.logit_bias = many}), Error);
  EXPECT_THROW(e->add_request(p, test::sampling(0), 3, {}, {.min_tokens = 4}), Error);
  EXPECT_THROW(e->add_request(p, test::sampling(0), 3, {}, {.min_tokens = -1}), Error);
  EXPECT_FALSE(e->has_work());
}

}  // namespace
}  // namespace tetra
