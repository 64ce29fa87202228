// The split paged decode attention of the CUDA model backend against the CPU reference
// (ops::paged_decode_attention_cpu) on fresh random caches: head_dim 64 and 128, GQA groups 1..16
// (12 = GLM-4.5-Air), sequence lengths around the 64-token chunk edges and past the split cap
// (several chunks per split), shuffled block tables, an empty sequence, a q row stride wider than
// the heads; the automatic split count and forced ones (1: no cluster merge; 3: uneven; 16: the
// largest cluster, most splits empty for short sequences). NMSE <= 1e-5: the kernel computes the
// softmax and sums in float over the same bf16 inputs and rounds once, like the CPU, but rounds
// P to bf16 for the tensor cores (2^-9 relative per weight, averaging out over the tokens: ~1e-6
// in NMSE). Outputs are poisoned before the launch and guarded by bytes that must survive. A
// second launch must give the same bits (the merge order is fixed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/half.h"
#include "model/cuda/split_decode_attention.h"
#include "ops/attention/attention.h"

namespace tetra::model::cuda {
namespace {

template <typename T>
struct Dev {
  static constexpr size_t kGuard = 64;
  explicit Dev(size_t n) : n(n) {
    TETRA_CUDA_CHECK(cudaMalloc(&base, (n + 2 * kGuard) * sizeof(T)));
    TETRA_CUDA_CHECK(cudaMemset(base, 0xA5, (n + 2 * kGuard) * sizeof(T)));
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
    TETRA_CUDA_CHECK(cudaMemcpy(ptr(), v.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~Dev() { cudaFree(base); }
  T* ptr() { return base + kGuard; }
  std::vector<T> get() {
    std::vector<T> v(n);
    TETRA_CUDA_CHECK(cudaMemcpy(v.data(), ptr(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  bool guards_ok() {
    std::vector<unsigned char> all((n + 2 * kGuard) * sizeof(T));
    TETRA_CUDA_CHECK(cudaMemcpy(all.data(), base, all.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < kGuard * sizeof(T); ++i)
      if (all[i] != 0xA5 || all[all.size() - 1 - i] != 0xA5) return false;
    return true;
  }
  size_t n;
  T* base = nullptr;
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float a) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

TEST(SplitDecodeAttention, MatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(31);
  struct Case { int D, heads, kv_heads; std::vector<int> lens; int block_size; };
  const std::vector<Case> cases = {
      {128, 96, 8, {1, 63, 64, 65, 1025}, 16},
      {128, 32, 4, {0, 200, 4999}, 16},  // 4999 at one split: 79 chunks through the stages
      {64, 4, 2, {3, 129, 777}, 4},
      {64, 16, 1, {64, 1000}, 16},
      {128, 8, 8, {500, 2}, 8},
      {128, 15, 5, {31, 257}, 1},  // group 3: heads 3..15 of the MMA tile are padding
      {128, 24, 2, {100, 1500}, 12},  // a block size that is no power of two
  };
  for (const Case& c : cases) {
    const int S = int(c.lens.size());
    const int max_len = *std::max_element(c.lens.begin(), c.lens.end());
    const int mb = (max_len + c.block_size - 1) / c.block_size + 1;
    const int num_blocks = S * mb + 3;
    ops::AttentionShape sh;
    sh.n_heads = c.heads;
    sh.n_kv_heads = c.kv_heads;
    sh.head_dim = c.D;
    sh.scale = 1.0f / std::sqrt(float(c.D));
    sh.q_stride = int64_t(c.heads + 2) * c.D;  // wider rows, as a fused qkv output would be
    ASSERT_EQ(split_decode_unsupported_reason(sh), "");
    const size_t cache_elems = size_t(num_blocks) * c.block_size * c.kv_heads * c.D;
    auto kc = random_bf16(cache_elems, rng, 2.0f), vc = random_bf16(cache_elems, rng, 1.0f);
    auto q = random_bf16(size_t(S) * sh.q_step(), rng, 1.0f);
    std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> tables(size_t(S) * mb, -1);
    for (int s = 0; s < S; ++s)
      for (int b = 0; b * c.block_size < c.lens[size_t(s)]; ++b) tables[size_t(s) * mb + b] = perm[size_t(s) * mb + b];
    std::vector<int32_t> lens(c.lens.begin(), c.lens.end());
    ops::PagedKv kv;
    kv.k_cache = kc.data();
    kv.v_cache = vc.data();
    kv.block_tables = tables.data();
    kv.seq_lens = lens.data();
    kv.num_blocks = num_blocks;
    kv.block_size = c.block_size;
    kv.max_blocks_per_seq = mb;
    std::vector<uint16_t> want(size_t(S) * c.heads * c.D);
    ops::paged_decode_attention_cpu(q.data(), kv, S, sh, want.data());

    for (int splits : {0, 1, 3, 16}) {
    Dev<uint16_t> dq(q), dk(kc), dv(vc), dout(want.size());
    Dev<int32_t> dt(tables), dl(lens);
    TETRA_CUDA_CHECK(cudaMemset(dout.ptr(), 0xFF, want.size() * 2));
    ops::PagedKv dkv = kv;
    dkv.k_cache = dk.ptr();
    dkv.v_cache = dv.ptr();
    dkv.block_tables = dt.ptr();
    dkv.seq_lens = dl.ptr();
    TETRA_CUDA_CHECK(split_decode_attention(dq.ptr(), dkv, S, sh, dout.ptr(), nullptr, splits));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = dout.get();
    TETRA_CUDA_CHECK(cudaMemset(dout.ptr(), 0xFF, want.size() * 2));
    TETRA_CUDA_CHECK(split_decode_attention(dq.ptr(), dkv, S, sh, dout.ptr(), nullptr, splits));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(dout.get(), got) << "second launch, D=" << c.D << " splits " << splits;
    double err = 0, ref = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double g = bf16_to_float(got[i]), w = bf16_to_float(want[i]);
      ASSERT_TRUE(std::isfinite(g)) << "element " << i;
      err += (g - w) * (g - w);
      ref += w * w;
    }
    EXPECT_LE(err / ref, 1e-5) << "D=" << c.D << " heads=" << c.heads << "/" << c.kv_heads
                               << " splits " << splits;
    EXPECT_TRUE(dout.guards_ok());
    }
  }
}

TEST(SplitDecodeAttention, RefusesUnsupportedShapes) {
  ops::AttentionShape sh;
  sh.n_heads = 8;
  sh.n_kv_heads = 8;
  sh.head_dim = 32;
  EXPECT_NE(split_decode_unsupported_reason(sh), "");
  sh.head_dim = 128;
  sh.n_heads = 34 * 8 / 2;  // group 17
  sh.n_kv_heads = 8;
  EXPECT_NE(split_decode_unsupported_reason(sh), "");
  sh.n_heads = 96;  // supported, but more splits than the largest cluster
  EXPECT_EQ(split_decode_unsupported_reason(sh), "");
  ops::PagedKv kv;
  EXPECT_THROW(split_decode_attention(nullptr, kv, 0, sh, nullptr, nullptr, kMaxSplits + 1),
               Error);
}

}  // namespace
}  // namespace tetra::model::cuda
