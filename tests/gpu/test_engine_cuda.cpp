// Engine features on the CUDA backend, same tiny checkpoint as the CPU backend.
// Logprobs: the step's logits read back from the device (read_logits), for generated tokens and
// for a prompt longer than one step's read-back budget (kPromptLogprobRowsPerStep). Bound, per
// position: logprob = z_t - logsumexp(z), so |logprob_gpu - logprob_cpu| <= 2 max_i |z_gpu,i -
// z_cpu,i| for the backends' logits z of that position (score(), one prefill), plus 0.02 for the
// prefill being cut in two steps here (bf16 rounding of the other chunk's KV). A row read from the
// wrong position or a wrong log-partition breaks it by the logits' spread, not by their error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/cuda_check.h"
#include "model/cuda/cuda_model_ops.h"
#include "model_twin.h"
#include "runtime/engine.h"

namespace tetra {
namespace {

struct BackendRun {
  std::vector<float> logits;  // [prompt, vocab] score() of the prompt
  std::vector<int32_t> output;
  std::vector<ops::PositionLogprobs> logprobs, prompt_logprobs;
};

BackendRun run(const std::filesystem::path& dir, const std::string& backend,
               const std::vector<int32_t>& prompt) {
  model::cuda::link_cuda_model_ops();  // the engine finds backends by name: keep "cuda" linked
  runtime::EngineOptions o;
  o.backend = backend;
  o.max_batch = 2;
  o.max_context = 512;
  auto e = runtime::Engine::load(dir, o);
  BackendRun r;
  r.logits = e->score({prompt}, 0)[0];
  ops::SamplingParams greedy;
  greedy.temperature = 0.0f;
  const int64_t id = e->add_request(prompt, greedy, 4, {}, runtime::RequestExtras{.logprobs = {5, true}});
  while (e->has_work())
    for (const runtime::TokenEvent& ev : e->step()) r.logprobs.push_back(*ev.logprobs);
  r.output = e->request(id).output;
  r.prompt_logprobs = e->request(id).prompt_logprobs;
  return r;
}

TEST(EngineCuda, LogprobsMatchTheCpuBackend) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto dir = model::test_twin::tiny_checkpoint("engine-logprobs", "tiny-glm4.5-air", "nvfp4", 17);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 300; ++i) prompt.push_back(int32_t((i * 7919 + 13) % 500));
  const BackendRun cpu = run(dir, "cpu", prompt);
  const BackendRun gpu = run(dir, "cuda", prompt);
  const size_t V = cpu.logits.size() / prompt.size();
  ASSERT_EQ(cpu.prompt_logprobs.size(), prompt.size() - 1);
  ASSERT_EQ(gpu.prompt_logprobs.size(), prompt.size() - 1);
  double worst = 0, worst_bound = 0, spread = 0;
  for (size_t p = 0; p + 1 < prompt.size(); ++p) {
    double dz = 0;
    for (size_t i = 0; i < V; ++i) dz = std::max(dz, double(std::abs(gpu.logits[p * V + i] - cpu.logits[p * V + i])));
    const double diff = std::abs(cpu.prompt_logprobs[p].logprob - gpu.prompt_logprobs[p].logprob);
    EXPECT_LE(diff, 2 * dz + 0.02) << "position " << p;
    worst = std::max(worst, diff);
    worst_bound = std::max(worst_bound, 2 * dz + 0.02);
    spread = std::max(spread, double(std::abs(cpu.prompt_logprobs[p].logprob - cpu.prompt_logprobs[p].top[0].logprob)));
    ASSERT_EQ(gpu.prompt_logprobs[p].top.size(), 5u);
  }
  std::printf("prompt logprobs: largest |gpu - cpu| %.4f (bound up to %.4f; logprob spread %.2f)\n", worst,
              worst_bound, spread);
  // Generated: where both chose the same token (near-ties may pick differently), the same bound
  // with the last prompt row's logits difference as a stand-in, and a floor of 0.05.
  ASSERT_EQ(gpu.logprobs.size(), 4u);
  for (size_t k = 0; k < 4 && cpu.output[k] == gpu.output[k]; ++k)
    EXPECT_NEAR(cpu.logprobs[k].logprob, gpu.logprobs[k].logprob, std::max(0.05, worst_bound)) << "token " << k;
}

// Prefix caching on the device: a prompt whose first blocks were cached by an earlier request
// prefills only the rest (through extend_attention) and gives the same first-token logprob as
// with the cache off, within the same bound.
TEST(EngineCuda, PrefixCachedPromptMatchesAWholePrefill) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const auto dir = model::test_twin::tiny_checkpoint("engine-prefix", "tiny-glm4.5-air", "nvfp4", 19);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(int32_t((i * 131 + 7) % 500));
  model::cuda::link_cuda_model_ops();
  auto first_token = [&](bool prefix_caching, int64_t* cached) {
    runtime::EngineOptions o;
    o.backend = "cuda";
    o.max_batch = 2;
    o.max_context = 128;
    o.kv_block_size = 16;
    o.prefix_caching = prefix_caching;
    auto e = runtime::Engine::load(dir, o);
    ops::SamplingParams greedy;
    greedy.temperature = 0.0f;
    e->add_request(prompt, greedy, 2);
    e->run_to_completion();
    const int64_t id = e->add_request(prompt, greedy, 1, {}, runtime::RequestExtras{.logprobs = {1, false}});
    runtime::TokenEvent ev;
    while (e->has_work())
      for (const runtime::TokenEvent& x : e->step()) ev = x;
    EXPECT_EQ(ev.request, id);
    *cached = e->stats().prefix_cached_tokens;
    return ev;
  };
  int64_t cached_on = 0, cached_off = 0;
  const runtime::TokenEvent on = first_token(true, &cached_on), off = first_token(false, &cached_off);
  EXPECT_EQ(cached_on, 64);  // 4 blocks of 16 of the 69 tokens before the last
  EXPECT_EQ(cached_off, 0);
  ASSERT_TRUE(on.logprobs && off.logprobs);
  ASSERT_EQ(on.logprobs->top.size(), 1u);
  // The most likely token's logprob: continuous even where a near-tie flips the pick.
  EXPECT_NEAR(on.logprobs->top[0].logprob, off.logprobs->top[0].logprob, 0.05);
}

}  // namespace
}  // namespace tetra
