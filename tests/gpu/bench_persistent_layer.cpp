// Where the time of the one-launch MoE layer (ops/moe/persistent_layer.h) goes: GLM-4.5-Air and
// GLM-5 shapes (random NVFP4 weights, as `tetra bench moe`), 1 and 8 tokens. Prints the graph-timed
// us per forward of the persistent layer and of the separate launches, then the phase stamps
// (globaltimer) of one profiled launch that follows a run of plain ones. Checks: the profiled
// launch gives the plain launch's bits, the phases are in order, the times are finite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "graph_timing.h"
#include "moe/router.h"
#include "ops/moe/moe_layer_cuda.h"
#include "ops/moe/persistent_layer.h"

namespace tetra::moe {
namespace {

constexpr int kLaunches = 16;  // forwards per graph, over kLaunches different token rows
constexpr int kReplays = 10;

using Dev = test::DeviceScratch;

struct Shape {
  const char* name;
  int E, H, I;
  RouterParams router;
};

RouterParams sigmoid_router(int E, int n_group, int topk_group, float scale) {
  RouterParams p;
  p.scoring = Scoring::Sigmoid;
  p.num_experts = E;
  p.top_k = 8;
  p.n_group = n_group;
  p.topk_group = topk_group;
  p.routed_scaling_factor = scale;
  return p;
}

std::vector<unsigned long long> stamps_init() {
  std::vector<unsigned long long> v(cuda::kStampCount, 0);
  for (int i : {cuda::kStampKernelStart, cuda::kStampGemm1First, cuda::kStampGemm2First})
    v[size_t(i)] = ~0ull;
  return v;
}

TEST(BenchPersistentLayer, PhaseStamps) {
  if (!tetra::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Shape> shapes = {
      {"glm4.5-air", 128, 4096, 1408, sigmoid_router(128, 1, 1, 1.0f)},
      {"glm5", 256, 6144, 2048, sigmoid_router(256, 8, 4, 2.5f)}};
  cudaStream_t s;
  TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const char* names[] = {"start",  "logits", "routed", "g1 first", "g1 last start", "g1 done",
                         "g2 first", "g2 last start", "g2 done", "combined", "exit"};
  for (const Shape& sh : shapes) {
    RandomMoeLayer spec;
    spec.experts = sh.E;
    spec.hidden = sh.H;
    spec.inter = sh.I;
    spec.shared_inter = sh.I;
    spec.router = sh.router;
    spec.bias.assign(size_t(sh.E), 0.0f);
    CudaTokenPath launches;
    launches.persistent_max_tokens = 0;
    CudaTokenPath persistent;
    persistent.persistent_max_tokens = 8;
    CudaMoeLayer one(spec, 8, TokenLayout::Contiguous, persistent);
    CudaMoeLayer many(spec, 8, TokenLayout::Contiguous, launches);
    const int maxT = 8;
    std::vector<uint16_t> hx(size_t(kLaunches) * maxT * sh.H);
    for (auto& v : hx) v = float_to_bf16(nd(rng));
    Dev x(hx.size() * 2), out(size_t(kLaunches) * maxT * sh.H * 2), ref(size_t(maxT) * sh.H * 2),
        stamps(cuda::kStampCount * 8), block_sm(4096 * 4);
    TETRA_CUDA_CHECK(cudaMemcpy(x.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    for (const int T : {1, 8}) {
      auto forward_us = [&](CudaMoeLayer& L) {
        return test::graph_us_per_launch(
            kLaunches,
            [&](int i, cudaStream_t st) {
              L.forward(x.as<uint16_t>() + size_t(i) * maxT * sh.H, T,
                        out.as<uint16_t>() + size_t(i) * maxT * sh.H, nullptr, st);
            },
            kReplays);
      };
      const double us_one = forward_us(one), us_many = forward_us(many), us_again = forward_us(one);
      std::printf("%s T=%d: persistent %.1f / %.1f us (timed before / after the launches), "
                  "separate launches %.1f us\n", sh.name, T, us_one, us_again, us_many);
      EXPECT_TRUE(std::isfinite(us_one) && std::isfinite(us_many) && std::isfinite(us_again));
      {
        CudaMoeLayer* L = &one;
        // A run of plain launches, then the profiled one on the last rows.
        for (int i = 0; i < kLaunches; ++i)
          L->forward(x.as<uint16_t>() + size_t(i) * maxT * sh.H, T,
                     out.as<uint16_t>() + size_t(i) * maxT * sh.H, nullptr, s);
        const std::vector<unsigned long long> init = stamps_init();
        TETRA_CUDA_CHECK(cudaMemcpyAsync(stamps.p, init.data(), init.size() * 8,
                                         cudaMemcpyHostToDevice, s));
        TETRA_CUDA_CHECK(cudaMemsetAsync(block_sm.p, 0xff, 4096 * 4, s));
        L->set_persistent_stamps(stamps.as<unsigned long long>(), block_sm.as<uint32_t>());
        L->forward(x.as<uint16_t>() + size_t(kLaunches - 1) * maxT * sh.H, T, ref.as<uint16_t>(),
                   nullptr, s);
        L->set_persistent_stamps(nullptr);
        TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
        ASSERT_TRUE(L->last_forward_persistent());
        std::vector<unsigned long long> st(cuda::kStampCount);
        TETRA_CUDA_CHECK(cudaMemcpy(st.data(), stamps.p, st.size() * 8, cudaMemcpyDeviceToHost));
        std::vector<uint16_t> a(size_t(T) * sh.H), b(a.size());
        TETRA_CUDA_CHECK(cudaMemcpy(a.data(), ref.p, a.size() * 2, cudaMemcpyDeviceToHost));
        TETRA_CUDA_CHECK(cudaMemcpy(b.data(),
                                    out.as<uint16_t>() + size_t(kLaunches - 1) * maxT * sh.H,
                                    b.size() * 2, cudaMemcpyDeviceToHost));
        EXPECT_EQ(a, b) << "profiled launch vs plain";
        std::printf("  phases (us from the first block's start):");
        for (int i = 1; i < cuda::kStampCount; ++i)
          std::printf(" %s %.2f%s", names[i], 1e-3 * double(st[size_t(i)] - st[0]),
                      i + 1 < cuda::kStampCount ? "," : "\n");
        // First-round GEMM1 items per SM (block i runs item i first; GEMM1 items are the first
        // slots * I / 16 of the list): an uneven spread leaves SMs out of the weight stream.
        std::vector<uint32_t> bsm(4096);
        TETRA_CUDA_CHECK(cudaMemcpy(bsm.data(), block_sm.p, bsm.size() * 4, cudaMemcpyDeviceToHost));
        const int g1_items = (std::min(sh.E, T * 8) + 1) * (sh.I / 16);
        std::vector<int> per_sm(256, 0), blocks_sm(256, 0);
        for (int b = 0; b < 4096 && bsm[size_t(b)] != 0xffffffffu; ++b) {
          ASSERT_LT(bsm[size_t(b)], 256u);
          blocks_sm[bsm[size_t(b)]]++;
          if (b < g1_items) per_sm[bsm[size_t(b)]]++;
        }
        int lo = 1 << 30, hi = 0, used = 0, bl = 1 << 30, bh = 0;
        for (int i = 0; i < 256; ++i)
          if (blocks_sm[size_t(i)] > 0) {
            ++used;
            lo = std::min(lo, per_sm[size_t(i)]), hi = std::max(hi, per_sm[size_t(i)]);
            bl = std::min(bl, blocks_sm[size_t(i)]), bh = std::max(bh, blocks_sm[size_t(i)]);
          }
        std::printf("    %d SMs, %d..%d blocks each; first-round GEMM1 items per SM %d..%d\n",
                    used, bl, bh, lo, hi);
        EXPECT_LE(st[cuda::kStampLogitsDone], st[cuda::kStampRouted]);
        EXPECT_LE(st[cuda::kStampRouted], st[cuda::kStampGemm1First]);
        EXPECT_LE(st[cuda::kStampGemm1First], st[cuda::kStampGemm1Done]);
        EXPECT_LE(st[cuda::kStampGemm2Done], st[cuda::kStampCombineDone]);
        EXPECT_LE(st[cuda::kStampCombineDone], st[cuda::kStampExit]);
      }
    }
  }
  TETRA_CUDA_CHECK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace tetra::moe
