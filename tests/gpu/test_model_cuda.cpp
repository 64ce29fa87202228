// The CUDA model backend against the CPU backend on the same tiny checkpoints (every tiny
// preset, GQA and MLA, BF16 and NVFP4), fresh prompts of different lengths in one varlen prefill, then decode
// steps through the paged KV cache; and decode steps replayed as CUDA graphs against the same
// steps run eagerly (with a batch that needs padding to its bucket).
//
// The checkpoints are the tiny presets (GQA head_dim 64, which the CUDA attention kernels take;
// MLA latent 32 + rope 16), written the way `tetra make-model` writes them. The model runs
// tiny-glm5 with dense attention at every length here (the engine caps its context at
// index_topk; these tests drive the model directly).
//
// Bound, CPU vs CUDA: relative L2 error of a logits row <= 2e-2 (the bound against
// transformers), and the same top-1 wherever the CPU's top-1 leads its runner-up by more than
// twice the row's largest absolute difference (elsewhere the two are a tie within rounding).
// Why 2e-2 is enough and not loose: both backends round every activation to bf16 at the same
// points; the differences are the GPU's bf16 MoE intermediate (the CPU keeps float32), bf16 P in
// attention, and float summation order: each ~2^-9 relative per op, a few 1e-3 after 3 layers
// (measured on the H200: 5e-3 .. 9e-3 for the rows below).
// Routing flips on near-tied experts and the row rule over a test: tests/gpu/logit_row_errors.h.
// Graph replay vs eager: the same kernels with the same arguments, so the logits must be
// bit-identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "logit_row_errors.h"
#include "model_twin.h"
#include "bench/decode_bench.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "format/checkpoint.h"
#include "format/presets.h"
#include "model/cpu_model_ops.h"
#include "model/cuda/cuda_model_ops.h"
#include "moe/moe_layer.h"
#include "model/model.h"
#include "model/model_ops.h"
#include "ops/sampling/logprobs.h"
#include "ops/sampling/sampling.h"
#include "runtime/kv_cache.h"

namespace tetra::model {
namespace {

using namespace test_twin;

class ModelCuda : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(ModelCuda, LogitsMatchCpuPrefillThenDecode) {
  const auto [preset, dtype] = GetParam();
  Twin t(tiny_checkpoint("model-cuda", preset, dtype, 11));
  t.add(make_model_ops("cpu"));
  auto cuda_ops = cuda::make_cuda_model_ops_api();
  t.add(std::move(cuda_ops));
  std::mt19937 rng(5);
  const std::vector<int64_t> ids = {1, 2, 3};
  std::vector<std::vector<int32_t>> prompts = {prompt(13, t.vocab(), rng), prompt(1, t.vocab(), rng),
                                               prompt(29, t.vocab(), rng)};
  // Every row's logits in the prefill, not only the last ones.
  StepBatch pre = t.prefill(ids, prompts);
  pre.logit_rows.clear();
  for (int r = 0; r < pre.num_tokens(); ++r) pre.logit_rows.push_back(r);
  auto out = t.run(pre);
  test::LogitRowErrors errors;
  errors.add(out[1], out[0], t.vocab(), preset + " " + dtype + " prefill");
  std::vector<int32_t> next(ids.size());
  for (size_t s = 0; s < ids.size(); ++s)
    next[s] = argmax(out[0].data() + int64_t(pre.cu_seqlens[s + 1] - 1) * t.vocab(), t.vocab());
  for (int step = 0; step < 6; ++step) {
    out = t.run(t.decode(ids, next));
    errors.add(out[1], out[0], t.vocab(),
                        preset + " " + dtype + " decode " + std::to_string(step));
    for (size_t s = 0; s < ids.size(); ++s) next[s] = argmax(out[0].data() + int64_t(s) * t.vocab(), t.vocab());
  }
  errors.expect_within_bounds(preset + " " + dtype, test::flip_share(preset));
}

// Chunked prefill (the engine's long prompts and recompute after preemption): the CUDA extend
// attention path against the CPU backend, every chunk's rows, then decode on top of it.
TEST_P(ModelCuda, ChunkedPrefillMatchesCpu) {
  const auto [preset, dtype] = GetParam();
  Twin t(tiny_checkpoint("model-cuda", preset, dtype, 11));
  t.add(make_model_ops("cpu"));
  t.add(cuda::make_cuda_model_ops_api());
  std::mt19937 rng(8);
  const std::vector<int64_t> ids = {1, 2, 3};
  const std::vector<std::vector<int32_t>> prompts = {
      prompt(41, t.vocab(), rng), prompt(9, t.vocab(), rng), prompt(23, t.vocab(), rng)};
  test::LogitRowErrors errors;
  for (int start = 0; start < 41; start += 7) {
    StepBatch b = t.prefill_chunk(ids, prompts, start, 7);
    ASSERT_TRUE(b.has_cached_prefix());
    b.logit_rows.clear();
    for (int r = 0; r < b.num_tokens(); ++r) b.logit_rows.push_back(r);
    const auto out = t.run(b);
    errors.add(out[1], out[0], t.vocab(), preset + " " + dtype + " chunk at " + std::to_string(start));
  }
  const auto out = t.run(t.decode(ids, {3, 4, 5}));
  errors.add(out[1], out[0], t.vocab(), preset + " " + dtype + " decode after chunks");
  errors.expect_within_bounds(preset + " " + dtype + " chunked", test::flip_share(preset));
}

// One sequence decoding alone (T = 1), where an NVFP4 o_proj adds into the residual and the MoE
// token path normalises (the post-attention norm folded: ModelOps::o_proj_folded_norm_moe):
// against the CPU backend, and against the CUDA backend with the fold off (the norm's own launch;
// equal up to the norm's summation order: at most 1e-3 relative per row). The fold must happen
// for nvfp4 and not for bf16. 40 steps: the CPU bound allows routing flips in 10% of the rows.
// With the defaults the router folds into o_proj too (moe/router_fold.h) for NVFP4 models with
// sigmoid routing: within the CPU bounds, and it must happen exactly there. The next layer's
// input norm folds into q/k/v (CudaOpsOptions::fold_input_norm; here on the streaming GEMV) in
// every CUDA backend of an NVFP4 GQA model, never for BF16 or MLA.
TEST_P(ModelCuda, SingleSequenceDecodeMatchesCpuAndUnfolded) {
  const auto [preset, dtype] = GetParam();
  Twin t(tiny_checkpoint("model-cuda", preset, dtype, 11));
  t.add(make_model_ops("cpu"));
  auto folded = cuda::make_cuda_model_ops_api();  // the post-attention norm only
  folded->set_options({.router_fold = false});
  cuda::CudaModelOpsApi* f = folded.get();
  t.add(std::move(folded));
  auto unfolded = cuda::make_cuda_model_ops_api();
  unfolded->set_options({.fold_post_norm = false});
  cuda::CudaModelOpsApi* u = unfolded.get();
  t.add(std::move(unfolded));
  auto router = cuda::make_cuda_model_ops_api();  // the defaults: the router folded too
  cuda::CudaModelOpsApi* r = router.get();
  t.add(std::move(router));
  std::mt19937 rng(9);
  const std::vector<int64_t> ids = {4};
  auto out = t.run(t.prefill(ids, {prompt(21, t.vocab(), rng)}));
  std::vector<int32_t> next = {argmax(out[0].data(), t.vocab())};
  test::LogitRowErrors vs_cpu, vs_unfolded, router_vs_cpu;
  for (int step = 0; step < 40; ++step) {
    out = t.run(t.decode(ids, next));
    const std::string what = preset + " " + dtype + " decode " + std::to_string(step);
    vs_cpu.add(out[1], out[0], t.vocab(), what);
    vs_unfolded.add(out[1], out[2], t.vocab(), what + " vs unfolded");
    router_vs_cpu.add(out[3], out[0], t.vocab(), what + " router folded");
    next[0] = argmax(out[0].data(), t.vocab());
  }
  vs_cpu.expect_within_bounds(preset + " " + dtype + " single sequence", test::flip_share(preset));
  vs_unfolded.expect_within_bounds(preset + " " + dtype + " folded vs unfolded");
  EXPECT_LE(*std::max_element(vs_unfolded.rel.begin(), vs_unfolded.rel.end()), 1e-3);
  // The router fold rounds differently (moe/router_fold.h): the CPU twin's bounds, not 1e-3.
  router_vs_cpu.expect_within_bounds(preset + " " + dtype + " router folded",
                                     test::flip_share(preset));
  const ModelConfig cfg = preset_config(preset);
  const bool sigmoid = moe::router_params_of(cfg).scoring != moe::Scoring::Softmax;
  if (dtype == "nvfp4" && sigmoid)
    EXPECT_GT(r->folded_routers(), 0);
  else
    EXPECT_EQ(r->folded_routers(), 0);
  EXPECT_EQ(f->folded_routers(), 0);
  if (dtype == "nvfp4")
    EXPECT_GT(f->folded_post_norms(), 0);
  else
    EXPECT_EQ(f->folded_post_norms(), 0);
  EXPECT_EQ(u->folded_post_norms(), 0);
  const bool input_folds = dtype == "nvfp4" && cfg.attention != AttentionKind::MLA;
  for (const cuda::CudaModelOpsApi* b : {f, u, r})
    EXPECT_EQ(b->folded_input_norms() > 0, input_folds);
}

TEST_P(ModelCuda, GraphReplayEqualsEager) {
  const auto [preset, dtype] = GetParam();
  Twin t(tiny_checkpoint("model-cuda", preset, dtype, 11));
  auto eager = cuda::make_cuda_model_ops_api();
  eager->set_options({.graphs = false});
  auto graphed = cuda::make_cuda_model_ops_api();
  cuda::CudaModelOpsApi* g = graphed.get();
  t.add(std::move(eager));
  t.add(std::move(graphed));
  std::mt19937 rng(6);
  const std::vector<int64_t> ids = {1, 2, 3};  // 3 sequences: padded to the bucket of 4
  std::vector<std::vector<int32_t>> prompts = {prompt(5, t.vocab(), rng), prompt(17, t.vocab(), rng),
                                               prompt(2, t.vocab(), rng)};
  t.run(t.prefill(ids, prompts));
  std::vector<int32_t> next = {1, 2, 3};
  for (int step = 0; step < 5; ++step) {
    auto out = t.run(t.decode(ids, next));
    ASSERT_EQ(out[0], out[1]) << preset << " " << dtype << " decode step " << step;
    for (size_t s = 0; s < ids.size(); ++s) next[s] = argmax(out[0].data() + int64_t(s) * t.vocab(), t.vocab());
  }
  // One sequence alone: bucket 1, a second graph.
  auto out = t.run(t.decode({2}, {7}));
  ASSERT_EQ(out[0], out[1]) << "single-sequence decode";
  EXPECT_EQ(g->graphs_captured(), 2);
}

// A decode step's RoPE + KV write inside the attention launch (the default) against the
// rope_and_write_kv launch before it: the same kernels' arithmetic, so the same logits bit for
// bit, step after step (a wrong cache row would show in the steps after it); graphs on, with 3
// sequences padded to the bucket of 4, whose padding row must write nothing.
TEST_P(ModelCuda, RopeInsideAttentionEqualsSeparateLaunch) {
  const auto [preset, dtype] = GetParam();
  Twin t(tiny_checkpoint("model-cuda", preset, dtype, 11));
  t.add(cuda::make_cuda_model_ops_api());
  auto separate = cuda::make_cuda_model_ops_api();
  separate->set_options({.rope_in_attention = false});
  t.add(std::move(separate));
  std::mt19937 rng(9);
  const std::vector<int64_t> ids = {1, 2, 3};
  std::vector<std::vector<int32_t>> prompts = {prompt(21, t.vocab(), rng), prompt(3, t.vocab(), rng),
                                               prompt(16, t.vocab(), rng)};
  t.run(t.prefill(ids, prompts));
  std::vector<int32_t> next = {4, 5, 6};
  for (int step = 0; step < 6; ++step) {
    auto out = t.run(t.decode(ids, next));
    ASSERT_EQ(out[0], out[1]) << preset << " " << dtype << " decode step " << step;
    for (size_t s = 0; s < ids.size(); ++s) next[s] = argmax(out[0].data() + int64_t(s) * t.vocab(), t.vocab());
  }
  auto out = t.run(t.decode({1}, {7}));  // one sequence: bucket 1
  ASSERT_EQ(out[0], out[1]) << "single-sequence decode";
}

// A head_dim the CUDA attention kernels lack is refused at prepare, before anything is uploaded,
// with the reason `tetra check` prints.
TEST(ModelCudaLimits, UnsupportedHeadDimRefusedAtPrepare) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  ModelConfig c = preset_config("tiny-glm4.5-air");
  c.head_dim = 96;
  const ModelWeights w = bench::shape_only_weights(c, true);
  OpsLimits lim;
  lim.max_tokens = lim.max_seqs = lim.kv_num_blocks = lim.max_blocks_per_seq = 4;
  auto ops = cuda::make_cuda_model_ops_api();
  try {
    ops->prepare_random(w, lim, 1);
    ADD_FAILURE() << "prepare_random accepted head_dim 96";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot run this model: head_dim 96"), std::string::npos)
        << e.what();
  }
}

// The CUDA backend samples where the logits are (model/cuda/device_sampler.h): row for row the
// same tokens as the CPU sampler on the same logits, for greedy rows, seeded top-k / top-p /
// min-p draws and penalties over prompt and output histories. 90 rows, so the sampler's 64-row
// launches take two chunks; a history id outside the vocabulary is refused as the CPU twin does.
TEST(ModelCudaSampling, DeviceSamplerMatchesCpuSampler) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  OpsLimits lim = twin_limits();
  lim.max_tokens = 96;
  Twin t(tiny_checkpoint("model-cuda", "tiny-glm4.5-air", "nvfp4", 11), lim);
  t.add(cuda::make_cuda_model_ops_api());
  const int V = int(t.vocab());
  std::mt19937 rng(8);
  const std::vector<std::vector<int32_t>> prompts = {prompt(40, V, rng), prompt(31, V, rng),
                                                     prompt(19, V, rng)};
  const StepBatch pre = t.prefill({1, 2, 3}, prompts);
  const int R = pre.num_logit_rows();
  ASSERT_GT(R, 64);
  const std::vector<float> logits = t.run(pre)[0];  // [R, V]

  std::vector<ops::SamplingParams> params(static_cast<size_t>(R));
  std::vector<int32_t> prompt_tokens, prompt_off{0}, out_tokens, out_off{0};
  std::uniform_int_distribution<int32_t> any_token(0, V - 1);
  for (int r = 0; r < R; ++r) {
    ops::SamplingParams& p = params[size_t(r)];
    p.seed = 1000 + uint64_t(r);
    p.step = uint64_t(r % 7);
    switch (r % 4) {
      case 0: p.temperature = 0.0f; break;
      case 1: p.temperature = 0.7f, p.top_k = 40, p.top_p = 0.9f; break;
      case 2:
        p.temperature = 1.3f, p.min_p = 0.05f, p.repetition_penalty = 1.2f;
        p.frequency_penalty = 0.5f, p.presence_penalty = 0.3f;
        break;
      default: p.temperature = 0.0f, p.repetition_penalty = 1.5f; break;
    }
    for (int i = 0; i < 1 + r % 9; ++i) prompt_tokens.push_back(pre.tokens[size_t(r - r % 3)]);
    prompt_tokens.push_back(pre.tokens[size_t(r)]);
    prompt_off.push_back(int32_t(prompt_tokens.size()));
    for (int i = 0; i < r % 5; ++i) out_tokens.push_back(any_token(rng));
    out_off.push_back(int32_t(out_tokens.size()));
  }
  const ops::TokenHistory hist{prompt_tokens.data(), prompt_off.data(), out_tokens.data(),
                               out_off.data()};
  std::vector<int32_t> on_gpu(static_cast<size_t>(R)), on_cpu(static_cast<size_t>(R));
  t.ops[0]->sample({.rows = R, .params = params.data(), .history = hist}, on_gpu.data());
  ops::sample_cpu(logits.data(), R, V, params.data(), hist, on_cpu.data());
  EXPECT_EQ(on_gpu, on_cpu);
  int drawn_off_argmax = 0;  // the draws are exercised, not only greedy picks
  for (int r = 0; r < R; ++r)
    drawn_off_argmax += on_cpu[size_t(r)] != argmax(logits.data() + int64_t(r) * V, V);
  EXPECT_GT(drawn_off_argmax, 0);

  // A subset of the logit rows, out of order, with biases: each row's argmax banned and a
  // random token pushed up (the engine's logit_bias and min_tokens), on the CPU backend too.
  t.add(make_cpu_model_ops());  // the CPU backend runs the same step
  t.run(pre);
  const std::vector<int32_t> pick = {R - 1, 3, 64, 0, 17};
  const int P = int(pick.size());
  std::vector<int32_t> bias_tokens, bias_off{0};
  std::vector<float> bias_values;
  for (int i = 0; i < P; ++i) {
    const int32_t top = argmax(logits.data() + int64_t(pick[size_t(i)]) * V, V);
    bias_tokens.insert(bias_tokens.end(), {top, int32_t((top + 1 + i) % V)});
    bias_values.insert(bias_values.end(), {-INFINITY, i % 2 ? 30.0f : 0.5f});
    bias_off.push_back(int32_t(bias_tokens.size()));
  }
  std::vector<ops::SamplingParams> picked(params.begin(), params.begin() + P);
  std::vector<int32_t> off0(size_t(P) + 1, 0);  // empty histories
  const SampleBatch sub{.rows = P,
                                  .logit_rows = pick.data(),
                                  .params = picked.data(),
                                  .history = {nullptr, off0.data(), nullptr, off0.data()},
                                  .bias = {bias_tokens.data(), bias_values.data(), bias_off.data()}};
  std::vector<int32_t> sub_gpu(size_t(P), -2), sub_cpu(size_t(P), -3);
  t.ops[0]->sample(sub, sub_gpu.data());
  t.ops[1]->sample(sub, sub_cpu.data());
  EXPECT_EQ(sub_gpu, sub_cpu);
  for (int i = 0; i < P; ++i) {
    EXPECT_NE(sub_gpu[size_t(i)], bias_tokens[size_t(2 * i)]) << "a banned token was drawn";
    if (i % 2) EXPECT_EQ(sub_gpu[size_t(i)], bias_tokens[size_t(2 * i + 1)]) << "pick " << i;
  }

  // Logprobs of the step's rows on both backends: same top ids, logprobs within 2e-2 (the
  // backends' logits differ by their kernels' rounding).
  std::vector<ops::LogprobQuery> queries;
  for (int r = 0; r < R; r += 7) queries.push_back({r, pre.tokens[size_t(r)], (r / 7) % 21});
  std::vector<ops::PositionLogprobs> lp_gpu(queries.size()), lp_cpu(queries.size());
  t.ops[0]->logprobs(queries.data(), int(queries.size()), lp_gpu.data());
  t.ops[1]->logprobs(queries.data(), int(queries.size()), lp_cpu.data());
  for (size_t i = 0; i < queries.size(); ++i) {
    EXPECT_NEAR(lp_gpu[i].logprob, lp_cpu[i].logprob, 2e-2) << "query " << i;
    ASSERT_EQ(lp_gpu[i].top.size(), lp_cpu[i].top.size()) << "query " << i;
    // The GPU's own logits give the GPU's top ids exactly.
    const ops::PositionLogprobs own = ops::position_logprobs(
        logits.data() + size_t(queries[i].row) * size_t(V), V, queries[i].token, queries[i].top);
    for (size_t j = 0; j < own.top.size(); ++j) {
      EXPECT_EQ(lp_gpu[i].top[j].token, own.top[j].token) << "query " << i << " rank " << j;
      EXPECT_NEAR(lp_gpu[i].top[j].logprob, own.top[j].logprob, 1e-5) << "query " << i;
    }
  }

  // The draws' logprobs in the sampling call (SampleBatch::logprob_top; the CUDA kernel reads the
  // drawn tokens on the device): the same draws as without, each asking row's answer that of a
  // logprobs() query of its drawn token on the same backend (the same kernel and logits), the
  // row not asking left empty; against the CPU backend as above.
  std::vector<int32_t> tops(static_cast<size_t>(P));
  for (int i = 0; i < P; ++i) tops[size_t(i)] = i == 2 ? -1 : 3 * i;
  std::vector<ops::PositionLogprobs> drawn_gpu(static_cast<size_t>(P)), drawn_cpu(static_cast<size_t>(P));
  SampleBatch with_lp = sub;
  with_lp.logprob_top = tops.data();
  with_lp.logprobs = drawn_gpu.data();
  std::vector<int32_t> lp_tokens_gpu(static_cast<size_t>(P), -2), lp_tokens_cpu(static_cast<size_t>(P), -3);
  t.ops[0]->sample(with_lp, lp_tokens_gpu.data());
  with_lp.logprobs = drawn_cpu.data();
  t.ops[1]->sample(with_lp, lp_tokens_cpu.data());
  EXPECT_EQ(lp_tokens_gpu, sub_gpu);
  EXPECT_EQ(lp_tokens_cpu, sub_cpu);
  for (int i = 0; i < P; ++i) {
    if (tops[size_t(i)] < 0) {
      EXPECT_TRUE(drawn_gpu[size_t(i)].top.empty() && drawn_cpu[size_t(i)].top.empty());
      continue;
    }
    const ops::LogprobQuery q{pick[size_t(i)], lp_tokens_gpu[size_t(i)], tops[size_t(i)]};
    ops::PositionLogprobs alone;
    t.ops[0]->logprobs(&q, 1, &alone);
    // (the kernel splits a row by the number of queries: sums in another order)
    EXPECT_NEAR(drawn_gpu[size_t(i)].logprob, alone.logprob, 1e-5) << "pick " << i;
    ASSERT_EQ(drawn_gpu[size_t(i)].top.size(), size_t(tops[size_t(i)])) << "pick " << i;
    ASSERT_EQ(drawn_cpu[size_t(i)].top.size(), size_t(tops[size_t(i)])) << "pick " << i;
    for (size_t j = 0; j < alone.top.size(); ++j) {
      EXPECT_EQ(drawn_gpu[size_t(i)].top[j].token, alone.top[j].token) << "pick " << i;
      EXPECT_NEAR(drawn_gpu[size_t(i)].top[j].logprob, alone.top[j].logprob, 1e-5) << "pick " << i;
    }
    EXPECT_NEAR(drawn_gpu[size_t(i)].logprob, drawn_cpu[size_t(i)].logprob, 2e-2) << "pick " << i;
  }

  out_tokens.at(0) = V;  // row 1's first output token (row 0 has none)
  try {
    t.ops[0]->sample({.rows = R, .params = params.data(), .history = hist}, on_gpu.data());
    ADD_FAILURE() << "a history token outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("history token " + std::to_string(V) + " outside vocab"),
              std::string::npos)
        << e.what();
  }
}

// tiny-glm4.5-air widened until its q/k/v GEMV runs on the Rolling kernel (hidden 2048, 64
// heads of 128 and 4 kv heads: 576 tiles of k 2048; the tiny presets' run on the streaming one):
// the next layer's input norm folds into q/k/v (CudaOpsOptions::fold_input_norm) at 1 and 3
// tokens. Within the CPU twin's bounds over a prefill and 12 decode steps of three sequences then
// of one, as the same model with fold_input_norm off; the folds must happen, and not with it off.
TEST(ModelCudaWide, InputNormFoldMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  ModelConfig cfg = preset_config("tiny-glm4.5-air");
  cfg.hidden_size = 2048;
  cfg.num_attention_heads = 64;
  cfg.num_key_value_heads = 4;
  cfg.head_dim = 128;
  Twin t(checkpoint_of("model-cuda", "wide-glm4.5-air", cfg, "nvfp4", 13));
  t.add(make_model_ops("cpu"));
  auto folding = cuda::make_cuda_model_ops_api();
  cuda::CudaModelOpsApi* f = folding.get();
  t.add(std::move(folding));
  auto plain = cuda::make_cuda_model_ops_api();
  plain->set_options({.fold_input_norm = false});
  cuda::CudaModelOpsApi* p = plain.get();
  t.add(std::move(plain));
  std::mt19937 rng(14);
  const std::vector<int64_t> ids = {1, 2, 3};
  auto out = t.run(t.prefill(ids, {prompt(9, t.vocab(), rng), prompt(4, t.vocab(), rng),
                                   prompt(15, t.vocab(), rng)}));
  std::vector<int32_t> next(ids.size());
  for (size_t s = 0; s < ids.size(); ++s) next[s] = argmax(out[0].data() + int64_t(s) * t.vocab(), t.vocab());
  test::LogitRowErrors errors[2];
  for (int step = 0; step < 12; ++step) {
    const bool alone = step >= 6;  // then sequence 1 alone: one token
    const std::vector<int64_t> in = alone ? std::vector<int64_t>{1} : ids;
    next.resize(in.size());
    out = t.run(t.decode(in, next));
    for (int b = 0; b < 2; ++b)
      errors[b].add(out[size_t(b) + 1], out[0], t.vocab(),
                    str("wide decode ", step, " backend ", b));
    for (size_t s = 0; s < in.size(); ++s) next[s] = argmax(out[0].data() + int64_t(s) * t.vocab(), t.vocab());
  }
  for (int b = 0; b < 2; ++b)
    errors[b].expect_within_bounds(str("wide backend ", b), test::flip_share("tiny-glm4.5-air"));
  EXPECT_GT(f->folded_input_norms(), 0);
  EXPECT_EQ(p->folded_input_norms(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    TinyPresets, ModelCuda,
    ::testing::Combine(::testing::Values("tiny-glm4.5-air", "tiny-glm4.7", "tiny-qwen3-30b-a3b",
                                         "tiny-deepseek-v3", "tiny-glm5"),
                       ::testing::Values("bf16", "nvfp4")),
    [](const auto& info) {
      std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
      for (char& c : s)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return s;
    });

}  // namespace
}  // namespace tetra::model
