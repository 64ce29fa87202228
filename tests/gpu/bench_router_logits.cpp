// Timing of the router logits at batch and prefill sizes: the one-warp-per-logit kernel
// (router_logits) against the tiled kernel with each of its tile shapes, and the shape
// router_tile_for picks, at GLM-5, GLM-4.5-Air and Qwen3-30B-A3B router shapes. Each row is a CUDA
// graph of kLaunches launches rotating over kCopies gate weights and token rows (successive
// layers read different router weights). The checks: every variant writes the same bits as
// the one-warp kernel on the first copy, and the times are finite.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "graph_timing.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/router_logits_tiled.h"

namespace tetra::moe {
namespace {

// Launches per graph, router weight / token row copies they rotate over, timed graph replays.
constexpr int kLaunches = 24, kCopies = 24, kReplays = 20;

struct Shape {
  const char* name;
  int E, H;
};

TEST(BenchRouterLogits, GraphTimedPerTileShape) {
  if (!tetra::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const Shape shapes[] = {{"glm5", 256, 6144}, {"glm4.5-air", 128, 4096}, {"qwen3-30b", 128, 2048}};
  const int sms = current_device_sm_count();
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::printf("| shape | tokens | one-warp us | 2x2 | 2x4 | 4x4 | 4x8 | picked |\n|---|---|---|---|---|---|---|---|\n");
  for (const Shape& sh : shapes) {
    const int E = sh.E, H = sh.H, maxT = 4096;
    std::vector<uint16_t> host(size_t(E) * H);  // [E, H] one gate copy
    for (auto& v : host) v = float_to_bf16(nd(rng) / 64.0f);
    test::DeviceScratch gate(size_t(kCopies) * E * H * 2);  // [kCopies, E, H]
    for (int c = 0; c < kCopies; ++c)
      TETRA_CUDA_CHECK(cudaMemcpy(gate.as<uint16_t>() + size_t(c) * E * H, host.data(),
                                  host.size() * 2, cudaMemcpyHostToDevice));
    std::vector<uint16_t> hx(size_t(maxT) * H);  // [maxT, H]; copies offset by a token each
    for (auto& v : hx) v = float_to_bf16(nd(rng));
    test::DeviceScratch x(size_t(maxT + kCopies) * H * 2);  // [maxT + kCopies, H]
    test::DeviceScratch logits(size_t(maxT) * E * 4), ref(size_t(maxT) * E * 4);  // [maxT, E]
    TETRA_CUDA_CHECK(cudaMemset(x.p, 0, size_t(maxT + kCopies) * H * 2));
    TETRA_CUDA_CHECK(cudaMemcpy(x.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    for (const int T : {17, 24, 32, 48, 64, 96, 128, 256, 1024, 4096}) {
      auto args = [&](int i) {
        return std::make_pair(x.as<uint16_t>() + size_t(i % kCopies) * H,
                              gate.as<uint16_t>() + size_t(i % kCopies) * E * H);
      };
      double us[6];
      us[0] = test::graph_us_per_launch(kLaunches, [&](int i, cudaStream_t st) {
        const auto [xi, gi] = args(i);
        TETRA_CUDA_CHECK(cuda::router_logits(xi, DType::BF16, gi, T, H, E, logits.as<float>(), st));
      }, kReplays);
      TETRA_CUDA_CHECK(cuda::router_logits(x.p, DType::BF16, gate.as<uint16_t>(), T, H, E,
                                           ref.as<float>(), nullptr));
      TETRA_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<float> want(size_t(T) * E), got(want.size());  // [T, E]
      TETRA_CUDA_CHECK(cudaMemcpy(want.data(), ref.p, want.size() * 4, cudaMemcpyDeviceToHost));
      for (int shape = -1; shape < cuda::kRouterTileShapeCount; ++shape) {
        us[shape + 2] = test::graph_us_per_launch(kLaunches, [&](int i, cudaStream_t st) {
          const auto [xi, gi] = args(i);
          TETRA_CUDA_CHECK(cuda::router_logits_tiled(xi, DType::BF16, gi, T, H, E,
                                                     logits.as<float>(), st, shape));
        }, kReplays);
        TETRA_CUDA_CHECK(cuda::router_logits_tiled(x.p, DType::BF16, gate.as<uint16_t>(), T, H, E,
                                                   logits.as<float>(), nullptr, shape));
        TETRA_CUDA_CHECK(cudaDeviceSynchronize());
        TETRA_CUDA_CHECK(cudaMemcpy(got.data(), logits.p, got.size() * 4, cudaMemcpyDeviceToHost));
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
            << sh.name << " T=" << T << " shape " << shape;
      }
      for (double u : us) EXPECT_TRUE(std::isfinite(u) && u > 0);
      std::printf("| %s | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f (%d) |\n", sh.name, T, us[0],
                  us[2], us[3], us[4], us[5], us[1], cuda::router_tile_for(T, E, sms));
    }
  }
}

}  // namespace
}  // namespace tetra::moe
