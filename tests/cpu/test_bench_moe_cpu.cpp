// `tetra bench moe` without a GPU: the bytes a row counts for each backend's format and the GPU
// memory refusal of a layer too large for the GPU (both pure functions of the preset).
#include <gtest/gtest.h>

#include "bench/moe_bench.h"

namespace tetra::bench {
namespace {

// GLM-5: 256 experts, hidden 6144, moe intermediate 2048, one shared expert of 2048.
TEST(MoeBenchBytes, Glm5Bf16CountsTwoBytesPerWeight) {
  // Every routed expert at bf16: 256 x 3 x 2048 x 6144 x 2 B (the ~19.3 GB of one layer).
  EXPECT_DOUBLE_EQ(moe_bench_bytes("glm5", "cuda-bf16", 256, 1) - moe_bench_bytes("glm5", "cuda-bf16", 0, 1),
                   19327352832.0);
  // No expert routed: the shared expert (3 x 2048 x 6144 x 2), the router (256 x 6144 x 2), one
  // token's x and out (2 x 6144 x 2).
  EXPECT_DOUBLE_EQ(moe_bench_bytes("glm5", "cuda-bf16", 0, 1), 78667776.0);
  EXPECT_DOUBLE_EQ(moe_bench_bytes("glm5", "cuda-bf16", 0, 3) - moe_bench_bytes("glm5", "cuda-bf16", 0, 1),
                   2 * 2 * 2 * 6144.0);
}

TEST(MoeBenchBytes, Nvfp4BackendsCountPackedWeightsAndScales) {
  // Half a byte per weight plus one ue5m3 scale per 16: 3 x 2048 x 6144 x (1/2 + 1/16) per expert.
  for (const char* backend : {"cuda-w4a16", "cuda-w4a4"}) {
    EXPECT_DOUBLE_EQ(moe_bench_bytes("glm5", backend, 9, 1) - moe_bench_bytes("glm5", backend, 8, 1),
                     21233664.0)
        << backend;
    EXPECT_DOUBLE_EQ(moe_bench_bytes("glm5", backend, 0, 1), 24403968.0) << backend;
  }
}

TEST(MoeBenchMemory, ALayerThatDoesNotFitTheGpuIsRefusedSayingWhy) {
  MoeBenchOptions o;
  o.preset = "glm5";
  o.tokens = {1, 4096};
  const int64_t gb = 1000 * 1000 * 1000;
  // 19.4 GB of bf16 weights: refused on 16 GB, fits 80 GB; the NVFP4 layer (5.5 GB) fits 16 GB.
  const std::string why = moe_bench_memory_reason(o, "cuda-bf16", 16 * gb);
  EXPECT_NE(why.find("one cuda-bf16 layer of glm5 needs "), std::string::npos) << why;
  EXPECT_NE(why.find("of GPU memory (weights 19.4 GB, scratch and inputs up to "), std::string::npos)
      << why;
  EXPECT_NE(why.find("; 90% of 16.0 GB is 14.4 GB"), std::string::npos) << why;
  EXPECT_EQ(moe_bench_memory_reason(o, "cuda-bf16", 80 * gb), "");
  EXPECT_EQ(moe_bench_memory_reason(o, "cuda-w4a16", 16 * gb), "");
  // DeepSeek-V3 (hidden 7168) is the largest preset layer at bf16: it still fits an H100.
  o.preset = "deepseek-v3";
  EXPECT_EQ(moe_bench_memory_reason(o, "cuda-bf16", 80 * gb), "");
  EXPECT_NE(moe_bench_memory_reason(o, "cuda-bf16", 24 * gb), "");
}

}  // namespace
}  // namespace tetra::bench
