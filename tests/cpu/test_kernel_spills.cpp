// Register budgets of the kernels one decode step runs, read from ptxas (nvcc -Xptxas -v) for
// sm_90a on any machine: a local-memory spill in a latency-bound or register-streaming kernel
// costs step time on the H200 (session 20: the pair kernel's spills falling 44 -> 32 bytes made
// GLM-4.5-Air batch 2 1.8% faster), so the kernels the runtime picks at decode sizes must not
// spill, and the pair kernel's known spill must not grow.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cpu/ptxas_report.h"

namespace {

using tetra::test::compile_and_read;
using tetra::test::KernelBudget;
using tetra::test::matching;

void expect_no_spills(const std::vector<KernelBudget>& kernels) {
  for (const KernelBudget& k : kernels) {
    EXPECT_GT(k.registers, 0) << k.name;
    EXPECT_EQ(k.spill_stores, 0) << k.name << " (" << k.registers << " registers)";
    EXPECT_EQ(k.spill_loads, 0) << k.name << " (" << k.registers << " registers)";
  }
}

TEST(KernelSpills, DecodeMoeGemmsAtTheirDecodeConfigurations) {
  const auto all = compile_and_read("src/ops/moe/w4a16_decode.cu");
  // moe_decode_kernel<NT, KW, U, LATE, MINB, GATED, OUT_F32, DIAG, SCALES_SMEM>: the default
  // late configuration (1, 4, 2, true, 8) and the one-wave GEMM2 (1, 3, 2, true, 10 or 9), full
  // math (DIAG 0), in each of their three output forms, scales loaded or staged in shared memory.
  const auto late = matching(all, R"(moe_decode_kernelILi1ELi4ELi2ELb1ELi8ELb[01]ELb[01]ELi0E)");
  const auto narrow = matching(all, R"(moe_decode_kernelILi1ELi3ELi2ELb1ELi10ELb[01]ELb[01]ELi0E)");
  const auto narrow9 = matching(all, R"(moe_decode_kernelILi1ELi3ELi2ELb1ELi9ELb[01]ELb[01]ELi0E)");
  // ... and the 8-warp GEMM2 of small grids (1, 8, 2, true, 4).
  const auto wide_late =
      matching(all, R"(moe_decode_kernelILi1ELi8ELi2ELb1ELi4ELb[01]ELb[01]ELi0E)");
  ASSERT_EQ(late.size(), 6u);
  ASSERT_EQ(narrow.size(), 6u);
  ASSERT_EQ(narrow9.size(), 6u);
  ASSERT_EQ(wide_late.size(), 6u);
  expect_no_spills(late);
  expect_no_spills(narrow);
  expect_no_spills(narrow9);
  expect_no_spills(wide_late);
  for (const KernelBudget& k : late) EXPECT_LE(k.registers, 64) << k.name;  // 8 blocks per SM
  // 3 warps at 10 / 9 blocks per SM: 65536 / (96 * 10) and / (96 * 9), in 8-register steps.
  for (const KernelBudget& k : narrow) EXPECT_LE(k.registers, 64) << k.name;
  for (const KernelBudget& k : narrow9) EXPECT_LE(k.registers, 72) << k.name;
  // GEMM1 routing its token first (gemm1_routing.h): softmax / sigmoid with 4 or 8 scores per
  // lane, scales loaded or staged, the default shape (4 k-warps) bounded for 8, 7 or 6 blocks per
  // SM (routed_blocks_per_sm) and the wide one (8 k-warps, 4 per SM). At 8 per SM, staged
  // (GLM-4.5-Air's one-token grid before session 49) or wide, no spill; default and loaded, the
  // sigmoid routing's scores cost 8 bytes at 64 registers (the bound keeps it from growing).
  const auto routed = matching(all, "moe_decode_routed_kernel");
  ASSERT_EQ(routed.size(), 32u);
  for (const KernelBudget& k : routed) {
    EXPECT_LE(k.spill_stores, 8) << k.name;
    EXPECT_LE(k.spill_loads, 8) << k.name;
  }
  // Registers by blocks per SM (4: the wide shape, 8 k-warps).
  const int budget[] = {0, 0, 0, 0, 64, 0, 80, 72, 64};
  for (int minb : {4, 6, 7, 8}) {
    const auto shape = matching(routed, "ELi" + std::to_string(minb) + "EEEvN");
    ASSERT_EQ(shape.size(), 8u) << minb;
    for (const KernelBudget& k : shape) EXPECT_LE(k.registers, budget[minb]) << k.name;
  }
  expect_no_spills(matching(routed, R"(ELb1ELi[48]ELi[4-8]EEEvN)"));
  expect_no_spills(matching(routed, R"(ELi[67]EEEvN)"));
  const auto wide = matching(routed, R"(ELi8ELi4EEEvN)");
  ASSERT_EQ(wide.size(), 8u);
  expect_no_spills(wide);
  // The fold's kernels (<kPerLane, SCALES_SMEM, KW, MINB>): the same register budgets; no spill
  // at 6 or 7 per SM (GLM-4.5-Air, GLM-4.7) or wide, at 8 per SM at most 20 bytes.
  const auto fold = matching(all, "moe_decode_routed_fold_kernel");
  ASSERT_EQ(fold.size(), 16u);
  for (int minb : {4, 6, 7, 8}) {
    const auto shape = matching(fold, "ELi" + std::to_string(minb) + "EEEvN");
    ASSERT_EQ(shape.size(), 4u) << minb;
    for (const KernelBudget& k : shape) EXPECT_LE(k.registers, budget[minb]) << k.name;
  }
  expect_no_spills(matching(fold, R"(ELi[67]EEEvN|ELi8ELi4EEEvN)"));
  for (const KernelBudget& k : fold) {
    EXPECT_LE(k.spill_stores, 20) << k.name;
    EXPECT_LE(k.spill_loads, 20) << k.name;
  }
  // GEMM1 + GEMM2 as one grid: both paths under the 64-register cap still spill 16/16 bytes
  // (44/52 before the second tile was addressed by index); the bound keeps it from growing.
  const auto pair = matching(all, "moe_decode_pair_kernel");
  ASSERT_EQ(pair.size(), 1u);
  EXPECT_LE(pair[0].registers, 64);
  EXPECT_LE(pair[0].spill_stores, 16);
  EXPECT_LE(pair[0].spill_loads, 16);
}

TEST(KernelSpills, DenseAndLatencyBoundDecodeKernels) {
  // Every kernel of the q/k/v / o_proj GEMVs, the decode attention and the norms.
  const auto all = compile_and_read({"src/ops/linear/nvfp4_gemv.cu", "src/ops/linear/bf16_gemv.cu",
                                     "src/model/cuda/split_decode_attention.cu",
                                     "src/ops/norm/rms_norm.cu", "src/ops/moe/token_path_tiny.cu"});
  for (const auto& [source, kernels] : all) {
    SCOPED_TRACE(source);
    if (source != "src/ops/moe/token_path_tiny.cu") expect_no_spills(kernels);
  }
  // o_proj's streaming GEMV at one row (16 consumer warps + a producer, two blocks per SM) holds
  // 48 registers. A build that took it to 51 (56 allocated) ran GLM-4.5-Air batch 1 1.2-2.3%
  // slower on the H200 (two calls of session 44, the kernel otherwise the same): the tiny token
  // path launched behind it started ~6 us later in the step's timeline. By the arithmetic of an
  // SM sub-partition's 16K registers, its 512-thread block (4 warps x 2048 registers there) fits
  // beside one o_proj block's 5 warps at 48 registers (15.9K) and not at 56 (17.2K), so it had
  // to wait for both o_proj blocks to leave. The register count is a budget, not a detail.
  const auto o_proj = matching(all.at("src/ops/linear/nvfp4_gemv.cu"),
                               R"(stream_gemv_kernel.*DenseStreamWorkELi16ELi1ELi0E)");
  ASSERT_EQ(o_proj.size(), 1u);
  EXPECT_LE(o_proj[0].registers, 48) << o_proj[0].name;
  // The same with the router fold as its epilogue (moe/router_fold.h): GEMM1's blocks fit beside
  // it by the same arithmetic, and with the fold inside the unit loop ptxas took 56 (the epilogue
  // now runs after it).
  const auto o_proj_fold = matching(all.at("src/ops/linear/nvfp4_gemv.cu"),
                                    R"(stream_gemv_kernel.*DenseFoldStreamWorkELi16ELi1ELi0E)");
  ASSERT_EQ(o_proj_fold.size(), 1u);
  EXPECT_LE(o_proj_fold[0].registers, 48) << o_proj_fold[0].name;
  // The tiny token path with 8 scores per routing lane (up to 256 experts: every preset).
  const auto tiny = matching(all.at("src/ops/moe/token_path_tiny.cu"),
                             R"(tiny_token_path_kernelILb[01]ELi8E)");
  ASSERT_EQ(tiny.size(), 2u);
  expect_no_spills(tiny);
}

// The wgmma GEMMs (MoE above 8 rows per expert, dense linears from 64 rows, prefill): at the
// 128-token tile a thread holds 64 accumulators under the 128-register cap of one 512-thread
// block per SM; the split-k reduction that spread its sums over the ranks spilled 56-68 bytes
// there (session 25), the rank-0 reduction does not; the 64-token tile holds two sets of A
// fragments (its overlapped stages) under the same cap.
TEST(KernelSpills, WgmmaGemms) {
  const auto all = matching(compile_and_read("src/ops/moe/w4a16_wgmma.cu"), "moe_wgmma_kernel");
  ASSERT_EQ(all.size(), 9u);  // token tiles 32, 64 and 128, each gated / f32 / bf16 out
  expect_no_spills(all);
}

// MLA decode / prefill attention on tensor cores, key tiles of 32 and 64 rows: a warp keeps
// [16 heads, Dl / 4] latent sums (64 floats) and, at 64 keys, four score chains and P for four
// k-steps, under the 255 registers of one 256-thread block per SM.
TEST(KernelSpills, MlaAttention) {
  const auto tc = matching(compile_and_read("src/ops/attention/mla.cu"), "attention_tc_kernel");
  ASSERT_EQ(tc.size(), 2u);
  expect_no_spills(tc);
}

}  // namespace
