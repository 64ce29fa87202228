// Backend declarations evaluated against real model shapes and the GPU table: every kind of
// refusal is triggered by a case, all reasons are returned, and auto / the runtime refusal read
// the same verdicts.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "format/model_size.h"
#include "moe/backend_caps.h"
#include "moe/backend_select.h"

using namespace tetra;

namespace {

QuantConfig quant(QuantAlgo algo) {
  QuantConfig q;
  q.algo = algo;
  q.exclude = {"lm_head"};
  return q;
}

MoeWorkload workload(const std::string& preset, QuantAlgo algo, int tp = 1, int ep = 1) {
  return describe_workload(preset_config(preset), quant(algo), ParallelPlan{tp, ep}, preset);
}

Target on(const std::string& gpu) {
  Target t;
  t.gpu = gpu_spec(gpu);
  t.host_memory_bytes = int64_t(64) << 30;
  return t;
}

Verdict verdict(const std::string& backend, const MoeWorkload& w, const Target& t) {
  const BackendCaps* caps = find_backend(backend);
  EXPECT_NE(caps, nullptr) << backend;
  return evaluate(*caps, w, t);
}

bool has_reason(const Verdict& v, const std::string& text) {
  return std::find(v.reasons.begin(), v.reasons.end(), text) != v.reasons.end();
}

bool has_reason_starting(const Verdict& v, const std::string& prefix) {
  return std::any_of(v.reasons.begin(), v.reasons.end(),
                     [&](const std::string& r) { return r.rfind(prefix, 0) == 0; });
}

std::string dump(const Verdict& v) {
  std::string s = v.backend + (v.ok ? " ok" : " refused");
  for (const std::string& r : v.reasons) s += "\n  " + r;
  return s;
}

}  // namespace

TEST(BackendCaps, DeclarationsAreComplete) {
  std::set<std::string> names;
  for (const BackendCaps& b : moe_backends()) {
    SCOPED_TRACE(b.name);
    EXPECT_TRUE(names.insert(b.name).second) << "duplicate name";
    EXPECT_FALSE(b.sources.empty());
    EXPECT_FALSE(b.weight_formats.empty());
    EXPECT_FALSE(b.act_formats.empty());
    EXPECT_FALSE(b.layouts.empty());
    EXPECT_FALSE(b.activations.empty());
    EXPECT_TRUE(b.runs_on_cpu || !b.sms.empty());
    // A GPU backend states its shared-memory need, or why it has none (check then says so).
    if (!b.runs_on_cpu) EXPECT_NE(b.smem.empty(), b.smem_unknown.empty());
    // W4A4-only backends quantize activations with the checkpoint's input_scale.
    const bool w4a4_only = b.act_formats == std::vector<ActFormat>{ActFormat::NVFP4};
    EXPECT_EQ(w4a4_only, b.needs_input_scale);
  }
  for (const char* required : {"cpu", "cuda-w4a16", "cuda-w4a4", "cuda-bf16", "trtllm-gen-fp4-sm100",
                               "cutlass-fp4-sm100", "cutlass-fp4-sm120", "cutedsl-fp4-sm100"})
    EXPECT_TRUE(names.count(required)) << required;
  EXPECT_EQ(find_backend("no-such-backend"), nullptr);
  EXPECT_TRUE(find_backend("cpu")->built);
  EXPECT_FALSE(find_backend("cutlass-fp4-sm120")->built);
  EXPECT_FALSE(find_backend("cutlass-fp4-sm120")->requires_tcgen05);
  EXPECT_TRUE(find_backend("trtllm-gen-fp4-sm100")->requires_tcgen05);
}

TEST(BackendCaps, W4A16CheckpointRefusedByW4A4) {
  const Verdict v = verdict("cuda-w4a4", workload("glm4.5-air", QuantAlgo::W4A16_NVFP4), on("h200"));
  EXPECT_FALSE(v.ok);
  EXPECT_NE(std::find(v.reasons.begin(), v.reasons.end(),
                      "checkpoint is W4A16_NVFP4: no input_scale for W4A4"), v.reasons.end())
      << dump(v);
  // The same checkpoint runs W4A16; an NVFP4 (W4A4) checkpoint runs cuda-w4a4 on the H200 (the
  // layer runner dispatches to the W4A4 GEMMs), but auto keeps W4A16: W4A4 changes the numerics.
  EXPECT_TRUE(verdict("cuda-w4a16", workload("glm4.5-air", QuantAlgo::W4A16_NVFP4), on("h200")).ok);
  const Verdict nvfp4 = verdict("cuda-w4a4", workload("glm4.5-air", QuantAlgo::NVFP4), on("h200"));
  EXPECT_TRUE(nvfp4.ok) << dump(nvfp4);
  EXPECT_TRUE(find_backend("cuda-w4a4")->built);
  EXPECT_LT(find_backend("cuda-w4a4")->priority, find_backend("cuda-w4a16")->priority);
  EXPECT_EQ(auto_backend(workload("glm4.5-air", QuantAlgo::NVFP4), on("h200")), "cuda-w4a16");
}

TEST(BackendCaps, Tcgen05BackendOnSm120) {
  const MoeWorkload w = workload("qwen3-30b-a3b", QuantAlgo::NVFP4);
  for (const char* name : {"trtllm-gen-fp4-sm100", "cutlass-fp4-sm100", "cutedsl-fp4-sm100"}) {
    const Verdict v = verdict(name, w, on("rtx-pro-6000"));
    EXPECT_FALSE(v.ok);
    EXPECT_TRUE(has_reason(v, "needs SM100 or SM103 (tcgen05); this GPU is SM120")) << dump(v);
    EXPECT_TRUE(has_reason_starting(v, "not built in this version")) << dump(v);
  }
  // On a B200 only "not built" remains: the declaration itself is satisfied.
  const Verdict b200 = verdict("trtllm-gen-fp4-sm100", w, on("b200"));
  ASSERT_EQ(b200.reasons.size(), 1u) << dump(b200);
  EXPECT_TRUE(has_reason_starting(b200, "not built in this version"));
  // A tcgen05 need is checked on its own when the SM list would allow the GPU.
  BackendCaps fake = *find_backend("trtllm-gen-fp4-sm100");
  fake.sms = {120};
  const Verdict f = evaluate(fake, w, on("rtx-5090"));
  EXPECT_TRUE(has_reason(f, "needs tcgen05; this GPU (SM120) has none")) << dump(f);
}

TEST(BackendCaps, SharedMemoryBound) {
  // FlashInfer issue #3807: 118,784 B from moe intermediate 1024 up; GLM-5 has 2048.
  const Verdict v = verdict("b12x-fp4-sm120", workload("glm5", QuantAlgo::NVFP4), on("rtx-pro-6000"));
  EXPECT_TRUE(has_reason(v, "needs 118,784 B of shared memory per block; SM120 allows 101,376 B"))
      << dump(v);
  // At tp=4 each GPU has 512 of the intermediate: below the threshold, no smem reason.
  const Verdict tp4 =
      verdict("b12x-fp4-sm120", workload("glm5", QuantAlgo::NVFP4, 4), on("rtx-pro-6000"));
  EXPECT_FALSE(has_reason_starting(tp4, "needs 118,784 B")) << dump(tp4);
  // A built backend refused for shared memory alone.
  BackendCaps fake = *find_backend("cuda-w4a16");
  fake.name = "fake-smem";
  fake.sms = {90, 120};
  fake.sm_note.clear();
  fake.smem = {{150000, 0, "test"}};
  const MoeWorkload small = workload("tiny-qwen3-30b-a3b", QuantAlgo::NVFP4);
  const Verdict f = evaluate(fake, small, on("rtx-5090"));
  EXPECT_EQ(f.reasons,
            std::vector<std::string>{"needs 150,000 B of shared memory per block; SM120 allows 101,376 B"})
      << dump(f);
  EXPECT_TRUE(evaluate(fake, small, on("h100")).ok);
}

TEST(BackendCaps, TetraBackendsFitHopperNotSm12x) {
  // Their largest blocks (test_moe_kernel_smem): 208,640 B for the W4A16 GEMMs; 93,360 B in the
  // BF16 layer, 102,576 B from 697 experts (its token path). SM90 and SM100 allow 232,448 B, SM12x
  // 101,376 B.
  const MoeWorkload fp4 = workload("glm4.5-air", QuantAlgo::NVFP4);
  const MoeWorkload bf16 = workload("glm4.5-air", QuantAlgo::None);
  MoeWorkload bf16_wide = bf16;
  bf16_wide.experts = 1024;
  EXPECT_EQ(smem_needed(*find_backend("cuda-bf16"), bf16), 93360);
  EXPECT_EQ(smem_needed(*find_backend("cuda-bf16"), bf16_wide), 102576);
  for (const char* gpu : {"h100", "h200", "b200"}) {
    EXPECT_FALSE(has_reason_starting(verdict("cuda-w4a16", fp4, on(gpu)), "needs 208,640 B")) << gpu;
    EXPECT_FALSE(has_reason_starting(verdict("cuda-bf16", bf16_wide, on(gpu)), "needs 102,576 B")) << gpu;
  }
  for (const char* gpu : {"rtx-pro-6000", "rtx-5090", "dgx-spark"}) {
    const std::string sm = sm_label(gpu_spec(gpu).sm());
    EXPECT_TRUE(has_reason(verdict("cuda-w4a4", fp4, on(gpu)),
                           "needs 208,640 B of shared memory per block; " + sm + " allows 101,376 B"))
        << gpu;
    EXPECT_FALSE(has_reason_starting(verdict("cuda-bf16", bf16, on(gpu)), "needs ")) << gpu;
    EXPECT_TRUE(has_reason(verdict("cuda-bf16", bf16_wide, on(gpu)),
                           "needs 102,576 B of shared memory per block; " + sm + " allows 101,376 B"))
        << gpu;
  }
}

TEST(BackendCaps, AnUndeclaredNeedIsSaidNotChecked) {
  const MoeWorkload w = workload("qwen3-30b-a3b", QuantAlgo::NVFP4);
  const Verdict v = verdict("cutlass-fp4-sm100", w, on("b200"));
  EXPECT_EQ(v.unchecked, std::vector<std::string>{"shared memory per block not checked: no "
                                                  "published per-block figure for these kernels"});
  EXPECT_TRUE(verdict("cuda-w4a16", w, on("h200")).unchecked.empty());
  EXPECT_TRUE(verdict("cpu", w, on("h200")).unchecked.empty());
}

TEST(BackendCaps, ExpertParallelUnsupported) {
  const MoeWorkload fp4 = workload("qwen3-30b-a3b", QuantAlgo::NVFP4, 1, 8);
  // b12x declares no EP (not verified there); Tetra's cuda backends run expert blocks.
  const Verdict b12x = verdict("b12x-fp4-sm120", fp4, on("rtx-pro-6000"));
  EXPECT_TRUE(has_reason(b12x, "no expert parallelism (ep=8 asked)")) << dump(b12x);
  const MoeWorkload w = workload("qwen3-30b-a3b", QuantAlgo::None, 1, 8);
  EXPECT_TRUE(verdict("cuda-bf16", w, on("h200")).ok) << dump(verdict("cuda-bf16", w, on("h200")));
  EXPECT_TRUE(verdict("cuda-w4a16", fp4, on("h200")).ok);
  const Verdict cpu = verdict("cpu", fp4, on("h200"));
  EXPECT_TRUE(has_reason(cpu, "runs in one process; tp=1 ep=8 asks for 8 GPUs")) << dump(cpu);
}

TEST(BackendCaps, TensorParallelMustDivideHeads) {
  // Qwen3-30B-A3B: 32 heads, 4 KV heads, moe intermediate 768.
  const MoeWorkload w = workload("qwen3-30b-a3b", QuantAlgo::NVFP4, 3);
  EXPECT_EQ(w.model_problems,
            (std::vector<std::string>{"tp=3 does not divide 32 attention heads",
                                      "tp=3 neither divides nor is a multiple of 4 KV heads"}));
  for (const Verdict& v : evaluate_all(w, on("h200"))) {
    EXPECT_FALSE(v.ok) << v.backend;
    EXPECT_TRUE(has_reason(v, "tp=3 does not divide 32 attention heads")) << dump(v);
  }
  EXPECT_EQ(auto_backend(w, on("h200")), std::nullopt);
  // tp=8 is beyond the 4 KV heads but a multiple of them (replicated): fine.
  EXPECT_TRUE(workload("qwen3-30b-a3b", QuantAlgo::NVFP4, 8).model_problems.empty());
  // Experts must split evenly by ep; tp and ep must nest.
  const MoeWorkload ep = workload("qwen3-30b-a3b", QuantAlgo::NVFP4, 2, 3);
  EXPECT_TRUE(std::count(ep.model_problems.begin(), ep.model_problems.end(),
                         "ep=3 does not divide 128 routed experts"))
      << ep.model_problems.size();
}

TEST(BackendCaps, ModelTooBigForOneGpu) {
  const MoeWorkload one = workload("glm5", QuantAlgo::NVFP4);
  const Verdict v = verdict("cuda-w4a16", one, on("h200"));
  ASSERT_EQ(v.reasons.size(), 1u) << dump(v);
  EXPECT_TRUE(has_reason_starting(v, "does not fit in GPU memory at tp=1 ep=1: weights ")) << dump(v);
  EXPECT_EQ(shared_gpu_reasons(one, on("h200")), v.reasons);
  // GLM-5 NVFP4 is ~420 GB (MODELS.md): above one H200, within eight.
  EXPECT_GT(one.memory_per_gpu.weights_bytes, 380e9);
  EXPECT_LT(one.memory_per_gpu.weights_bytes, 480e9);
  const MoeWorkload eight = workload("glm5", QuantAlgo::NVFP4, 8, 8);
  EXPECT_TRUE(verdict("cuda-w4a16", eight, on("h200")).ok) << dump(verdict("cuda-w4a16", eight, on("h200")));
  EXPECT_LT(eight.memory_per_gpu.weights_bytes, one.memory_per_gpu.weights_bytes / 6);
}

TEST(BackendCaps, AutoPicksW4A16ForNvfp4OnH200) {
  EXPECT_EQ(auto_backend(workload("glm4.5-air", QuantAlgo::NVFP4), on("h200")), "cuda-w4a16");
  EXPECT_EQ(auto_backend(workload("glm4.5-air", QuantAlgo::W4A16_NVFP4), on("h200")), "cuda-w4a16");
  // A BF16 checkpoint runs on the BF16 GEMMs through the layer runner.
  EXPECT_EQ(auto_backend(workload("tiny-glm4.5-air", QuantAlgo::None), on("h200")), "cuda-bf16");
}

TEST(BackendCaps, AutoFallsBackToCpuWhenNoCudaBackendFits) {
  const MoeWorkload tiny = workload("tiny-glm5", QuantAlgo::NVFP4);
  EXPECT_EQ(auto_backend(tiny, on("a100")), "cpu");
  EXPECT_EQ(auto_backend(tiny, on("rtx-pro-6000")), "cpu");
  Target none;
  none.host_memory_bytes = int64_t(8) << 30;
  EXPECT_EQ(auto_backend(tiny, none), "cpu");
  const Verdict v = verdict("cuda-w4a16", tiny, none);
  EXPECT_EQ(v.reasons, std::vector<std::string>{
                           "no CUDA GPU on this machine (pass --gpu NAME to check a GPU from the table)"});
  // Nothing fits: the cpu backend also checks the machine's memory.
  none.host_memory_bytes = 1000;
  EXPECT_EQ(auto_backend(tiny, none), std::nullopt);
  EXPECT_TRUE(has_reason_starting(verdict("cpu", tiny, none), "does not fit in this machine's memory"));
}

TEST(BackendCaps, EveryReasonNotOnlyTheFirst) {
  // W4A16 checkpoint, W4A4 backend, SM120 GPU with 101,376 B, ep beyond what it has experts for.
  const MoeWorkload w = workload("qwen3-30b-a3b", QuantAlgo::W4A16_NVFP4, 1, 3);
  const Verdict v = verdict("cuda-w4a4", w, on("rtx-pro-6000"));
  EXPECT_TRUE(has_reason(v, "binary built for sm_90a only; this GPU is SM120")) << dump(v);
  EXPECT_TRUE(has_reason(v, "needs 208,640 B of shared memory per block; SM120 allows 101,376 B"));
  EXPECT_TRUE(has_reason(v, "checkpoint is W4A16_NVFP4: no input_scale for W4A4"));
  EXPECT_TRUE(has_reason(v, "ep=3 does not divide 128 routed experts"));
  EXPECT_GE(v.reasons.size(), 4u);
}

TEST(BackendCaps, TetraCudaBackendsNeedTheSm90aBinary) {
  const MoeWorkload w = workload("tiny-qwen3-30b-a3b", QuantAlgo::NVFP4);
  for (const GpuSpec& g : gpu_table()) {
    const Verdict v = verdict("cuda-w4a16", w, on(g.name));
    EXPECT_EQ(v.ok, g.sm() == 90) << dump(v);
    if (g.sm() != 90) {
      EXPECT_TRUE(has_reason(v, "binary built for sm_90a only; this GPU is " + sm_label(g.sm())))
          << dump(v);
    }
  }
}

TEST(BackendCaps, NotBuiltBackendsNeverRun) {
  const MoeWorkload w = workload("tiny-glm5", QuantAlgo::NVFP4);
  for (const BackendCaps& b : moe_backends()) {
    if (b.built) continue;
    for (const GpuSpec& g : gpu_table()) {
      const Verdict v = evaluate(b, w, on(g.name));
      EXPECT_FALSE(v.ok);
      EXPECT_TRUE(has_reason_starting(v, "not built in this version")) << dump(v);
    }
  }
}

TEST(BackendCaps, WeightFormatMismatch) {
  const Verdict v = verdict("cuda-w4a16", workload("tiny-glm4.5-air", QuantAlgo::None), on("h200"));
  EXPECT_EQ(v.reasons,
            std::vector<std::string>{"takes NVFP4 expert weights; the checkpoint's experts are None (bf16)"});
  const Verdict bf16 = verdict("cuda-bf16", workload("tiny-glm4.5-air", QuantAlgo::NVFP4), on("h200"));
  EXPECT_TRUE(has_reason(bf16, "takes BF16 expert weights; the checkpoint's experts are NVFP4"))
      << dump(bf16);
  const Verdict fp8 = verdict("cpu", workload("tiny-deepseek-v3", QuantAlgo::FP8), on("h200"));
  EXPECT_TRUE(has_reason(fp8, "takes NVFP4, BF16 expert weights; the checkpoint's experts are FP8"))
      << dump(fp8);
  // FP8 layers cannot be loaded (nor sized): a problem for every backend, memory not judged.
  const MoeWorkload fp8_w = workload("tiny-deepseek-v3", QuantAlgo::FP8);
  EXPECT_FALSE(fp8_w.memory_known);
  ASSERT_EQ(fp8_w.model_problems.size(), 1u);
  EXPECT_NE(fp8_w.model_problems[0].find("FP8 linear layers"), std::string::npos);
}

TEST(BackendCaps, AlignmentOfThePerGpuIntermediate) {
  // Qwen3-30B-A3B at tp=4: 768 / 4 = 192 per GPU, a multiple of the GEMMs' 64-wide k chunk.
  EXPECT_TRUE(verdict("cuda-w4a16", workload("qwen3-30b-a3b", QuantAlgo::NVFP4, 4), on("h200")).ok);
  // At tp=8: 768 / 8 = 96 per GPU, which the W4A16 GEMMs cannot take.
  const MoeWorkload w = workload("qwen3-30b-a3b", QuantAlgo::NVFP4, 8);
  EXPECT_EQ(w.moe_intermediate_per_gpu, 96);
  const Verdict real = verdict("cuda-w4a16", w, on("h200"));
  EXPECT_TRUE(has_reason(real, "moe intermediate per GPU 96 (768 / 8) is not a multiple of 64"))
      << dump(real);
  BackendCaps fake = *find_backend("cuda-w4a16");
  fake.inter_align = 128;
  fake.hidden_align = 4096 + 512;
  const Verdict v = evaluate(fake, w, on("h200"));
  EXPECT_TRUE(has_reason(v, "moe intermediate per GPU 96 (768 / 8) is not a multiple of 128")) << dump(v);
  EXPECT_TRUE(has_reason(v, "hidden size 2048 is not a multiple of 4608")) << dump(v);
}

TEST(BackendCaps, LayoutAndTokenLimitsAskedByTheRuntime) {
  MoeWorkload w = workload("tiny-glm5", QuantAlgo::NVFP4);
  w.layout = TokenLayout::Contiguous;
  const Verdict v = verdict("cutedsl-fp4-sm100", w, on("b200"));
  EXPECT_TRUE(has_reason(v, "has no contiguous layout (has masked)")) << dump(v);
  BackendCaps fake = *find_backend("cuda-w4a16");
  fake.max_tokens_per_launch = 8192;
  w.tokens_per_launch = 16384;
  EXPECT_TRUE(has_reason(evaluate(fake, w, on("h200")),
                         "takes at most 8,192 tokens per launch; 16,384 asked"));
}

TEST(BackendCaps, ExpertsInSeveralFormatsAreAProblem) {
  QuantConfig q = quant(QuantAlgo::NVFP4);
  const ModelConfig cfg = with_num_layers(preset_config("tiny-glm4.5-air"), 4);
  int64_t moe_layer = -1;
  for (int64_t l = 0; l < cfg.num_layers && moe_layer < 0; ++l)
    if (cfg.layer_is_moe[size_t(l)]) moe_layer = l;
  ASSERT_GE(moe_layer, 0);
  q.exclude.push_back(str("model.layers.", moe_layer, ".mlp.experts.*"));
  const MoeWorkload w = describe_workload(cfg, q, ParallelPlan{}, "mixed");
  ASSERT_EQ(w.model_problems.size(), 1u);
  EXPECT_NE(w.model_problems[0].find("more than one format"), std::string::npos) << w.model_problems[0];
  EXPECT_FALSE(verdict("cuda-w4a16", w, on("h200")).ok);
}

TEST(BackendCaps, RuntimeRefusalCarriesTheSameReasons) {
  const MoeWorkload w = workload("glm4.5-air", QuantAlgo::W4A16_NVFP4);
  const Verdict v = verdict("cuda-w4a4", w, on("rtx-5090"));
  ASSERT_FALSE(v.ok);
  try {
    require_compatible("cuda-w4a4", w, on("rtx-5090"));
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& r : v.reasons) EXPECT_NE(msg.find(r), std::string::npos) << r;
  }
  EXPECT_EQ(require_compatible("auto", w, on("h200")).name, "cuda-w4a16");
  EXPECT_EQ(require_compatible("cuda-w4a16", w, on("h200")).name, "cuda-w4a16");
  try {
    require_compatible("cuda-fp4", w, on("h200"));
    FAIL() << "expected unknown backend";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : backend_names()) EXPECT_NE(msg.find(n), std::string::npos) << n;
  }
  // auto with nothing able to run names every backend's reasons.
  const MoeWorkload big = workload("glm5", QuantAlgo::NVFP4);
  Target small_host = on("h200");
  small_host.host_memory_bytes = 1 << 20;
  try {
    require_compatible("auto", big, small_host);
    FAIL() << "expected no backend";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no MoE backend can run glm5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("does not fit in GPU memory"), std::string::npos) << msg;
  }
}

TEST(MemoryFit, KvCacheAndWeightSplit) {
  const ModelConfig glm5 = preset_config("glm5");
  int64_t indexer_layers = 0;
  for (int64_t l = 0; l < glm5.num_layers; ++l) indexer_layers += glm5.layer_has_indexer(l);
  // MLA: latent 512 + rope 64 per layer, bf16; indexer key 128 per indexer layer.
  const double expected = (double(glm5.num_layers) * 576 + double(indexer_layers) * 128) * 2;
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(glm5, ParallelPlan{}), expected);
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(glm5, ParallelPlan{8, 8}), expected);  // latent not split

  const ModelConfig qwen = preset_config("qwen3-30b-a3b");  // 48 layers, 4 KV heads of 128
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(qwen, ParallelPlan{}), 48.0 * 2 * 4 * 128 * 2);
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(qwen, ParallelPlan{2, 1}), 48.0 * 2 * 2 * 128 * 2);
  EXPECT_DOUBLE_EQ(kv_bytes_per_token(qwen, ParallelPlan{8, 1}), 48.0 * 2 * 1 * 128 * 2);

  const QuantConfig q = quant(QuantAlgo::NVFP4);
  const ModelSize size = model_size(qwen, q);
  const MemoryNeed one = memory_need(qwen, q, ParallelPlan{});
  EXPECT_NEAR(one.weights_bytes, size.total_all.bytes, size.total_all.bytes * 1e-9);
  EXPECT_DOUBLE_EQ(one.kv_bytes, kv_bytes_per_token(qwen, ParallelPlan{}) * kMinimalKvTokens);
  // ep=4: only the routed experts shrink, by four.
  const MemoryNeed ep4 = memory_need(qwen, q, ParallelPlan{1, 4});
  const double routed = size.total.at(ModuleKind::RoutedExpert).bytes;
  EXPECT_NEAR(one.weights_bytes - ep4.weights_bytes, routed * 3 / 4, 1.0);

  MemoryFit fit{one, int64_t(100e9)};
  EXPECT_DOUBLE_EQ(fit.usable_bytes(), 90e9);
  EXPECT_TRUE(fit.fits());
  fit.capacity_bytes = int64_t(one.total() / 0.9) - 1000;
  EXPECT_FALSE(fit.fits());
  EXPECT_EQ(format_gb(123.456e9), "123.5 GB");
  EXPECT_EQ(format_count(118784), "118,784");
  EXPECT_EQ(format_count(999), "999");
  EXPECT_EQ(format_count(1000000), "1,000,000");
}
