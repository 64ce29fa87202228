// The rule that stages the late decode kernel's scales in shared memory (ops/moe/w4a16_launch.h,
// decode_scales_in_smem): grids of half a wave to one wave whose warps' k ranges fit the buffer.
// The shapes are the one-token GEMMs measured on the H200 (132 SMs) in session 24.
#include <gtest/gtest.h>

#include "ops/moe/w4a16_launch.h"

namespace tetra::moe_detail {
namespace {

TEST(DecodeScalesRule, TakesTheMeasuredOneTokenGridsOfAirNotQwen3) {
  const int sms = 132;
  // GLM-4.5-Air at one token: GEMM1 792 blocks, k 4096 (16 chunks per warp); GEMM2 1152 blocks
  // of the 3-warp kernel, k 1408 (8 per warp). Measured with the 8- and 10-per-SM bounds
  // (session 24); since session 49 they run the 6- and 9-per-SM ones, still one wave each.
  EXPECT_TRUE(decode_scales_in_smem(792, 8, sms, 4096, 4));
  EXPECT_TRUE(decode_scales_in_smem(1152, 10, sms, 1408, 3));
  EXPECT_TRUE(decode_scales_in_smem(792, 6, sms, 4096, 4));
  EXPECT_TRUE(decode_scales_in_smem(1152, 9, sms, 1408, 3));
  // Qwen3-30B-A3B at one token: 384 and 512 blocks, under half a wave (measured 1.1% slower).
  EXPECT_FALSE(decode_scales_in_smem(384, 8, sms, 2048, 4));
  EXPECT_FALSE(decode_scales_in_smem(512, 8, sms, 768, 4));
  // Air at two tokens: more than one wave (unchanged in the A/B).
  EXPECT_FALSE(decode_scales_in_smem(1496, 8, sms, 4096, 4));
}

TEST(DecodeScalesRule, EdgesOfTheWaveAndOfTheBuffer) {
  const int sms = 100;  // one wave of the 8-per-SM kernel: 800 blocks
  EXPECT_TRUE(decode_scales_in_smem(400, 8, sms, 4096, 4));   // exactly half
  EXPECT_FALSE(decode_scales_in_smem(399, 8, sms, 4096, 4));
  EXPECT_TRUE(decode_scales_in_smem(800, 8, sms, 4096, 4));   // exactly one wave
  EXPECT_FALSE(decode_scales_in_smem(801, 8, sms, 4096, 4));
  // k ranges: 32 chunks per warp fit (k 8192 over 4 warps), 33 do not (rounded up per warp).
  EXPECT_TRUE(decode_scales_in_smem(600, 8, sms, kScalesSmemMaxWarpChunks * 64 * 4, 4));
  EXPECT_FALSE(decode_scales_in_smem(600, 8, sms, kScalesSmemMaxWarpChunks * 64 * 4 + 64, 4));
  EXPECT_FALSE(decode_scales_in_smem(600, 0, sms, 4096, 4));  // no register cap: no wave size
  EXPECT_FALSE(decode_scales_in_smem(600, 8, sms, 4096, 0));
}

}  // namespace
}  // namespace tetra::moe_detail
