// Attention CPU reference: closed-form cases (one key -> its value; equal keys -> mean of values),
// an independent double-precision computation with GQA, varlen isolation, strided (fused qkv)
// inputs, and paged decode through a scrambled block table against prefill of the same tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/attention/attention.h"

namespace tetra::ops {
namespace {

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float a = 1.0f) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}
float f(uint16_t b) { return bf16_to_float(b); }

AttentionShape shape(int hq, int hk, int d) {
  return AttentionShape{hq, hk, d, 1.0f / std::sqrt(float(d)), 0, 0};
}

TEST(AttentionRef, FirstTokenOfEachSequenceReturnsItsValue) {
  std::mt19937 rng(1);
  const auto s = shape(4, 2, 16);
  const std::vector<int32_t> cu = {0, 3, 4, 9};
  const int T = 9;
  auto q = random_bf16(T * 4 * 16, rng), k = random_bf16(T * 2 * 16, rng), v = random_bf16(T * 2 * 16, rng);
  std::vector<uint16_t> out(q.size());
  prefill_attention_cpu(q.data(), k.data(), v.data(), cu.data(), 3, s, out.data());
  for (int b = 0; b < 3; ++b)
    for (int h = 0; h < 4; ++h)
      for (int d = 0; d < 16; ++d)
        EXPECT_EQ(out[(cu[b] * 4 + h) * 16 + d], v[(cu[b] * 2 + h / 2) * 16 + d]);
}

TEST(AttentionRef, EqualKeysAverageTheValues) {
  std::mt19937 rng(2);
  const auto s = shape(1, 1, 8);
  const int T = 5;
  auto q = random_bf16(T * 8, rng), v = random_bf16(T * 8, rng);
  auto k0 = random_bf16(8, rng);
  std::vector<uint16_t> k;
  for (int t = 0; t < T; ++t) k.insert(k.end(), k0.begin(), k0.end());
  const std::vector<int32_t> cu = {0, T};
  std::vector<uint16_t> out(q.size());
  prefill_attention_cpu(q.data(), k.data(), v.data(), cu.data(), 1, s, out.data());
  for (int t = 0; t < T; ++t)
    for (int d = 0; d < 8; ++d) {
      double mean = 0;
      for (int j = 0; j <= t; ++j) mean += f(v[j * 8 + d]) / (t + 1);
      EXPECT_NEAR(f(out[t * 8 + d]), mean, 0.004 * std::abs(mean) + 1e-6) << t << "," << d;
    }
}

TEST(AttentionRef, MatchesIndependentDoubleComputationWithGqa) {
  std::mt19937 rng(3);
  const int Hq = 6, Hk = 2, D = 32, T = 23;
  const auto s = shape(Hq, Hk, D);
  auto q = random_bf16(T * Hq * D, rng, 2.0f), k = random_bf16(T * Hk * D, rng, 2.0f);
  auto v = random_bf16(T * Hk * D, rng);
  const std::vector<int32_t> cu = {0, 10, T};
  std::vector<uint16_t> out(q.size());
  prefill_attention_cpu(q.data(), k.data(), v.data(), cu.data(), 2, s, out.data());
  for (int t = 0; t < T; ++t) {
    const int start = t < 10 ? 0 : 10;
    for (int h = 0; h < Hq; ++h) {
      const int kh = h / 3;
      std::vector<double> sc;
      for (int j = start; j <= t; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double(f(q[(t * Hq + h) * D + d])) * f(k[(j * Hk + kh) * D + d]);
        sc.push_back(dot / std::sqrt(double(D)));
      }
      const double mx = *std::max_element(sc.begin(), sc.end());
      double den = 0;
      for (auto& x : sc) den += (x = std::exp(x - mx));
      for (int d = 0; d < D; ++d) {
        double num = 0;
        for (int j = start; j <= t; ++j) num += sc[j - start] * f(v[(j * Hk + kh) * D + d]);
        EXPECT_NEAR(f(out[(t * Hq + h) * D + d]), num / den, 0.004 * std::abs(num / den) + 1e-4);
      }
    }
  }
}

TEST(AttentionRef, SequencesDoNotSeeEachOther) {
  std::mt19937 rng(4);
  const auto s = shape(2, 1, 16);
  const std::vector<int32_t> cu = {0, 7, 12};
  auto q = random_bf16(12 * 32, rng), k = random_bf16(12 * 16, rng), v = random_bf16(12 * 16, rng);
  std::vector<uint16_t> a(q.size()), b(q.size());
  prefill_attention_cpu(q.data(), k.data(), v.data(), cu.data(), 2, s, a.data());
  for (size_t i = 7 * 16; i < k.size(); ++i) k[i] ^= 0x0100, v[i] ^= 0x0100;  // change sequence 1
  prefill_attention_cpu(q.data(), k.data(), v.data(), cu.data(), 2, s, b.data());
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 7 * 32, b.begin()));
  EXPECT_FALSE(std::equal(a.begin() + 7 * 32, a.end(), b.begin() + 7 * 32));
}

TEST(AttentionRef, ReadsQkvFromAFusedBuffer) {
  std::mt19937 rng(5);
  const int Hq = 4, Hk = 2, D = 16, T = 9, W = (Hq + 2 * Hk) * D;
  auto qkv = random_bf16(T * W, rng);  // [T, q | k | v]
  std::vector<uint16_t> q, k, v;
  for (int t = 0; t < T; ++t) {
    q.insert(q.end(), qkv.begin() + t * W, qkv.begin() + t * W + Hq * D);
    k.insert(k.end(), qkv.begin() + t * W + Hq * D, qkv.begin() + t * W + (Hq + Hk) * D);
    v.insert(v.end(), qkv.begin() + t * W + (Hq + Hk) * D, qkv.begin() + (t + 1) * W);
  }
  const std::vector<int32_t> cu = {0, T};
  auto packed = shape(Hq, Hk, D), strided = packed;
  strided.q_stride = strided.kv_stride = W;
  std::vector<uint16_t> a(T * Hq * D), b(a.size());
  prefill_attention_cpu(q.data(), k.data(), v.data(), cu.data(), 1, packed, a.data());
  prefill_attention_cpu(qkv.data(), qkv.data() + Hq * D, qkv.data() + (Hq + Hk) * D, cu.data(), 1,
                        strided, b.data());
  EXPECT_EQ(a, b);
}

TEST(AttentionRef, PagedDecodeOfLastTokenEqualsPrefill) {
  std::mt19937 rng(6);
  const int Hq = 8, Hk = 2, D = 32, bs = 4, num_blocks = 20;
  const auto s = shape(Hq, Hk, D);
  const std::vector<int> lens = {13, 1, 8};
  std::vector<int32_t> cu = {0};
  for (int L : lens) cu.push_back(cu.back() + L);
  const int T = cu.back();
  auto q = random_bf16(T * Hq * D, rng), k = random_bf16(T * Hk * D, rng), v = random_bf16(T * Hk * D, rng);
  std::vector<uint16_t> ref(q.size());
  prefill_attention_cpu(q.data(), k.data(), v.data(), cu.data(), 3, s, ref.data());

  // Scrambled block ids, tables [3, 5] with -1 past each sequence's blocks.
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int maxb = 5;
  std::vector<int32_t> tables(3 * maxb, -1), seq_lens(lens.begin(), lens.end());
  std::vector<int64_t> slots(T);
  int next = 0;
  for (int b = 0; b < 3; ++b) {
    for (int j = 0; j < (lens[b] + bs - 1) / bs; ++j) tables[b * maxb + j] = ids[next++];
    for (int j = 0; j < lens[b]; ++j) slots[cu[b] + j] = int64_t(tables[b * maxb + j / bs]) * bs + j % bs;
  }
  std::vector<uint16_t> kc(num_blocks * bs * Hk * D, 0xffff), vc(kc.size(), 0xffff);  // NaN poison
  write_kv_cache_cpu(k.data(), v.data(), slots.data(), T, s, num_blocks, bs, kc.data(), vc.data());

  std::vector<uint16_t> q_last;  // [3, Hq, D]: each sequence's last query
  for (int b = 0; b < 3; ++b)
    q_last.insert(q_last.end(), q.begin() + (cu[b + 1] - 1) * Hq * D, q.begin() + cu[b + 1] * Hq * D);
  PagedKv kv{kc.data(), vc.data(), tables.data(), seq_lens.data(), num_blocks, bs, maxb};
  std::vector<uint16_t> out(q_last.size());
  paged_decode_attention_cpu(q_last.data(), kv, 3, s, out.data());
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < Hq * D; ++i)
      ASSERT_EQ(out[b * Hq * D + i], ref[(cu[b + 1] - 1) * Hq * D + i]) << "seq " << b;
}

TEST(AttentionRef, CacheWriteSkipsNegativeSlotsAndRefusesOverflow) {
  const auto s = shape(1, 1, 2);
  const std::vector<uint16_t> k = {1, 2, 3, 4}, v = {5, 6, 7, 8};
  std::vector<uint16_t> kc(8, 0), vc(8, 0);
  const std::vector<int64_t> slots = {-1, 2};
  write_kv_cache_cpu(k.data(), v.data(), slots.data(), 2, s, 2, 2, kc.data(), vc.data());
  EXPECT_EQ(kc, (std::vector<uint16_t>{0, 0, 0, 0, 3, 4, 0, 0}));
  EXPECT_EQ(vc, (std::vector<uint16_t>{0, 0, 0, 0, 7, 8, 0, 0}));
  const std::vector<int64_t> bad = {4, 0};
  EXPECT_THROW(write_kv_cache_cpu(k.data(), v.data(), bad.data(), 2, s, 2, 2, kc.data(), vc.data()),
               Error);
}

TEST(AttentionRef, BlockCopiesDuplicateWholeBlocks) {
  // 3 blocks of 4 elements; copy 0 -> 2 and 1 -> 0 in that order.
  std::vector<uint16_t> kc = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, vc = kc;
  for (auto& x : vc) x += 100;
  const std::vector<int32_t> pairs = {0, 2, 1, 0};
  copy_kv_blocks_cpu(kc.data(), vc.data(), pairs.data(), 2, 3, 4);
  EXPECT_EQ(kc, (std::vector<uint16_t>{5, 6, 7, 8, 5, 6, 7, 8, 1, 2, 3, 4}));
  EXPECT_EQ(vc, (std::vector<uint16_t>{105, 106, 107, 108, 105, 106, 107, 108, 101, 102, 103, 104}));
  const std::vector<int32_t> bad = {0, 3};
  EXPECT_THROW(copy_kv_blocks_cpu(kc.data(), vc.data(), bad.data(), 1, 3, 4), Error);
}

TEST(AttentionRef, RefusesBadShapes) {
  EXPECT_THROW(check_attention_shape(shape(6, 4, 16)), Error);
  EXPECT_THROW(check_attention_shape(AttentionShape{4, 2, 16, 0.0f, 0, 0}), Error);
  EXPECT_THROW(check_attention_shape(AttentionShape{4, 2, 16, 0.25f, 32, 0}), Error);
}

}  // namespace
}  // namespace tetra::ops
