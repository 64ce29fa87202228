// The CUDA extend attention (chunked prefill) against its CPU twin on random paged caches:
// block size 16 with shuffled block tables, head_dim 64/128/256, GQA groups 1, 3, 8 and 12,
// prefixes of 0 and odd lengths, chunk sizes 1 .. 300 (several sequences per launch, mixed),
// a q row stride wider than the heads. Both compute float softmax and sums over the same bf16
// inputs and round once; they differ in summation order (online softmax per 32 keys on the
// GPU), so outputs agree to ~1 bf16 ulp: NMSE <= 1e-5 and max |diff| <= 2^-6 * max |out|.
// Outputs are poisoned before the launch and guarded by bytes that must survive.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "guarded_device_array.h"
#include "ops/attention/paged_extend_attention.h"

namespace tetra {
namespace {

using test::GuardedDeviceArray;

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float a) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

struct Seq {
  int prefix = 0;  // cached tokens before this run
  int chunk = 0;   // new tokens
};

struct Case {
  int D, heads, kv_heads;
  std::vector<Seq> seqs;
  int q_pad = 0;  // extra elements per q row (a fused qkv buffer)
};

void run_case(const Case& c, std::mt19937& rng) {
  const int bs = 16, S = int(c.seqs.size());
  int max_len = 0, T = 0;
  std::vector<int32_t> cu = {0};  // [S + 1]
  std::vector<int32_t> lens;      // [S]
  for (const Seq& s : c.seqs) {
    max_len = std::max(max_len, s.prefix + s.chunk);
    T += s.chunk;
    cu.push_back(T);
    lens.push_back(s.prefix + s.chunk);
  }
  const int mb = (max_len + bs - 1) / bs + 1;
  const int num_blocks = S * mb + 5;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(size_t(S) * mb, -1);  // [S, mb]
  size_t next = 0;
  for (int s = 0; s < S; ++s)
    for (int b = 0; b < (lens[size_t(s)] + bs - 1) / bs; ++b) tables[size_t(s) * mb + b] = ids[next++];
  ops::AttentionShape sh;
  sh.n_heads = c.heads;
  sh.n_kv_heads = c.kv_heads;
  sh.head_dim = c.D;
  sh.scale = 1.0f / std::sqrt(float(c.D));
  sh.q_stride = c.q_pad ? int64_t(c.heads) * c.D + c.q_pad : 0;
  const size_t cache_elems = size_t(num_blocks) * bs * c.kv_heads * c.D;  // [blocks, bs, n_kv, D]
  const std::vector<uint16_t> kc = random_bf16(cache_elems, rng, 2.0f);
  const std::vector<uint16_t> vc = random_bf16(cache_elems, rng, 1.0f);
  const std::vector<uint16_t> q = random_bf16(size_t(T) * sh.q_step(), rng, 2.0f);  // [T, q_step]
  ops::PagedKv kv{kc.data(), vc.data(), tables.data(), lens.data(), num_blocks, bs, mb};
  std::vector<uint16_t> want(size_t(T) * c.heads * c.D);  // [T, heads, D]
  ops::paged_extend_attention_cpu(q.data(), cu.data(), S, kv, sh, want.data());

  GuardedDeviceArray<uint16_t> dq(q), dk(kc), dv(vc), dout(want.size());
  GuardedDeviceArray<int32_t> dcu(cu), dtab(tables), dlens(lens);
  dout.poison();
  ops::PagedKv dkv{dk.ptr(), dv.ptr(), dtab.ptr(), dlens.ptr(), num_blocks, bs, mb};
  TETRA_CUDA_CHECK(ops::cuda::paged_extend_attention(dq.ptr(), dcu.ptr(), S, T, dkv, sh, dout.ptr(), nullptr));
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = dout.download();
  EXPECT_TRUE(dout.guards_intact()) << "D " << c.D << " heads " << c.heads;
  double err = 0, ref = 0, max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = bf16_to_float(got[i]), b = bf16_to_float(want[i]);
    ASSERT_TRUE(std::isfinite(a)) << "element " << i;
    err += (a - b) * (a - b);
    ref += b * b;
    max_diff = std::max(max_diff, std::fabs(a - b));
    max_ref = std::max(max_ref, std::fabs(b));
  }
  EXPECT_LE(err / std::max(ref, 1e-30), 1e-5) << "D " << c.D << " heads " << c.heads << "/" << c.kv_heads;
  EXPECT_LE(max_diff, max_ref / 64) << "D " << c.D << " heads " << c.heads << "/" << c.kv_heads;
}

TEST(PagedExtendAttention, MatchesCpuTwin) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(17);
  const std::vector<Case> cases = {
      {128, 8, 1, {{0, 1}, {15, 1}, {16, 7}, {33, 64}}},              // group 8
      {128, 96, 8, {{100, 300}, {0, 17}}},                            // GLM-4.5-Air: group 12
      {64, 12, 4, {{1, 299}, {255, 2}, {0, 128}, {47, 31}}, 24},      // group 3, wide q rows
      {128, 4, 4, {{513, 1}, {1000, 5}}},                             // long prefixes
      {256, 16, 2, {{70, 65}}},
  };
  for (const Case& c : cases) run_case(c, rng);
  // Every chunk size 1..300 after a 37-token prefix, with a short second sequence.
  for (int chunk = 1; chunk <= 300; ++chunk)
    run_case({64, 8, 2, {{37, chunk}, {0, 1 + chunk % 7}}}, rng);
}

}  // namespace
}  // namespace tetra
