// Timing of the cuda-bf16 and cuda-w4a4 grouped MoE GEMMs (GEMM1 + GEMM2, W4A4 including its two
// activation-quantization passes) next to cuda-w4a16, on GLM-5 shapes (E256 H6144 I2048 top-8),
// contiguous layout, uniform random routing. Weight values do not change the speed of these kernels,
// so weights are memset patterns. Default: a smoke run (1 token, a few iterations) that checks the
// timing path; TETRA_BENCH_FULL=1 prints the table for 1, 64 and 4096 tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "moe/expert_weights.h"
#include "ops/moe/bf16_moe.h"
#include "ops/moe/w4a4_moe.h"
#include "ops/moe/w4a16_moe.h"

namespace tetra {
namespace {

template <typename T>
T* dev_alloc(size_t n, int byte) {
  T* p = nullptr;
  TETRA_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  TETRA_CUDA_CHECK(cudaMemset(p, byte, n * sizeof(T)));
  return p;
}

struct Routed {  // contiguous layout of T tokens x top_k on the device
  int total = 0, unique = 0, max_rows = 0;
  int *start = nullptr, *count = nullptr, *ids = nullptr, *gather = nullptr;
};

Routed route(int T, int E, int topk, std::mt19937& rng) {
  std::vector<std::vector<int>> rows_of(static_cast<size_t>(E));  // token of each row, per expert
  std::vector<int> perm(static_cast<size_t>(E));
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) perm[size_t(e)] = e;
    for (int j = 0; j < topk; ++j) {  // partial Fisher-Yates: topk distinct experts
      std::swap(perm[size_t(j)], perm[size_t(j) + rng() % size_t(E - j)]);
      rows_of[size_t(perm[size_t(j)])].push_back(t);
    }
  }
  Routed r;
  std::vector<int> start(static_cast<size_t>(E)), count(static_cast<size_t>(E)), ids, gather;
  for (int e = 0; e < E; ++e) {
    start[size_t(e)] = r.total;
    count[size_t(e)] = int(rows_of[size_t(e)].size());
    r.total += count[size_t(e)];
    r.max_rows = std::max(r.max_rows, count[size_t(e)]);
    if (count[size_t(e)] > 0) ids.push_back(e);
    for (int t : rows_of[size_t(e)]) gather.push_back(t);
  }
  r.unique = int(ids.size());
  r.start = dev_alloc<int>(size_t(E), 0);
  r.count = dev_alloc<int>(size_t(E), 0);
  r.ids = dev_alloc<int>(ids.size(), 0);
  r.gather = dev_alloc<int>(gather.size(), 0);
  TETRA_CUDA_CHECK(cudaMemcpy(r.start, start.data(), start.size() * 4, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(r.count, count.data(), count.size() * 4, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(r.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(r.gather, gather.data(), gather.size() * 4, cudaMemcpyHostToDevice));
  return r;
}

template <typename F>
float median_us(F launch, int iters) {
  cudaEvent_t a, b;
  TETRA_CUDA_CHECK(cudaEventCreate(&a));
  TETRA_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    TETRA_CUDA_CHECK(cudaEventRecord(a));
    launch();
    TETRA_CUDA_CHECK(cudaEventRecord(b));
    TETRA_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    TETRA_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1000.0f;
}

TEST(BenchMoeGemms, Glm5) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const bool full = std::getenv("TETRA_BENCH_FULL") != nullptr;
  const int E = 256, H = 6144, I = 2048, topk = 8;
  const int iters = full ? 20 : 3;
  // bf16 weights: 0x3c3c = 0.0115 everywhere; packed NVFP4: code bytes 0x22, scale codes 0x50.
  uint16_t* w13 = dev_alloc<uint16_t>(size_t(E) * 2 * I * H, 0x3c);
  uint16_t* w2 = dev_alloc<uint16_t>(size_t(E) * H * I, 0x3c);
  MoeWeightsDevice q;
  q.w13 = dev_alloc<uint8_t>(size_t(E) * packed_weight_bytes(2 * I, H), 0x22);
  q.s13 = dev_alloc<uint8_t>(size_t(E) * packed_scale_bytes(2 * I, H), 0x50);
  q.w2 = dev_alloc<uint8_t>(size_t(E) * packed_weight_bytes(H, I), 0x22);
  q.s2 = dev_alloc<uint8_t>(size_t(E) * packed_scale_bytes(H, I), 0x50);
  std::vector<float> ones(size_t(E), 1.0f / 1024.0f);
  float* alphas = dev_alloc<float>(size_t(E), 0);
  TETRA_CUDA_CHECK(cudaMemcpy(alphas, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  q.alpha_gate = q.alpha_up = q.alpha_down = alphas;
  float* in_scales = dev_alloc<float>(size_t(E), 0);
  std::vector<float> s(size_t(E), 4.0f / 2688.0f);
  TETRA_CUDA_CHECK(cudaMemcpy(in_scales, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
  const MoeW4a4WeightsDevice w4{q, in_scales, in_scales};
  const MoeBf16WeightsDevice wb{w13, w2};

  std::mt19937 rng(1);
  const std::vector<int> token_counts = full ? std::vector<int>{1, 64, 4096} : std::vector<int>{1};
  std::printf("| tokens | unique experts | backend | GEMM1+GEMM2 us | weight GB/s | TFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (int T : token_counts) {
    const Routed r = route(T, E, topk, rng);
    std::vector<uint16_t> xh(size_t(T) * H);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : xh) v = float_to_bf16(d(rng));
    uint16_t* x = dev_alloc<uint16_t>(xh.size(), 0);
    TETRA_CUDA_CHECK(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
    uint16_t* xq = dev_alloc<uint16_t>(size_t(r.total) * H, 0);
    uint16_t* act = dev_alloc<uint16_t>(size_t(r.total) * I, 0);
    float* y = dev_alloc<float>(size_t(r.total) * H, 0);
    MoeGemmProblem p;
    p.num_experts = E;
    p.hidden = H;
    p.inter = I;
    p.total_rows = r.total;
    p.num_slots = r.unique;
    p.max_rows_hint = r.max_rows;
    MoeRows rows{r.start, r.count, r.ids, r.gather};
    const double flops = 2.0 * r.total * (2.0 * I * H + double(H) * I);
    const double bf16_bytes = double(r.unique) * 3.0 * I * H * 2.0;
    const double fp4_bytes = double(r.unique) * 3.0 * I * H * (0.5 + 1.0 / 16.0);
    auto row = [&](const char* name, float us, double bytes) {
      EXPECT_GT(us, 0.0f) << name;
      std::printf("| %d | %d | %s | %.1f | %.0f | %.1f |\n", T, r.unique, name, us,
                  bytes / (us * 1e-6) / 1e9, flops / (us * 1e-6) / 1e12);
    };
    row("cuda-w4a16", median_us([&] {
          TETRA_CUDA_CHECK(moe_w4a16_gemm1(p, q, rows, x, act, nullptr));
          TETRA_CUDA_CHECK(moe_w4a16_gemm2(p, q, rows, act, y, true, nullptr));
        }, iters), fp4_bytes);
    row("cuda-w4a4", median_us([&] {
          TETRA_CUDA_CHECK(moe_w4a4_gemm1(p, w4, rows, x, xq, act, nullptr));
          TETRA_CUDA_CHECK(moe_w4a4_gemm2(p, w4, rows, act, y, true, nullptr));
        }, iters), fp4_bytes);
    row("cuda-bf16", median_us([&] {
          TETRA_CUDA_CHECK(moe_bf16_gemm1(p, wb, rows, x, act, nullptr));
          TETRA_CUDA_CHECK(moe_bf16_gemm2(p, wb, rows, act, y, true, nullptr));
        }, iters), bf16_bytes);
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    for (void* ptr : {(void*)x, (void*)xq, (void*)act, (void*)y, (void*)r.start, (void*)r.count,
                      (void*)r.ids, (void*)r.gather})
      cudaFree(ptr);
  }
  for (void* ptr : {(void*)w13, (void*)w2, (void*)q.w13, (void*)q.s13, (void*)q.w2, (void*)q.s2,
                    (void*)alphas, (void*)in_scales})
    cudaFree(ptr);
}

}  // namespace
}  // namespace tetra
