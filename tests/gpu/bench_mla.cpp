// Timing of the absorbed MLA ops (ops/attention/mla_cuda.h) at the GLM-5 shape (64 heads, nope
// 192, v 256) and the DeepSeek-V3 shape (128 heads, nope 128, v 128), both kv_lora 512, rope 64:
// decode of T = 1, 8, 64 sequences at contexts 1024 and 4096 (each sequence holds `context`
// keys, the new one included; paged, 16-token blocks) and prefill of T = 512 and 4096 tokens of
// one sequence (step-slot keys). Rows: each op (cache write, absorb q, attention, up v) and the
// layer's four in sequence. Decode rows are CUDA graphs of back-to-back launches (as the model's
// step graph runs them; graph_timing.h); prefill rows (cuBLAS inside, not captured by the model)
// are eager launches between events. Both rotate over enough copies of kv_b and of the cache
// that the reads come from HBM, not L2 (50 MB). Prints us per launch, the bytes an op must read
// (weights: W_uk for absorb, W_uv for up v; cache: the rows attention reads, each sequence's
// keys once, or the rows the write stores), the achieved GB/s and its share of 4.46 TB/s.
// Checks: every time is finite and positive, every output finite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "graph_timing.h"
#include "ops/attention/mla_cuda.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/rope/rope.h"

namespace tetra {
namespace {

namespace oc = ops::cuda;
using DevBuf = test::DeviceScratch;
using Launch = std::function<void(int, cudaStream_t)>;

constexpr double kPeakGBs = 4460.0;
constexpr int kDl = 512, kDr = 64, kBlock = 16;
constexpr double kRotateBytes = 256e6;  // copies of weights / cache rotated through per row

struct BenchShape {
  const char* name;
  int H, nope, v;
};

ops::MlaShape mla_shape(const BenchShape& b) {
  ops::MlaShape s;
  s.n_heads = b.H;
  s.kv_lora = kDl;
  s.rope_dim = kDr;
  s.nope_dim = b.nope;
  s.v_dim = b.v;
  s.scale = 1.0f / std::sqrt(float(b.nope + kDr));
  s.style = ops::RopeStyle::GptJ;
  return s;
}

void expect_finite(const DevBuf& b, size_t n, const std::string& what) {
  std::vector<uint16_t> h(n);
  TETRA_CUDA_CHECK(cudaMemcpy(h.data(), b.p, n * 2, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (uint16_t x : h) bad += !std::isfinite(bf16_to_float(x));
  EXPECT_EQ(bad, 0u) << what << ": non-finite outputs";
}

// One table block: decode (T sequences of `context` keys) or prefill (T tokens, one sequence).
void run_case(const BenchShape& bs, bool prefill, int T, int context) {
  const ops::MlaShape s = mla_shape(bs);
  const int H = bs.H, row = s.row();
  const int S = prefill ? 1 : T;
  const int mb = prefill ? 0 : (context + kBlock - 1) / kBlock;  // blocks per sequence
  const int64_t num_slots = prefill ? int64_t(T) : int64_t(S) * mb * kBlock;
  const size_t kvb_elems = size_t(H) * (bs.nope + bs.v) * kDl;
  const size_t cache_elems = size_t(num_slots) * row;
  const int launches = prefill ? (T >= 4096 ? 4 : 16) : 64;
  const int w_copies = int(std::clamp<double>(std::ceil(kRotateBytes / (kvb_elems * 2.0)), 1, launches));
  const int c_copies = int(std::clamp<double>(std::ceil(kRotateBytes / (cache_elems * 2.0)), 1, launches));

  std::vector<std::unique_ptr<DevBuf>> kvb, cache;  // [copies] x kv_b [H (nope + v), Dl], cache [slots, row]
  for (int c = 0; c < w_copies; ++c) {
    kvb.push_back(std::make_unique<DevBuf>(kvb_elems * 2));
    TETRA_CUDA_CHECK(oc::fill_random_bf16(kvb.back()->as<uint16_t>(), int64_t(kvb_elems), 0.05f, 31 + c, nullptr));
  }
  for (int c = 0; c < c_copies; ++c) {
    cache.push_back(std::make_unique<DevBuf>(cache_elems * 2));
    TETRA_CUDA_CHECK(oc::fill_random_bf16(cache.back()->as<uint16_t>(), int64_t(cache_elems), 1.0f, 77 + c, nullptr));
  }
  DevBuf kv_a(size_t(T) * row * 2), norm_w(size_t(kDl) * 2), q(size_t(T) * H * s.q_head() * 2),
      q_abs(size_t(T) * H * row * 2), lat(size_t(T) * H * kDl * 2), out(size_t(T) * H * bs.v * 2);
  TETRA_CUDA_CHECK(oc::fill_random_bf16(kv_a.as<uint16_t>(), int64_t(T) * row, 1.0f, 5, nullptr));
  TETRA_CUDA_CHECK(oc::fill_bf16(norm_w.as<uint16_t>(), kDl, 1.0f, nullptr));
  TETRA_CUDA_CHECK(oc::fill_random_bf16(q.as<uint16_t>(), int64_t(T) * H * s.q_head(), 1.0f, 6, nullptr));

  std::vector<int32_t> pos(static_cast<size_t>(T)), cu(static_cast<size_t>(S) + 1), tables;
  std::vector<int64_t> slots(static_cast<size_t>(T));
  if (prefill) {
    for (int t = 0; t < T; ++t) pos[size_t(t)] = t, slots[size_t(t)] = t;
    cu = {0, T};
  } else {
    tables.resize(size_t(S) * mb);  // [S, mb]: sequence b owns blocks b * mb ..
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t(i);
    for (int b = 0; b < S; ++b) {
      const int p = context - 1;
      pos[size_t(b)] = p;
      slots[size_t(b)] = int64_t(tables[size_t(b) * mb + p / kBlock]) * kBlock + p % kBlock;
      cu[size_t(b)] = b;
    }
    cu[size_t(S)] = S;
  }
  const std::vector<float> inv = ops::rope_inv_freq(10000.0, kDr);
  DevBuf dpos(pos.size() * 4), dslots(slots.size() * 8), dcu(cu.size() * 4),
      dtables(std::max<size_t>(tables.size(), 1) * 4), dinv(inv.size() * 4);
  TETRA_CUDA_CHECK(cudaMemcpy(dpos.p, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(dslots.p, slots.data(), slots.size() * 8, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(dcu.p, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
  if (!tables.empty())
    TETRA_CUDA_CHECK(cudaMemcpy(dtables.p, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(dinv.p, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice));
  ops::MlaKeys keys;
  if (prefill) {
    keys.step_slots = dslots.as<int64_t>();
  } else {
    keys.block_tables = dtables.as<int32_t>();
    keys.max_blocks_per_seq = mb;
    keys.block_size = kBlock;
  }
  const size_t ws_bytes = oc::mla_attention_workspace_bytes(s, T);
  DevBuf ws(ws_bytes);
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());

  const auto u16 = [](const DevBuf& b) { return b.as<uint16_t>(); };
  const Launch write = [&](int i, cudaStream_t st) {
    TETRA_CUDA_CHECK(oc::mla_cache_write(u16(kv_a), u16(norm_w), 1e-6f, dpos.as<int32_t>(),
                                         dslots.as<int64_t>(), T, dinv.as<float>(), s, num_slots,
                                         u16(*cache[size_t(i % c_copies)]), st));
  };
  const Launch absorb = [&](int i, cudaStream_t st) {
    TETRA_CUDA_CHECK(oc::mla_absorb_q(u16(q), u16(*kvb[size_t(i % w_copies)]), dpos.as<int32_t>(),
                                      T, dinv.as<float>(), s, u16(q_abs), st));
  };
  const Launch attend = [&](int i, cudaStream_t st) {
    TETRA_CUDA_CHECK(oc::mla_attention(u16(q_abs), u16(*cache[size_t(i % c_copies)]), num_slots,
                                       dcu.as<int32_t>(), S, T, dpos.as<int32_t>(), keys, s,
                                       u16(lat), ws.p, ws_bytes, st));
  };
  const Launch up_v = [&](int i, cudaStream_t st) {
    TETRA_CUDA_CHECK(oc::mla_up_v(u16(lat), u16(*kvb[size_t(i % w_copies)]), T, s, u16(out), st));
  };
  const Launch all = [&](int i, cudaStream_t st) {
    write(i, st);
    absorb(i, st);
    attend(i, st);
    up_v(i, st);
  };

  const double uk = double(H) * bs.nope * kDl * 2, uv = double(H) * bs.v * kDl * 2;
  const double rows = prefill ? double(T) : double(T) * context;  // cached rows attention reads
  const double attn_bytes = rows * row * 2, write_bytes = double(T) * row * 2;
  struct Row {
    const char* op;
    const Launch* fn;
    double weights, cache;
  };
  const Row table[] = {{"cache write", &write, 0, write_bytes},
                       {"absorb q", &absorb, uk, 0},
                       {"attention", &attend, 0, attn_bytes},
                       {"up v", &up_v, uv, 0},
                       {"all four", &all, uk + uv, attn_bytes + write_bytes}};
  for (const Row& r : table) {
    const double us = prefill ? test::eager_us_per_launch(launches, *r.fn)
                              : test::graph_us_per_launch(launches, *r.fn);
    EXPECT_TRUE(std::isfinite(us) && us > 0.0) << r.op;
    const double gbs = (r.weights + r.cache) / us / 1e3;
    std::printf("| %s | %s | %d | %d | %s | %.2f | %.1f | %.1f | %.0f | %.0f%% |\n", bs.name,
                prefill ? "prefill" : "decode", T, prefill ? T : context, r.op, us,
                r.weights / 1e6, r.cache / 1e6, gbs, 100.0 * gbs / kPeakGBs);
    std::fflush(stdout);
  }
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::string what = std::string(bs.name) + (prefill ? " prefill T " : " decode T ") + std::to_string(T);
  expect_finite(q_abs, size_t(T) * H * row, what + " q_abs");
  expect_finite(lat, size_t(T) * H * kDl, what + " out_lat");
  expect_finite(out, size_t(T) * H * bs.v, what + " out");
}

TEST(BenchMla, Glm5AndDeepSeekV3Shapes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  {  // ~0.1 s of memory traffic first, so the clocks have left idle before the first row
    DevBuf warm(size_t(1) << 30);
    for (int i = 0; i < 400; ++i) TETRA_CUDA_CHECK(cudaMemsetAsync(warm.p, i, size_t(1) << 30, nullptr));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::printf("\n| shape | step | T | context | op | us | weights MB | cache MB | GB/s | %% of 4.46 TB/s |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const BenchShape& b : {BenchShape{"glm-5", 64, 192, 256}, BenchShape{"deepseek-v3", 128, 128, 128}}) {
    for (int T : {1, 8, 64})
      for (int context : {1024, 4096}) run_case(b, false, T, context);
    for (int T : {512, 4096}) run_case(b, true, T, T);
  }
}

}  // namespace
}  // namespace tetra
