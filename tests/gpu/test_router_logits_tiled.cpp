// The tiled router-logits kernel (many tokens) against router_logits_cpu: bit-identical logits
// for bf16 and f32 activations, token counts that do and do not fill a warp tile, expert counts
// that do and do not fill a block, hidden sizes with a partial last 256-element stripe; outputs
// poisoned before the launch and guarded on both sides. Plus: shapes it cannot take are named.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/half.h"
#include "guarded_device_array.h"
#include "moe/router.h"
#include "ops/moe/router_logits_tiled.h"

namespace tetra {
namespace {

using test::GuardedDeviceArray;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(RouterLogitsTiled, BitIdenticalToCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int H : {6144, 4096, 264, 8}) {
    for (int E : {256, 128, 65, 7}) {
      for (int T : {1, 3, 4, 33, 130}) {
        for (DType xt : {DType::BF16, DType::F32}) {
          SCOPED_TRACE(str("H=", H, " E=", E, " T=", T, " x=", dtype_name(xt)));
          std::vector<uint16_t> w(size_t(E) * H), xb(size_t(T) * H);  // [E, H], [T, H] bf16
          std::vector<float> xf(size_t(T) * H);                         // [T, H]
          for (uint16_t& v : w) v = float_to_bf16(0.02f * nd(rng));
          for (size_t i = 0; i < xf.size(); ++i) {
            xf[i] = nd(rng);
            xb[i] = float_to_bf16(xf[i]);
          }
          std::vector<float> want(size_t(T) * E);  // [T, E]
          if (xt == DType::BF16)
            moe::router_logits_cpu(xb.data(), w.data(), T, H, E, want.data());
          else
            moe::router_logits_cpu(xf.data(), w.data(), T, H, E, want.data());
          GuardedDeviceArray<uint16_t> d_w(w), d_xb(xb);
          GuardedDeviceArray<float> d_xf(xf);
          const void* x = xt == DType::BF16 ? static_cast<const void*>(d_xb.ptr()) : d_xf.ptr();
          // Every compiled tile shape, and the one router_tile_for picks (-1).
          for (int shape = -1; shape < moe::cuda::kRouterTileShapeCount; ++shape) {
            SCOPED_TRACE(str("shape ", shape));
            GuardedDeviceArray<float> d_out(want.size());
            d_out.poison();
            ASSERT_EQ(moe::cuda::router_logits_tiled(x, xt, d_w.ptr(), T, H, E, d_out.ptr(),
                                                     nullptr, shape),
                      cudaSuccess);
            TETRA_CUDA_CHECK(cudaDeviceSynchronize());
            EXPECT_TRUE(same_bits(d_out.download(), want));
            EXPECT_TRUE(d_out.guards_intact());
          }
        }
      }
    }
  }
}

// More token tiles than one grid column holds (65535 x 4 tokens with the 2 x 2 warp tile): the
// launch goes in pieces.
TEST(RouterLogitsTiled, LongBatchInPieces) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  const int H = 8, E = 7, T = 65535 * 4 + 9;  // block tiles of 4 tokens (shape 0)
  std::vector<uint16_t> w(size_t(E) * H), xb(size_t(T) * H);  // [E, H], [T, H] bf16
  for (uint16_t& v : w) v = float_to_bf16(0.02f * nd(rng));
  for (uint16_t& v : xb) v = float_to_bf16(nd(rng));
  std::vector<float> want(size_t(T) * E);  // [T, E]
  moe::router_logits_cpu(xb.data(), w.data(), T, H, E, want.data());
  GuardedDeviceArray<uint16_t> d_w(w), d_xb(xb);
  GuardedDeviceArray<float> d_out(want.size());
  d_out.poison();
  ASSERT_EQ(moe::cuda::router_logits_tiled(d_xb.ptr(), DType::BF16, d_w.ptr(), T, H, E, d_out.ptr(),
                                           nullptr, 0),
            cudaSuccess);
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(same_bits(d_out.download(), want));
  EXPECT_TRUE(d_out.guards_intact());
}

TEST(RouterLogitsTiled, NamesWhatItCannotTake) {
  alignas(16) static const uint16_t buf[64] = {};
  EXPECT_NE(moe::cuda::router_logits_tiled_unsupported_reason(buf, buf, 12).find("multiple of 8"),
            std::string::npos);
  EXPECT_NE(moe::cuda::router_logits_tiled_unsupported_reason(buf + 1, buf, 16).find("aligned"),
            std::string::npos);
  EXPECT_EQ(moe::cuda::router_logits_tiled_unsupported_reason(buf, buf, 16), "");
}

TEST(RouterLogitsTiled, RefusesAnUnknownTileShape) {
  alignas(16) static const uint16_t buf[64] = {};
  float out[4];
  for (int shape : {-2, moe::cuda::kRouterTileShapeCount})
    EXPECT_THROW(moe::cuda::router_logits_tiled(buf, DType::BF16, buf, 1, 8, 1, out, nullptr, shape),
                 Error);
}

}  // namespace
}  // namespace tetra
