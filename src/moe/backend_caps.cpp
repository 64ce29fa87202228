// The declarations themselves. Tetra's backends say what this build runs; the Blackwell entries
// record, with their sources, what FP4 MoE kernels of other engines need, so check can explain
// them on any machine. Those are never built here and say so.
#include "moe/backend_caps.h"

namespace tetra {
namespace {

// Tetra's CUDA kernels are compiled for sm_90a only (CMake TETRA_CUDA_ARCHS default), and
// 'a' targets run on exactly that compute capability.
constexpr const char* kSm90aOnly = "binary built for sm_90a only";
// Other engines' SM100 kernels: no per-block figure was found published (issues, PRs, docs), so
// check names the gap instead of passing it over.
constexpr const char* kNoPublishedSmem = "no published per-block figure for these kernels";
// Tetra's needs are the largest block (static + dynamic shared memory, sm_90a) among the kernels
// the layer may launch, by the number of experts (1..1,024), the only shape they depend on:
// tests/cpu/test_moe_kernel_smem recomputes them from ptxas and ops/moe/moe_kernel_smem.h and
// fails when a kernel changes them.
SmemNeed w4a16_gemm_smem() {
  return {208640, 0,
          "ops/moe/moe_kernel_smem.h: the wgmma GEMM's 128-token tile, 205,824 B dynamic + "
          "2,816 B static; every other kernel of the layer needs less"};
}

std::vector<BackendCaps> declare() {
  std::vector<BackendCaps> all;

  {
    BackendCaps b;
    b.name = "cpu";
    b.summary = "reference: dequantized weights, float32 accumulation";
    b.origin = "Tetra";
    b.built = true;
    b.weight_formats = {WeightFormat::NVFP4, WeightFormat::BF16};
    b.act_formats = {ActFormat::BF16};
    b.runs_on_cpu = true;
    b.layouts = {TokenLayout::Masked, TokenLayout::Contiguous};
    b.multi_gpu = false;
    b.activations = {"silu"};
    b.priority = 0;
    b.sources = {"Tetra DESIGN.md: every op has a CPU reference"};
    all.push_back(b);
  }
  {
    BackendCaps b;
    b.name = "cuda-w4a16";
    b.summary = "FP4 weights dequantized to bf16 in registers, bf16 activations (Hopper)";
    b.origin = "Tetra";
    b.built = true;
    b.weight_formats = {WeightFormat::NVFP4};
    b.act_formats = {ActFormat::BF16};
    b.sms = {90};
    b.sm_note = kSm90aOnly;
    b.smem = {w4a16_gemm_smem()};
    b.layouts = {TokenLayout::Masked, TokenLayout::Contiguous};
    // The GEMMs read k in chunks of 64 (moe_shape_unsupported_reason): hidden is GEMM1's k,
    // the intermediate is GEMM2's k, so both must be multiples of 64.
    b.hidden_align = 64;
    b.inter_align = 64;
    b.multi_gpu = true;
    b.supports_ep = true;
    b.activations = {"silu"};
    b.priority = 200;
    b.sources = {"KERNELS.md; task D2 (W4A16 grouped MoE GEMM for SM90)"};
    all.push_back(b);
  }
  {
    BackendCaps b;
    b.name = "cuda-w4a4";
    // W4A4 changes the numerics (activations rounded to NVFP4), so auto never picks it over
    // cuda-w4a16 (lower priority); it runs when asked for (--backend cuda-w4a4).
    b.summary = "NVFP4 activation quantization + the same GEMMs (Blackwell numerics on Hopper; "
                "changes numerics vs W4A16, so auto picks it only when asked)";
    b.origin = "Tetra ops/moe/w4a4_moe.h through the layer runner ops/moe/moe_layer_cuda.h";
    b.built = true;
    b.weight_formats = {WeightFormat::NVFP4};
    b.act_formats = {ActFormat::NVFP4};
    b.needs_input_scale = true;
    b.sms = {90};
    b.sm_note = kSm90aOnly;
    b.smem = {w4a16_gemm_smem()};
    b.layouts = {TokenLayout::Masked, TokenLayout::Contiguous};
    // It runs the W4A16 kernels on NVFP4-quantized activations: their k chunk of 64 (and smem).
    b.hidden_align = 64;
    b.inter_align = 64;
    b.multi_gpu = true;
    b.supports_ep = true;
    b.activations = {"silu"};
    b.priority = 150;  // quantizing activations costs time on Hopper and saves nothing
    b.sources = {"NVFP4.md, Activation quantization (W4A4)"};
    all.push_back(b);
  }
  {
    BackendCaps b;
    b.name = "cuda-bf16";
    b.summary = "BF16 expert weights, bf16 tensor-core GEMMs";
    // The layer runner (ops/moe/moe_layer_cuda.h) dispatches BF16 experts to these GEMMs.
    b.origin = "Tetra ops/moe/bf16_moe.h through the layer runner ops/moe/moe_layer_cuda.h";
    b.built = true;
    b.weight_formats = {WeightFormat::BF16};
    b.act_formats = {ActFormat::BF16};
    b.sms = {90};
    b.sm_note = kSm90aOnly;
    // An NVFP4 shared expert runs the tiled W4A16 GEMM, the largest block up to 696 experts. The
    // general one-launch token path needs 128 B per expert + 4,272 B, more from 697 experts; it
    // is declared at its largest (from 768 experts), which overstates 697..767 by up to 9 KB.
    b.smem = {{93360, 0,
               "ops/moe/moe_kernel_smem.h: the tiled W4A16 GEMM (an NVFP4 shared expert), 92,160 B "
               "dynamic + 1,200 B static; the BF16 GEMMs take 82,944 B"},
              {102576, 0,
               "ops/moe/moe_kernel_smem.h: the general one-launch token path from 768 experts, "
               "98,304 B dynamic + 4,272 B static",
               697}};
    b.layouts = {TokenLayout::Masked, TokenLayout::Contiguous};
    b.hidden_align = 8;  // 16-byte rows of bf16 (cp.async chunks; partial tiles are predicated)
    b.inter_align = 8;
    b.multi_gpu = true;
    b.supports_ep = true;  // expert blocks: test_moe_layer ExpertParallel*, test_parallel_model tp2+ep2
    b.activations = {"silu"};
    b.priority = 100;
    b.sources = {"DESIGN.md"};
    all.push_back(b);
  }
  {
    BackendCaps b;
    b.name = "trtllm-gen-fp4-sm100";
    b.summary = "TensorRT-LLM trtllm-gen fused FP4 MoE (precompiled tcgen05 cubins)";
    b.origin = "TensorRT-LLM / FlashInfer trtllm_fp4_block_scale_moe";
    b.built = false;
    b.weight_formats = {WeightFormat::NVFP4};
    b.act_formats = {ActFormat::NVFP4};
    b.needs_input_scale = true;
    b.sms = {100, 103};
    b.requires_tcgen05 = true;
    b.smem_unknown = kNoPublishedSmem;
    b.layouts = {TokenLayout::Contiguous};
    b.hidden_align = 16;  // vLLM pads weights to 256 and activations at run time (PR #39510)
    b.inter_align = 16;
    b.multi_gpu = true;
    b.supports_ep = true;
    b.activations = {"silu"};
    b.priority = 400;
    b.sources = {
        "FlashInfer PR #3670: trtllm-gen MoE cubins exist for the SM100 family only, none for "
        "SM120/SM121",
        "TensorRT-LLM PR #11997 review: TRTLLMGenFusedMoE requires SM in {100, 103}; "
        "\"TRTLLM-GEN can not support sm120\"",
        "vLLM PR #39510: hidden % 512 was required before weight padding was added"};
    all.push_back(b);
  }
  {
    BackendCaps b;
    b.name = "cutedsl-fp4-sm100";
    b.summary = "CuTe DSL FP4 grouped GEMM MoE on tcgen05, masked layout (DeepEP low latency)";
    b.origin = "FlashInfer CuTe DSL: SGLang flashinfer_cutedsl_moe, TensorRT-LLM CuteDslFusedMoE";
    b.built = false;
    b.weight_formats = {WeightFormat::NVFP4};
    b.act_formats = {ActFormat::NVFP4};
    b.needs_input_scale = true;
    b.sms = {100, 103};
    b.requires_tcgen05 = true;
    b.smem_unknown = kNoPublishedSmem;
    b.layouts = {TokenLayout::Masked};
    b.hidden_align = 16;
    b.inter_align = 16;
    b.multi_gpu = true;
    b.supports_ep = true;
    b.activations = {"silu"};
    b.priority = 380;
    b.sources = {
        "TensorRT-LLM fused_moe_cute_dsl.py can_implement: NVFP4 needs SM in {100, 103} "
        "(PR #11997 review: \"sm120 is not supported\")",
        "SGLang layers/moe/flashinfer_cutedsl_moe.py: masked layout from DeepEP low-latency "
        "dispatch"};
    all.push_back(b);
  }
  {
    BackendCaps b;
    b.name = "cutlass-fp4-sm100";
    b.summary = "CUTLASS block-scaled FP4 grouped GEMM MoE on tcgen05";
    b.origin = "FlashInfer/TensorRT-LLM cutlass_fused_moe, vLLM cutlass_moe_fp4";
    b.built = false;
    b.weight_formats = {WeightFormat::NVFP4};
    b.act_formats = {ActFormat::NVFP4};
    b.needs_input_scale = true;
    b.sms = {100, 103};
    b.requires_tcgen05 = true;
    b.smem_unknown = kNoPublishedSmem;
    b.layouts = {TokenLayout::Contiguous};
    b.hidden_align = 16;
    b.inter_align = 16;
    b.multi_gpu = true;
    b.supports_ep = true;
    b.activations = {"silu"};
    b.priority = 350;
    b.sources = {"FlashInfer issue #1186: the CUTLASS fused MoE was built with sm100a flags "
                 "(SM103/SM120f builds came in 0.4)",
                 "SGLang PR #6093: CUTLASS fused FP4 MoE for nvidia/DeepSeek-R1-FP4 on SM100"};
    all.push_back(b);
  }
  {
    BackendCaps b;
    b.name = "b12x-fp4-sm120";
    b.summary = "FlashInfer b12x fused FP4 MoE (CuTe DSL, warp-level block-scaled MMA)";
    b.origin = "FlashInfer b12x_fused_moe, vLLM --moe-backend flashinfer_b12x";
    b.built = false;
    b.weight_formats = {WeightFormat::NVFP4};
    b.act_formats = {ActFormat::NVFP4};
    b.needs_input_scale = true;
    b.sms = {120, 121};
    b.smem = {{118784, 1024,
               "FlashInfer issue #3807: the dynamic kernel allocates 118,784 B for "
               "moe_intermediate >= 1024 (the release of 2026-07; the issue is closed since)"}};
    b.layouts = {TokenLayout::Contiguous};
    b.hidden_align = 16;
    b.inter_align = 16;
    b.multi_gpu = true;
    b.supports_ep = false;  // not verified: declared conservatively
    b.activations = {"silu", "relu2"};
    b.priority = 320;
    b.sources = {"FlashInfer PR #3080 (b12x_fused_moe, SM120 APIs, silu and relu2)",
                 "vLLM PR #40082 (flashinfer b12x MoE for SM120/121)",
                 "FlashInfer issue #3807 (118,784 B > 101,376 B on SM120)"};
    all.push_back(b);
  }
  {
    BackendCaps b;
    b.name = "cutlass-fp4-sm120";
    b.summary = "CUTLASS block-scaled FP4 grouped GEMM MoE for SM120/SM121 (mma.sync, no TMEM)";
    b.origin = "TensorRT-LLM / FlashInfer cutlass_fused_moe, SM120 kernels";
    b.built = false;
    b.weight_formats = {WeightFormat::NVFP4};
    b.act_formats = {ActFormat::NVFP4};
    b.needs_input_scale = true;
    b.sms = {120, 121};
    // Tiles must fit SM12x's 101,376 B; larger tactics (102,400 B) fail to launch and the
    // autotuner drops them.
    b.smem = {{101376, 0, "CUTLASS issue #3096 and #3144: SM120 grouped GEMM stages must fit 101,376 B"}};
    b.layouts = {TokenLayout::Contiguous};
    b.hidden_align = 16;
    b.inter_align = 16;
    b.multi_gpu = true;
    b.supports_ep = true;
    b.activations = {"silu"};
    b.priority = 300;
    b.sources = {"TensorRT-LLM PR #3770: NVFP4 GEMM and MoE support for SM120",
                 "CUTLASS issue #3144: on SM121 13 of 16 MoE GEMM tactics need 102,400 B > 101,376 B",
                 "CUTLASS issue #3096: SM120 NVFP4 MoE grouped GEMM stage count vs 101,376 B"};
    all.push_back(b);
  }
  return all;
}

}  // namespace

const std::vector<BackendCaps>& moe_backends() {
  static const std::vector<BackendCaps> all = declare();
  return all;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const BackendCaps& b : moe_backends()) names.push_back(b.name);
  return names;
}

const BackendCaps* find_backend(std::string_view name) {
  for (const BackendCaps& b : moe_backends())
    if (b.name == name) return &b;
  return nullptr;
}

}  // namespace tetra
