// `tetra check` on tensor/expert parallel splits: NVFP4 scale blocks cut by a row split, which
// backends take EP, what each GPU holds, divisibility, and the GPU-count rule (pure function:
// this machine has no GPU to detect).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "dist/parallel_check.h"
#include "format/model_config.h"

using namespace tetra;
using tetra::test::run_tetra;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::string kAirBlockProblem =
    "dense_mlp down_proj: each GPU's slice of its 10944 input features is 1368, not a multiple of "
    "the 16-value NVFP4 scale block";

TEST(CliCheckParallel, Nvfp4RowSplitThatCutsScaleBlocksIsRefused) {
  const auto r = run_tetra("check --preset glm4.5-air --gpu h200 --tp 8");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_TRUE(has(r.output, kAirBlockProblem)) << r.output;
  // Unquantized weights split anywhere; tp=2 keeps whole blocks (5472 = 342 x 16).
  const auto bf16 = run_tetra("check --preset glm4.5-air --gpu h200 --tp 8 --quant bf16");
  EXPECT_FALSE(has(bf16.output, "NVFP4 scale block")) << bf16.output;
  const auto two = run_tetra("check --preset glm4.5-air --gpu h200 --tp 2");
  EXPECT_FALSE(has(two.output, "NVFP4 scale block")) << two.output;
  EXPECT_TRUE(has(two.output,
                  "per GPU: attention 48 of 96 heads, 4 of 8 KV heads; dense MLP 5472 of 10944; "
                  "shared expert 704 of 1408; routed experts 128 of 128 x intermediate 704 of 1408"))
      << two.output;
}

TEST(CliCheckParallel, JsonCarriesPerGpuShareAndProblems) {
  const auto r = run_tetra("check --preset glm4.5-air --gpu h200 --tp 8 --json");
  ASSERT_EQ(r.code, 3) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_TRUE(has(j["parallel"]["per_gpu"].get<std::string>(), "dense MLP 1368 of 10944"));
  bool found = false;
  for (const auto& p : j["parallel"]["problems"]) found = found || p == kAirBlockProblem;
  EXPECT_TRUE(found) << j["parallel"].dump(2);
}

TEST(CliCheckParallel, ExpertParallelOnlyOnBackendsThatDeclareIt) {
  // b12x-fp4-sm120 declares supports_ep = false (not verified); the cuda backends declare it.
  const auto b12x = run_tetra("check --preset glm5 --gpu rtx-pro-6000 --tp 8 --ep 8 "
                              "--backend b12x-fp4-sm120");
  EXPECT_EQ(b12x.code, 3) << b12x.output;
  EXPECT_TRUE(has(b12x.output, "no expert parallelism (ep=8 asked)")) << b12x.output;
  const auto w4 = run_tetra("check --preset glm5 --gpu h200 --tp 8 --ep 8 --backend cuda-w4a16");
  EXPECT_EQ(w4.code, 0) << w4.output;
  EXPECT_TRUE(has(w4.output, "routed experts 32 of 256 x intermediate 2048 of 2048")) << w4.output;
  const auto bf16 = run_tetra("check --preset glm4.5-air --quant bf16 --gpu h200 --tp 8 --ep 8 "
                              "--backend cuda-bf16");
  EXPECT_EQ(bf16.code, 0) << bf16.output;
  EXPECT_TRUE(has(bf16.output, "routed experts 16 of 128")) << bf16.output;
}

TEST(CliCheckParallel, KvHeadsReplicatedBeyondTheirCount) {
  const auto r = run_tetra("check --preset glm4.7 --gpu h200 --tp 16 --ep 16");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "6 of 96 heads, 1 of 8 KV heads (each on 2 GPUs)")) << r.output;
  const auto twelve = run_tetra("check --preset glm4.7 --gpu h200 --tp 12");
  EXPECT_EQ(twelve.code, 3) << twelve.output;
  EXPECT_TRUE(has(twelve.output, "tp=12 neither divides nor is a multiple of 8 KV heads"))
      << twelve.output;
}

TEST(CliCheckParallel, ExpertsNotDividedByEp) {
  const auto r = run_tetra("check --preset glm5 --gpu h200 --tp 1 --ep 3");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_TRUE(has(r.output, "ep=3 does not divide 256 routed experts")) << r.output;
  EXPECT_FALSE(has(r.output, "per GPU:")) << r.output;  // no shares for a split that fails
}

TEST(ParallelCheck, GpuCountAndSummary) {
  EXPECT_EQ(dist::gpu_count_problem({8, 8}, 2), "this machine has 2 GPUs; tp=8 ep=8 needs 8");
  EXPECT_EQ(dist::gpu_count_problem({2, 1}, 1), "this machine has 1 GPU; tp=2 ep=1 needs 2");
  EXPECT_FALSE(dist::gpu_count_problem({2, 2}, 2).has_value());
  EXPECT_EQ(dist::split_summary(preset_config("glm5"), {3, 1}), "");
  EXPECT_TRUE(has(dist::split_summary(preset_config("glm5"), {1, 1}),
                  "attention 64 of 64 heads (latent projections whole)"));
}

}  // namespace
