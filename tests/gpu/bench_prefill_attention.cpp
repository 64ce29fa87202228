// Causal varlen prefill attention (ops/attention/attention_cuda.h) at the GLM-4.5-Air shape (96
// query heads, 8 kv heads) with head_dim 128, plus head_dim 64 cases: one 4096-token sequence,
// one of 1024, and a batch of 16 x 256. Each row is a CUDA graph of back-to-back launches.
// Prints us per launch and TFLOP/s, counting the causal work as 4 * sum(len^2) / 2 * hd * heads
// (Q K^T and P V, two flops per multiply-add, half the square).
// Checks: every time is finite and positive, and the output holds no NaN/Inf.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "graph_timing.h"
#include "ops/attention/attention_cuda.h"
#include "ops/elementwise/elementwise_cuda.h"

namespace tetra {
namespace {

namespace oc = ops::cuda;
using DevBuf = test::DeviceScratch;
constexpr int kLaunches = 10;

struct BenchCase {
  int seqs, len, head_dim, heads, kv_heads;
};

TEST(BenchPrefillAttention, CausalShapes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const BenchCase cases[] = {{1, 4096, 128, 96, 8}, {1, 1024, 128, 96, 8}, {16, 256, 128, 96, 8},
                             {1, 4096, 64, 96, 8},  {16, 256, 64, 96, 8}};
  {  // ~0.1 s of work first, so the clocks have left idle before the first row
    DevBuf warm(size_t(1) << 30);
    for (int i = 0; i < 400; ++i) TETRA_CUDA_CHECK(cudaMemsetAsync(warm.p, i, size_t(1) << 30, nullptr));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::printf("\n| seqs x len | head_dim | heads (q/kv) | us | TFLOP/s |\n|---|---|---|---|---|\n");
  for (const BenchCase& c : cases) {
    const int T = c.seqs * c.len;
    ops::AttentionShape shape{c.heads, c.kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim)), 0, 0};
    std::vector<int32_t> cu(size_t(c.seqs) + 1);  // [seqs + 1]
    for (int b = 0; b <= c.seqs; ++b) cu[size_t(b)] = b * c.len;
    const size_t q_elems = size_t(T) * c.heads * c.head_dim, kv_elems = size_t(T) * c.kv_heads * c.head_dim;
    DevBuf q(q_elems * 2), k(kv_elems * 2), v(kv_elems * 2), out(q_elems * 2), dcu(cu.size() * 4);
    TETRA_CUDA_CHECK(cudaMemcpy(dcu.p, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
    TETRA_CUDA_CHECK(oc::fill_random_bf16(q.as<uint16_t>(), int64_t(q_elems), 2.0f, 3, nullptr));
    TETRA_CUDA_CHECK(oc::fill_random_bf16(k.as<uint16_t>(), int64_t(kv_elems), 2.0f, 4, nullptr));
    TETRA_CUDA_CHECK(oc::fill_random_bf16(v.as<uint16_t>(), int64_t(kv_elems), 1.0f, 5, nullptr));
    auto launch = [&](int, cudaStream_t s) {
      TETRA_CUDA_CHECK(oc::prefill_attention(q.as<uint16_t>(), k.as<uint16_t>(), v.as<uint16_t>(),
                                             dcu.as<int32_t>(), c.seqs, c.len, shape,
                                             out.as<uint16_t>(), s));
    };
    const double us = test::graph_us_per_launch(kLaunches, launch);
    EXPECT_TRUE(std::isfinite(us) && us > 0.0);
    const double flops = 4.0 * c.seqs * double(c.len) * c.len / 2.0 * c.head_dim * c.heads;
    std::printf("| %d x %d | %d | %d/%d | %.1f | %.1f |\n", c.seqs, c.len, c.head_dim, c.heads,
                c.kv_heads, us, flops / us / 1e6);
    std::fflush(stdout);
    std::vector<uint16_t> h(q_elems);  // [T, heads, head_dim] bf16
    TETRA_CUDA_CHECK(cudaMemcpy(h.data(), out.p, q_elems * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (uint16_t x : h) bad += std::isfinite(bf16_to_float(x)) ? 0 : 1;
    EXPECT_EQ(bad, 0u) << c.seqs << " x " << c.len << " hd " << c.head_dim;
  }
}

}  // namespace
}  // namespace tetra
