// The DSA indexer ops (ops/attention/dsa.h) and MLA attention over a selection, against
// double-precision references written here: LayerNorm + RoPE of the index keys, the selection
// (every kept key scores at least as high as every dropped one, the count, causality, order),
// step-slot and paged addressing agreeing, and attention reading exactly the selected keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/attention/dsa.h"
#include "ops/attention/mla.h"

namespace tetra {
namespace {

using ops::DsaShape;

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float a) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

// One prefill of sequences `lens` (keys = the step's own tokens, at shuffled slots).
struct Step {
  std::vector<int32_t> cu = {0}, pos;  // [S + 1], [T]
  std::vector<int64_t> slots;          // [T]
  int64_t num_slots = 0;
  explicit Step(const std::vector<int>& lens, std::mt19937& rng) {
    for (int n : lens) {
      for (int i = 0; i < n; ++i) pos.push_back(i);
      cu.push_back(cu.back() + n);
    }
    num_slots = cu.back() + 7;
    std::vector<int64_t> all(static_cast<size_t>(num_slots));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    slots.assign(all.begin(), all.begin() + cu.back());
  }
  int T() const { return cu.back(); }
  int S() const { return int(cu.size()) - 1; }
};

TEST(DsaCpu, IndexKeysAreNormedAndTurned) {
  std::mt19937 rng(1);
  const DsaShape s{2, 32, 16, 8, ops::RopeStyle::NeoX};
  Step st({5}, rng);
  const auto wk = random_bf16(size_t(st.T()) * s.head_dim, rng, 3.0f);
  const auto ln_w = random_bf16(size_t(s.head_dim), rng, 1.5f);
  const auto ln_b = random_bf16(size_t(s.head_dim), rng, 0.5f);
  const std::vector<float> inv = ops::rope_inv_freq(10000.0, s.rope_dim);
  std::vector<uint16_t> cache(size_t(st.num_slots) * s.head_dim, 0x7fc0);  // NaN: unwritten
  std::vector<int64_t> slots = st.slots;
  slots[2] = -1;  // writes nothing
  ops::dsa_index_keys_cpu(wk.data(), ln_w.data(), ln_b.data(), 1e-6f, st.pos.data(), slots.data(),
                          st.T(), inv.data(), s, st.num_slots, cache.data());
  size_t written = 0;
  for (int64_t slot = 0; slot < st.num_slots; ++slot)
    written += std::isnan(bf16_to_float(cache[size_t(slot) * s.head_dim])) ? 0 : 1;
  EXPECT_EQ(written, size_t(st.T() - 1));
  for (int t = 0; t < st.T(); ++t) {
    if (slots[size_t(t)] < 0) continue;
    double mean = 0, var = 0;
    for (int i = 0; i < s.head_dim; ++i) mean += bf16_to_float(wk[size_t(t) * s.head_dim + i]);
    mean /= s.head_dim;
    for (int i = 0; i < s.head_dim; ++i) {
      const double d = bf16_to_float(wk[size_t(t) * s.head_dim + i]) - mean;
      var += d * d;
    }
    std::vector<double> k(static_cast<size_t>(s.head_dim));
    for (int i = 0; i < s.head_dim; ++i)
      k[size_t(i)] = (bf16_to_float(wk[size_t(t) * s.head_dim + i]) - mean) /
                         std::sqrt(var / s.head_dim + 1e-6) * bf16_to_float(ln_w[size_t(i)]) +
                     bf16_to_float(ln_b[size_t(i)]);
    const int half = s.rope_dim / 2;  // NeoX: i with i + half
    for (int i = 0; i < half; ++i) {
      const double a = st.pos[size_t(t)] * double(inv[size_t(i)]), x = k[size_t(i)], y = k[size_t(i + half)];
      k[size_t(i)] = x * std::cos(a) - y * std::sin(a);
      k[size_t(i + half)] = y * std::cos(a) + x * std::sin(a);
    }
    for (int i = 0; i < s.head_dim; ++i)
      EXPECT_NEAR(bf16_to_float(cache[size_t(slots[size_t(t)]) * s.head_dim + i]), k[size_t(i)],
                  0.02 * std::max(1.0, std::fabs(k[size_t(i)])))
          << "token " << t << " dim " << i;
  }
}

// Double-precision scores of token t's keys 0 .. pos (the same bf16 rounding of the turned q).
std::vector<double> ref_scores(const std::vector<uint16_t>& q, const std::vector<uint16_t>& w,
                               const std::vector<uint16_t>& cache, const Step& st, int t,
                               const std::vector<float>& inv, const DsaShape& s) {
  const int Hi = s.n_heads, D = s.head_dim;
  std::vector<float> qh(static_cast<size_t>(D));
  std::vector<double> score(size_t(st.pos[size_t(t)]) + 1, 0.0);
  const int first = [&] {
    int b = 0;
    while (st.cu[size_t(b) + 1] <= t) ++b;
    return st.cu[size_t(b)];
  }();
  for (int h = 0; h < Hi; ++h) {
    for (int i = 0; i < D; ++i) qh[size_t(i)] = bf16_to_float(q[(size_t(t) * Hi + h) * D + i]);
    ops::rope_rotate_f32(qh.data(), s.rope_dim, float(st.pos[size_t(t)]), inv.data(), s.style);
    for (float& x : qh) x = bf16_to_float(float_to_bf16(x));
    const double wh = bf16_to_float(w[size_t(t) * Hi + h]) / std::sqrt(double(Hi));
    for (size_t j = 0; j < score.size(); ++j) {
      double dot = 0;
      const int64_t slot = st.slots[size_t(first) + j];
      for (int i = 0; i < D; ++i) dot += double(qh[size_t(i)]) * bf16_to_float(cache[size_t(slot) * D + i]);
      score[j] += std::max(dot / std::sqrt(double(D)), 0.0) * wh;
    }
  }
  return score;
}

TEST(DsaCpu, SelectionKeepsTheBestKeysCausallyInOrder) {
  std::mt19937 rng(2);
  const DsaShape s{4, 32, 16, 6, ops::RopeStyle::GptJ};
  Step st({3, 17, 30}, rng);
  const int T = st.T();
  const std::vector<float> inv = ops::rope_inv_freq(10000.0, s.rope_dim);
  const auto q = random_bf16(size_t(T) * s.n_heads * s.head_dim, rng, 1.0f);
  const auto w = random_bf16(size_t(T) * s.n_heads, rng, 1.0f);
  const auto cache = random_bf16(size_t(st.num_slots) * s.head_dim, rng, 1.0f);
  std::vector<int32_t> sel(size_t(T) * s.topk, -7);
  ops::MlaKeys keys;
  keys.step_slots = st.slots.data();
  ops::dsa_select_cpu(q.data(), w.data(), cache.data(), st.num_slots, st.cu.data(), st.S(),
                      st.pos.data(), keys, inv.data(), s, sel.data());
  int sparse_rows = 0;
  for (int t = 0; t < T; ++t) {
    const int n = st.pos[size_t(t)] + 1, keep = std::min(s.topk, n);
    const std::vector<double> score = ref_scores(q, w, cache, st, t, inv, s);
    std::vector<bool> kept(static_cast<size_t>(n), false);
    for (int i = 0; i < keep; ++i) {
      const int32_t j = sel[size_t(t) * s.topk + i];
      ASSERT_TRUE(j >= 0 && j < n) << "token " << t << " selects " << j;
      if (i > 0) EXPECT_LT(sel[size_t(t) * s.topk + i - 1], j) << "ascending, no repeats";
      kept[size_t(j)] = true;
    }
    for (int i = keep; i < s.topk; ++i) EXPECT_EQ(sel[size_t(t) * s.topk + i], -7) << "untouched";
    double worst_kept = INFINITY, best_dropped = -INFINITY;
    for (int j = 0; j < n; ++j)
      (kept[size_t(j)] ? worst_kept : best_dropped) =
          kept[size_t(j)] ? std::min(worst_kept, score[size_t(j)]) : std::max(best_dropped, score[size_t(j)]);
    if (keep < n) {
      ++sparse_rows;
      EXPECT_GE(worst_kept, best_dropped - 1e-5) << "token " << t;
    }
  }
  EXPECT_GT(sparse_rows, 20) << "the test must exercise the sparse case";

  // The same keys through block tables: the same selection.
  const int bs = 4, mb = 8;
  std::vector<int32_t> tables(size_t(st.S()) * mb, -1);
  std::vector<int64_t> slots2(static_cast<size_t>(T));
  std::vector<uint16_t> cache2(size_t(st.S()) * mb * bs * s.head_dim);
  for (int b = 0; b < st.S(); ++b) {
    for (int k = 0; k < mb; ++k) tables[size_t(b) * mb + k] = (st.S() - 1 - b) * mb + k;
    for (int i = 0; i < st.cu[size_t(b) + 1] - st.cu[size_t(b)]; ++i) {
      const int t = st.cu[size_t(b)] + i;
      const int64_t slot = int64_t(tables[size_t(b) * mb + i / bs]) * bs + i % bs;
      std::copy_n(&cache[size_t(st.slots[size_t(t)]) * s.head_dim], s.head_dim, &cache2[size_t(slot) * s.head_dim]);
    }
  }
  ops::MlaKeys paged;
  paged.block_tables = tables.data();
  paged.max_blocks_per_seq = mb;
  paged.block_size = bs;
  std::vector<int32_t> sel2(sel.size(), -7);
  ops::dsa_select_cpu(q.data(), w.data(), cache2.data(), int64_t(cache2.size()) / s.head_dim,
                      st.cu.data(), st.S(), st.pos.data(), paged, inv.data(), s, sel2.data());
  EXPECT_EQ(sel2, sel);
}

// MLA attention over a selection reads exactly those keys: the result equals attention over a
// cache holding only them, and differs from the dense result.
TEST(DsaCpu, MlaAttentionReadsOnlyTheSelectedKeys) {
  std::mt19937 rng(3);
  const ops::MlaShape m{2, 32, 16, 16, 16, 0.2f, ops::RopeStyle::GptJ};
  const int n = 12, stride = 5;
  const std::vector<int32_t> cu = {0, 1}, pos = {n - 1};
  const auto cache = random_bf16(size_t(16) * m.row(), rng, 1.0f);  // one block of 16 slots
  const auto q_abs = random_bf16(size_t(m.n_heads) * m.row(), rng, 1.0f);
  const std::vector<int32_t> sel = {0, 3, 4, 8, 11};
  // A decode-like step: one token at position n - 1 over a cached prefix in block 0.
  const int32_t table[1] = {0};
  ops::MlaKeys keys;
  keys.block_tables = table;
  keys.max_blocks_per_seq = 1;
  keys.block_size = 16;
  keys.selected = sel.data();
  keys.selected_stride = stride;
  std::vector<uint16_t> got(size_t(m.n_heads) * m.kv_lora), dense(got.size()), want(got.size());
  ops::mla_attention_cpu(q_abs.data(), cache.data(), 16, cu.data(), 1, pos.data(), keys, m, got.data());
  keys.selected = nullptr;
  ops::mla_attention_cpu(q_abs.data(), cache.data(), 16, cu.data(), 1, pos.data(), keys, m, dense.data());
  // A cache of just the selected rows, attended densely by a query at position stride - 1.
  std::vector<uint16_t> small(size_t(16) * m.row());
  for (int i = 0; i < stride; ++i)
    std::copy_n(cache.begin() + sel[size_t(i)] * m.row(), m.row(), small.begin() + i * m.row());
  const std::vector<int32_t> pos_small = {stride - 1};
  keys.selected = nullptr;
  ops::mla_attention_cpu(q_abs.data(), small.data(), 16, cu.data(), 1, pos_small.data(), keys, m,
                         want.data());
  EXPECT_EQ(got, want);
  EXPECT_NE(got, dense);
  // A selected position past the query's is refused.
  const std::vector<int32_t> bad = {0, 3, 4, 8, 12};
  keys.selected = bad.data();
  keys.selected_stride = stride;
  EXPECT_THROW(ops::mla_attention_cpu(q_abs.data(), cache.data(), 16, cu.data(), 1, pos.data(), keys,
                                      m, got.data()),
               Error);
}

TEST(DsaCpu, BadShapesAreRefused) {
  EXPECT_NO_THROW(ops::check_dsa_shape({32, 128, 64, 2048, ops::RopeStyle::NeoX}));
  EXPECT_THROW(ops::check_dsa_shape({32, 128, 130, 2048, ops::RopeStyle::NeoX}), Error);
  EXPECT_THROW(ops::check_dsa_shape({32, 128, 63, 2048, ops::RopeStyle::NeoX}), Error);
  EXPECT_THROW(ops::check_dsa_shape({32, 128, 64, 0, ops::RopeStyle::NeoX}), Error);
}

}  // namespace
}  // namespace tetra
