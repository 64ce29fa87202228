// Split paged decode attention (model/cuda/split_decode_attention.h) at the GLM-4.5-Air shape
// (96 query heads, 8 kv heads, head_dim 128, 16-token cache blocks): batch 1 at contexts 128 to
// 8192, batch 8 and 64 at 1024, 4096, 8192 (each sequence holds context + 1 tokens: the prefill
// plus the new one). "(model)" marks the split count the model's decode step picks there.
// Each row is a CUDA graph of 32 back-to-back launches (as the model's step graph launches it),
// rotating over enough cache copies (>= 512 MB together) that every launch reads HBM, not L2.
// Prints us per launch, GB/s of the K and V bytes a launch must read and the share of 4.46 TB/s
// (the H200's measured copy bandwidth), for the automatic split count and each forced one.
// Checks: every time is finite, and every split count gives the automatic one's output (NMSE).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "core/cuda_check.h"
#include "graph_timing.h"
#include "core/half.h"
#include "model/cuda/split_decode_attention.h"
#include "ops/elementwise/elementwise_cuda.h"

namespace tetra {
namespace {

namespace oc = ops::cuda;
constexpr int kLaunches = 32;
constexpr double kPeakGBs = 4460.0;
// Split counts to time next to the automatic one (0).
const std::vector<int> kSplitChoices = {0, 1, 2, 4, 8, 16};

using DevBuf = test::DeviceScratch;

double time_graph(const std::function<void(int, cudaStream_t)>& launch) {
  return test::graph_us_per_launch(kLaunches, launch);
}

std::vector<uint16_t> download(const DevBuf& b, size_t n) {
  std::vector<uint16_t> h(n);
  TETRA_CUDA_CHECK(cudaMemcpy(h.data(), b.p, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

double nmse(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_to_float(got[i]), w = bf16_to_float(want[i]);
    err += (g - w) * (g - w);
    ref += w * w;
  }
  return ref > 0 ? err / ref : err;
}

TEST(BenchAttentionDecode, Glm45AirShape) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  constexpr int kHeads = 96, kKvHeads = 8, kDim = 128, kBlock = 16;
  ops::AttentionShape shape;
  shape.n_heads = kHeads;
  shape.n_kv_heads = kKvHeads;
  shape.head_dim = kDim;
  shape.scale = 1.0f / std::sqrt(float(kDim));
  {  // ~0.1 s of memory traffic first, so the clocks have left idle before the first row
    DevBuf warm(size_t(1) << 30);
    for (int i = 0; i < 400; ++i) TETRA_CUDA_CHECK(cudaMemsetAsync(warm.p, i, size_t(1) << 30, nullptr));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::printf("\n| batch | context | splits | us | GB/s | %% of 4.46 TB/s |\n|---|---|---|---|---|---|\n");
  for (int batch : {1, 8, 64}) {
    for (int context : batch == 1 ? std::vector<int>{128, 256, 512, 1024, 2048, 4096, 8192}
                                  : std::vector<int>{1024, 4096, 8192}) {
      const int len = context + 1;
      const int mb = (len + kBlock - 1) / kBlock;  // blocks per sequence
      const size_t cache_elems = size_t(batch) * mb * kBlock * kKvHeads * kDim;  // per K or V
      const double bytes = 2.0 * batch * len * kKvHeads * kDim * 2;  // K and V rows read
      const int copies = int(std::clamp<double>(std::ceil(512e6 / bytes), 1, kLaunches));
      std::vector<std::unique_ptr<DevBuf>> kc, vc;  // [copies] x [batch * mb, 16, 8, 128] bf16
      for (int c = 0; c < copies; ++c) {
        kc.push_back(std::make_unique<DevBuf>(cache_elems * 2));
        vc.push_back(std::make_unique<DevBuf>(cache_elems * 2));
        TETRA_CUDA_CHECK(oc::fill_random_bf16(kc.back()->as<uint16_t>(), int64_t(cache_elems), 2.0f, 11 + c, nullptr));
        TETRA_CUDA_CHECK(oc::fill_random_bf16(vc.back()->as<uint16_t>(), int64_t(cache_elems), 1.0f, 97 + c, nullptr));
      }
      std::vector<int32_t> table(size_t(batch) * mb), lens(size_t(batch), len);  // [batch, mb], [batch]
      for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
      DevBuf dtable(table.size() * 4), dlens(lens.size() * 4), q(size_t(batch) * kHeads * kDim * 2),
          out(size_t(batch) * kHeads * kDim * 2);
      TETRA_CUDA_CHECK(cudaMemcpy(dtable.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
      TETRA_CUDA_CHECK(cudaMemcpy(dlens.p, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
      TETRA_CUDA_CHECK(oc::fill_random_bf16(q.as<uint16_t>(), int64_t(batch) * kHeads * kDim, 1.0f, 5, nullptr));
      ops::PagedKv kv;
      kv.block_tables = dtable.as<int32_t>();
      kv.seq_lens = dlens.as<int32_t>();
      kv.num_blocks = batch * mb;
      kv.block_size = kBlock;
      kv.max_blocks_per_seq = mb;
      const size_t out_elems = size_t(batch) * kHeads * kDim;
      std::vector<uint16_t> auto_out;  // [batch, 96, 128] bf16
      for (int splits : kSplitChoices) {
        auto launch = [&](int i, cudaStream_t s) {
          ops::PagedKv c = kv;
          c.k_cache = kc[size_t(i % copies)]->as<uint16_t>();
          c.v_cache = vc[size_t(i % copies)]->as<uint16_t>();
          TETRA_CUDA_CHECK(model::cuda::split_decode_attention(q.as<uint16_t>(), c, batch, shape, out.as<uint16_t>(), s, splits));
        };
        const double us = time_graph(launch);
        EXPECT_TRUE(std::isfinite(us) && us > 0.0);
        const double gbs = bytes / us / 1e3;
        const int shown = splits == 0 ? model::cuda::split_decode_auto_splits(batch, shape) : splits;
        const int model_pick = model::cuda::split_decode_auto_splits(batch, shape, context + 1);
        // "model": the count the model's decode step picks with the context known.
        std::printf("| %d | %d | %s%d%s | %.2f | %.0f | %.0f%% |\n", batch, context,
                    splits == 0 ? "auto: " : "", shown,
                    splits == model_pick ? " (model)" : "", us, gbs, 100.0 * gbs / kPeakGBs);
        std::fflush(stdout);
        launch(0, nullptr);
        TETRA_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint16_t> got = download(out, out_elems);
        if (splits == 0) auto_out = got;
        EXPECT_LE(nmse(got, auto_out), 1e-5) << "splits " << splits;
      }
    }
  }
}

}  // namespace
}  // namespace tetra
