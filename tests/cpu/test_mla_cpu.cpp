// The absorbed MLA ops (ops/attention/mla.h) against the textbook, unabsorbed form computed
// here in double: per head k_nope = W_uk c, v = W_uv c, scores over [q_nope | q_pe] .
// [k_nope | k_pe]. The two differ only by the bf16 roundings of q_abs and out_lat, so they
// must agree to ~bf16 precision; a wrong head offset, transposed weight, missing RoPE or
// norm moves the result by O(1). Also: paged and step-slot key addressing agree bit for bit,
// negative slots write nothing, and bad shapes are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/attention/mla.h"

namespace tetra {
namespace {

using ops::MlaShape;

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float a) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

std::vector<double> to_double(const uint16_t* p, size_t n) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = bf16_to_float(p[i]);
  return v;
}

// Rotates x [d] at pos with the style's pairs (double).
void rotate(double* x, int d, double pos, const std::vector<float>& inv_freq, ops::RopeStyle st) {
  for (int i = 0; i < d / 2; ++i) {
    const double a = pos * double(inv_freq[size_t(i)]);
    const int ia = st == ops::RopeStyle::NeoX ? i : 2 * i;
    const int ib = st == ops::RopeStyle::NeoX ? i + d / 2 : 2 * i + 1;
    const double u = x[ia], w = x[ib];
    x[ia] = u * std::cos(a) - w * std::sin(a);
    x[ib] = w * std::cos(a) + u * std::sin(a);
  }
}

struct Problem {
  MlaShape s;
  std::vector<int> lens;  // tokens per sequence (one prefill, keys = the step's own tokens)
};

void run(const Problem& pb, std::mt19937& rng) {
  const MlaShape& s = pb.s;
  const int H = s.n_heads, Dl = s.kv_lora, Dr = s.rope_dim, nope = s.nope_dim, V = s.v_dim;
  std::vector<int32_t> cu = {0}, pos;  // [S + 1], [T]
  for (int n : pb.lens) {
    for (int i = 0; i < n; ++i) pos.push_back(i);
    cu.push_back(cu.back() + n);
  }
  const int T = cu.back(), S = int(pb.lens.size());
  const std::vector<float> inv_freq = ops::rope_inv_freq(10000.0, Dr);
  const auto q = random_bf16(size_t(T) * H * s.q_head(), rng, 1.0f);       // [T, H, nope + Dr]
  const auto kv_a = random_bf16(size_t(T) * s.row(), rng, 2.0f);          // [T, Dl + Dr]
  const auto norm_w = random_bf16(size_t(Dl), rng, 1.5f);                 // [Dl]
  const auto kv_b = random_bf16(size_t(H) * s.kv_b_rows_per_head() * Dl, rng,
                                float(1.0 / std::sqrt(double(Dl))));        // [H (nope + V), Dl]

  // Slots: a shuffled cache of 16-token blocks with room to spare; the last token's slot is
  // written twice below (negative slot first) to check that -1 writes nothing.
  const int bs = 16, mb = (*std::max_element(pb.lens.begin(), pb.lens.end()) + bs - 1) / bs;
  const int num_blocks = S * mb + 3;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(size_t(S) * mb, -1);  // [S, mb]
  std::vector<int64_t> slots(static_cast<size_t>(T));
  for (int b = 0; b < S; ++b) {
    for (int j = 0; j < mb; ++j) tables[size_t(b) * mb + j] = ids[size_t(b) * mb + j];
    for (int i = 0; i < pb.lens[size_t(b)]; ++i)
      slots[size_t(cu[b] + i)] = int64_t(tables[size_t(b) * mb + i / bs]) * bs + i % bs;
  }
  const int64_t num_slots = int64_t(num_blocks) * bs;
  std::vector<uint16_t> cache(size_t(num_slots) * s.row(), 0x7fc0);  // NaN: unwritten rows

  // A negative slot writes nothing.
  std::vector<int64_t> none(static_cast<size_t>(T), -1);
  ops::mla_cache_write_cpu(kv_a.data(), norm_w.data(), 1e-6f, pos.data(), none.data(), T,
                           inv_freq.data(), s, num_slots, cache.data());
  for (uint16_t v : cache) ASSERT_EQ(v, 0x7fc0);
  ops::mla_cache_write_cpu(kv_a.data(), norm_w.data(), 1e-6f, pos.data(), slots.data(), T,
                           inv_freq.data(), s, num_slots, cache.data());

  std::vector<uint16_t> q_abs(size_t(T) * H * s.row()), lat(size_t(T) * H * Dl),
      out(size_t(T) * H * V), out_paged(out.size());
  ops::mla_absorb_q_cpu(q.data(), kv_b.data(), pos.data(), T, inv_freq.data(), s, q_abs.data());
  ops::MlaKeys by_slots;
  by_slots.step_slots = slots.data();
  ops::mla_attention_cpu(q_abs.data(), cache.data(), num_slots, cu.data(), S, pos.data(),
                         by_slots, s, lat.data());
  ops::mla_up_v_cpu(lat.data(), kv_b.data(), T, s, out.data());
  // The same keys through the block tables: the same bits.
  ops::MlaKeys paged;
  paged.block_tables = tables.data();
  paged.max_blocks_per_seq = mb;
  paged.block_size = bs;
  std::vector<uint16_t> lat_paged(lat.size());
  ops::mla_attention_cpu(q_abs.data(), cache.data(), num_slots, cu.data(), S, pos.data(), paged,
                         s, lat_paged.data());
  EXPECT_EQ(lat_paged, lat);

  // The unabsorbed reference, in double from the bf16 inputs.
  const std::vector<double> W = to_double(kv_b.data(), kv_b.size());
  std::vector<double> c(size_t(T) * Dl), kpe(size_t(T) * Dr);  // [T, Dl], [T, Dr]
  for (int t = 0; t < T; ++t) {
    const std::vector<double> x = to_double(kv_a.data() + size_t(t) * s.row(), size_t(s.row()));
    double ss = 0;
    for (int i = 0; i < Dl; ++i) ss += x[size_t(i)] * x[size_t(i)];
    const double r = 1.0 / std::sqrt(ss / Dl + 1e-6);
    for (int i = 0; i < Dl; ++i) c[size_t(t) * Dl + i] = x[size_t(i)] * r * bf16_to_float(norm_w[size_t(i)]);
    for (int i = 0; i < Dr; ++i) kpe[size_t(t) * Dr + i] = x[size_t(Dl + i)];
    rotate(&kpe[size_t(t) * Dr], Dr, pos[size_t(t)], inv_freq, s.style);
  }
  double err = 0, ref_sq = 0;
  for (int b = 0; b < S; ++b)
    for (int t = cu[b]; t < cu[b + 1]; ++t)
      for (int h = 0; h < H; ++h) {
        std::vector<double> qh = to_double(q.data() + (size_t(t) * H + h) * s.q_head(), size_t(s.q_head()));
        rotate(&qh[size_t(nope)], Dr, pos[size_t(t)], inv_freq, s.style);
        const double* Wh = &W[size_t(h) * s.kv_b_rows_per_head() * Dl];  // [nope + V, Dl]
        std::vector<double> score;
        std::vector<std::vector<double>> vals;
        for (int j = cu[b]; j <= t; ++j) {
          double dot = 0;
          for (int n = 0; n < nope; ++n) {
            double k = 0;
            for (int i = 0; i < Dl; ++i) k += Wh[size_t(n) * Dl + i] * c[size_t(j) * Dl + i];
            dot += qh[size_t(n)] * k;
          }
          for (int i = 0; i < Dr; ++i) dot += qh[size_t(nope + i)] * kpe[size_t(j) * Dr + i];
          score.push_back(dot * s.scale);
          std::vector<double> v(static_cast<size_t>(V));
          for (int d = 0; d < V; ++d)
            for (int i = 0; i < Dl; ++i) v[size_t(d)] += Wh[size_t(nope + d) * Dl + i] * c[size_t(j) * Dl + i];
          vals.push_back(v);
        }
        const double mx = *std::max_element(score.begin(), score.end());
        double sum = 0;
        for (double& x : score) sum += (x = std::exp(x - mx));
        for (int d = 0; d < V; ++d) {
          double want = 0;
          for (size_t j = 0; j < score.size(); ++j) want += score[j] / sum * vals[j][size_t(d)];
          const double got = bf16_to_float(out[(size_t(t) * H + h) * V + d]);
          err += (got - want) * (got - want);
          ref_sq += want * want;
        }
      }
  ASSERT_GT(ref_sq / (double(T) * H * V), 1e-4) << "the reference itself is trivial";
  // The bf16 roundings of q_abs, the cache, out_lat and out: measured 6.9e-6 .. 8.0e-6.
  EXPECT_LT(err / ref_sq, 5e-5) << "H " << H << " Dl " << Dl << " Dr " << Dr;
}

TEST(MlaCpu, AbsorbedEqualsUnabsorbed) {
  std::mt19937 rng(11);
  run({{4, 32, 16, 32, 32, 1.0f / std::sqrt(48.0f), ops::RopeStyle::GptJ}, {1, 5, 17}}, rng);
  run({{3, 48, 8, 16, 24, 1.0f / std::sqrt(24.0f), ops::RopeStyle::NeoX}, {9, 2}}, rng);
  // GLM-5's head shape (nope 192, v 256) with fewer heads and a short latent.
  run({{2, 64, 64, 192, 256, 1.0f / 16.0f, ops::RopeStyle::GptJ}, {6}}, rng);
}

TEST(MlaCpu, WrongWeightRowsWouldBeCaught) {
  // Swapping the roles of W_uk and W_uv (a wrong head layout) must break the comparison the
  // test above makes: the error is O(1), far above its 2e-4.
  std::mt19937 rng(12);
  const MlaShape s{2, 32, 16, 32, 32, 1.0f / std::sqrt(48.0f), ops::RopeStyle::GptJ};
  const int T = 3;
  std::vector<int32_t> pos = {0, 1, 2};
  const std::vector<float> inv_freq = ops::rope_inv_freq(10000.0, s.rope_dim);
  const auto q = random_bf16(size_t(T) * s.n_heads * s.q_head(), rng, 1.0f);
  const auto kv_b = random_bf16(size_t(s.n_heads) * s.kv_b_rows_per_head() * s.kv_lora, rng, 0.2f);
  std::vector<uint16_t> swapped = kv_b;  // head 0 and head 1 exchanged
  const size_t per_head = size_t(s.kv_b_rows_per_head()) * s.kv_lora;
  std::swap_ranges(swapped.begin(), swapped.begin() + per_head, swapped.begin() + per_head);
  std::vector<uint16_t> a(size_t(T) * s.n_heads * s.row()), b(a.size());
  ops::mla_absorb_q_cpu(q.data(), kv_b.data(), pos.data(), T, inv_freq.data(), s, a.data());
  ops::mla_absorb_q_cpu(q.data(), swapped.data(), pos.data(), T, inv_freq.data(), s, b.data());
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = bf16_to_float(a[i]), y = bf16_to_float(b[i]);
    diff += (x - y) * (x - y);
    ref += x * x;
  }
  EXPECT_GT(diff / ref, 0.1);
}

TEST(MlaCpu, BadShapesAreRefused) {
  MlaShape s{4, 32, 16, 32, 32, 0.1f, ops::RopeStyle::GptJ};
  EXPECT_NO_THROW(ops::check_mla_shape(s));
  MlaShape odd_rope = s;
  odd_rope.rope_dim = 15;
  EXPECT_THROW(ops::check_mla_shape(odd_rope), Error);
  MlaShape no_heads = s;
  no_heads.n_heads = 0;
  EXPECT_THROW(ops::check_mla_shape(no_heads), Error);
  MlaShape nan_scale = s;
  nan_scale.scale = NAN;
  EXPECT_THROW(ops::check_mla_shape(nan_scale), Error);
}

TEST(MlaCpu, KeysOutsideTheCacheAreRefused) {
  const MlaShape s{1, 16, 2, 2, 2, 0.5f, ops::RopeStyle::GptJ};
  std::vector<uint16_t> q_abs(size_t(s.row())), cache(size_t(4) * s.row()), out(16);
  const int32_t cu[2] = {0, 1}, pos[1] = {0};
  const int64_t slot[1] = {4};  // one past the 4-slot cache
  ops::MlaKeys k;
  k.step_slots = slot;
  EXPECT_THROW(ops::mla_attention_cpu(q_abs.data(), cache.data(), 4, cu, 1, pos, k, s, out.data()),
               Error);
}

}  // namespace
}  // namespace tetra
