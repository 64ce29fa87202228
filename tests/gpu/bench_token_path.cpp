// Timing of the MoE decode glue: the one-launch token path (router logits + routing + layout +
// row bookkeeping) and the combine, at GLM-5, GLM-4.5-Air and Qwen3 shapes, 1 / 4 / 16 tokens.
// Each is a CUDA graph of kLaunches back-to-back launches (launch gaps as in a model's step
// graph), the token path rotating over kCopies gate weights / token rows (more bytes than the
// 60 MB L2 at GLM-5 size, as successive layers read different router weights). Prints us per
// launch and the phase stamps of one profiled launch (tiny_token_path_profiled). The checks: the
// profiled and the plain launch route alike, the stamps are in phase order, the times finite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "graph_timing.h"
#include "core/half.h"
#include "moe/router.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/token_path.h"
#include "ops/moe/token_path_tiny.h"

namespace tetra::moe {
namespace {

constexpr int kLaunches = 24;
constexpr int kCopies = 24;
constexpr int kReplays = 20;

using Dev = test::DeviceScratch;

// Median us per launch of launch(i, stream) -> cudaError_t, i < kLaunches, as one graph.
template <typename F>
double graph_us(F launch) {
  return test::graph_us_per_launch(
      kLaunches, [&](int i, cudaStream_t st) { TETRA_CUDA_CHECK(launch(i, st)); }, kReplays);
}

struct Shape {
  const char* name;
  RouterParams p;
  int H;
  bool bias;
};

TEST(BenchTokenPath, GraphTimedWithPhaseStamps) {
  if (!tetra::cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto router = [](Scoring sc, int E, int n_group, int topk_group, float scale) {
    RouterParams p;
    p.scoring = sc;
    p.num_experts = E;
    p.top_k = 8;
    p.n_group = n_group;
    p.topk_group = topk_group;
    p.routed_scaling_factor = scale;
    return p;
  };
  const std::vector<Shape> shapes = {
      {"glm5", router(Scoring::Sigmoid, 256, 8, 4, 2.5f), 6144, true},
      {"glm4.5-air", router(Scoring::Sigmoid, 128, 1, 1, 1.0f), 4096, true},
      {"qwen3", router(Scoring::Softmax, 128, 1, 1, 1.0f), 4096, false},
  };
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::printf("| shape | tokens | token path us | combine us | phases (us, globaltimer): rows in "
              "smem / logits / last block known / routed / layout / done; routing cycles |\n");
  for (const Shape& sh : shapes) {
    const int E = sh.p.num_experts, K = sh.p.top_k, H = sh.H, maxT = 16;
    cuda::small_token_path_setup(E, E);
    std::vector<uint16_t> host(size_t(E) * H);  // [E, H] one gate copy
    for (auto& v : host) v = float_to_bf16(nd(rng) / 64.0f);
    Dev gate(size_t(kCopies) * E * H * 2), x(size_t(kCopies) * maxT * H * 2);
    for (int c = 0; c < kCopies; ++c)
      TETRA_CUDA_CHECK(cudaMemcpy(gate.as<uint16_t>() + size_t(c) * E * H, host.data(),
                                  host.size() * 2, cudaMemcpyHostToDevice));
    std::vector<uint16_t> hx(size_t(kCopies) * maxT * H);  // [kCopies, maxT, H]
    for (auto& v : hx) v = float_to_bf16(nd(rng));
    TETRA_CUDA_CHECK(cudaMemcpy(x.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    std::vector<float> hb(static_cast<size_t>(E));
    for (auto& b : hb) b = 0.05f * nd(rng);
    Dev bias(size_t(E) * 4), logits(size_t(maxT) * E * 4), ids(size_t(maxT) * K * 4),
        ids2(size_t(maxT) * K * 4), w(size_t(maxT) * K * 4), offsets(size_t(E + 1) * 4),
        row_count(size_t(E + 1) * 4), slots(size_t(E + 1) * 4),
        row_token(size_t(maxT) * (K + 1) * 4), slot_of(size_t(maxT) * K * 4), dropped(4),
        counter(4), stamps(16 * 8), y(size_t(maxT) * (K + 1) * H * 4), out(size_t(maxT) * H * 2),
        resid(size_t(maxT) * H * 2);
    TETRA_CUDA_CHECK(cudaMemcpy(bias.p, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
    TETRA_CUDA_CHECK(cudaMemset(counter.p, 0, 4));
    TETRA_CUDA_CHECK(cudaMemset(y.p, 0, size_t(maxT) * (K + 1) * H * 4));
    TETRA_CUDA_CHECK(cudaMemset(resid.p, 0, size_t(maxT) * H * 2));
    for (const int T : {1, 4, 16}) {
      cuda::SmallTokenPath a;
      a.gate = gate.as<uint16_t>();
      a.x = x.as<uint16_t>();
      a.bias = sh.bias ? bias.as<float>() : nullptr;
      a.H = H;
      a.router = sh.p;
      a.logits = logits.as<float>();
      a.ids = ids.as<int32_t>();
      a.weights = w.as<float>();
      a.offsets = offsets.as<int32_t>();
      a.row_token = row_token.as<int32_t>();
      a.slot_of = slot_of.as<int32_t>();
      a.dropped = dropped.as<int32_t>();
      a.rows.E = E;
      a.rows.num_slots = std::min(E, T * K);
      a.rows.offsets = offsets.as<int32_t>();
      a.rows.row_count = row_count.as<int32_t>();
      a.rows.slots = slots.as<int32_t>();
      a.rows.row_token = row_token.as<int32_t>();
      a.rows.shared_slot = T <= 8;
      a.counter = counter.as<uint32_t>();
      ASSERT_TRUE(cuda::detail::tiny_token_path_fits(a, T));
      const double tp_us = graph_us([&](int i, cudaStream_t st) {
        cuda::SmallTokenPath b = a;
        b.gate = gate.as<uint16_t>() + size_t(i % kCopies) * E * H;
        b.x = x.as<uint16_t>() + size_t(i % kCopies) * maxT * H;
        return cuda::small_token_path(b, T, st);
      });
      const int32_t* shared_first = T <= 8 ? offsets.as<int32_t>() + E : nullptr;
      const double comb_us = graph_us([&](int, cudaStream_t st) {
        cuda::CombineOptions co;
        co.shared_first_row = shared_first;
        return cuda::combine_bf16(y.p, DType::F32, T, H, K, slot_of.as<int32_t>(), w.as<float>(),
                                  nullptr, resid.as<uint16_t>(), out.as<uint16_t>(), st, co);
      });
      // One profiled launch on the first copy, against a plain one.
      ASSERT_EQ(cuda::small_token_path(a, T, s), cudaSuccess);
      TETRA_CUDA_CHECK(cudaMemcpyAsync(ids2.p, ids.p, size_t(T) * K * 4, cudaMemcpyDeviceToDevice, s));
      TETRA_CUDA_CHECK(cudaMemsetAsync(stamps.p, 0, 16 * 8, s));
      ASSERT_EQ(cuda::detail::tiny_token_path_profiled(a, T, s, stamps.as<unsigned long long>()),
                cudaSuccess);
      TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
      std::vector<int32_t> i1(size_t(T) * K), i2(size_t(T) * K);
      TETRA_CUDA_CHECK(cudaMemcpy(i1.data(), ids.p, i1.size() * 4, cudaMemcpyDeviceToHost));
      TETRA_CUDA_CHECK(cudaMemcpy(i2.data(), ids2.p, i2.size() * 4, cudaMemcpyDeviceToHost));
      EXPECT_EQ(i1, i2) << sh.name << " T=" << T;
      unsigned long long st[16];
      TETRA_CUDA_CHECK(cudaMemcpy(st, stamps.p, sizeof(st), cudaMemcpyDeviceToHost));
      for (int i = 1; i < 3; ++i) EXPECT_LE(st[i - 1], st[i]) << "block 0 stamp " << i;
      for (int i = 4; i < 7; ++i) EXPECT_LE(st[i - 1], st[i]) << "last block stamp " << i;
      EXPECT_LE(st[0], st[3]);
      EXPECT_TRUE(std::isfinite(tp_us) && tp_us > 0 && std::isfinite(comb_us) && comb_us > 0);
      auto d = [&](int i) { return double(st[i] - st[0]) / 1e3; };
      std::printf("| %s | %d | %.2f | %.2f | %.2f / %.2f / %.2f / %.2f / %.2f / %.2f; %llu |\n",
                  sh.name, T, tp_us, comb_us, d(1), d(2), d(3), d(4), d(5), d(6),
                  st[12] - st[11]);
    }
  }
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace tetra::moe
