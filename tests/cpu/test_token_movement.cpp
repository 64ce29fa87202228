// CPU permute and combine: rows land where slot_of says, untouched rows keep their bytes, and
// the combine equals the weighted sum computed directly in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "moe/token_layout.h"
#include "moe/token_movement.h"

using namespace tetra;
using namespace tetra::moe;

namespace {

constexpr uint16_t kPoison = 0xA5A5;

std::vector<int32_t> distinct_ids(int T, int K, int E, std::mt19937& rng) {
  std::vector<int32_t> ids(size_t(T) * K);
  for (int t = 0; t < T; ++t) {
    std::vector<int32_t> perm(E);
    for (int e = 0; e < E; ++e) perm[e] = e;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < K; ++j) ids[size_t(t) * K + j] = perm[j];
  }
  return ids;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = float_to_bf16(nd(rng));
  return v;
}

}  // namespace

TEST(Permute, MaskedRowsHoldTheirTokensAndEmptyRowsAreUntouched) {
  std::mt19937 rng(5);
  const int T = 19, K = 3, E = 8, H = 24;
  const std::vector<int32_t> ids = distinct_ids(T, K, E, rng);
  const MaskedLayout L = build_masked_cpu(ids.data(), T, K, E, 16);
  const std::vector<uint16_t> x = random_bf16(size_t(T) * H, rng);
  std::vector<uint16_t> rows(size_t(L.num_rows()) * H, kPoison);
  permute_rows_cpu(x.data(), T, H, K, L.slot_of.data(), rows.data());
  for (int r = 0; r < L.num_rows(); ++r) {
    const int t = L.row_token[r];
    for (int h = 0; h < H; ++h) {
      const uint16_t want = t >= 0 ? x[size_t(t) * H + h] : kPoison;
      ASSERT_EQ(rows[size_t(r) * H + h], want) << "row " << r << " h " << h;
    }
  }
}

TEST(Permute, ContiguousRowsAreTheTokensInExpertOrder) {
  std::mt19937 rng(6);
  const int T = 7, K = 2, E = 4, H = 5;
  const std::vector<int32_t> ids = distinct_ids(T, K, E, rng);
  const ContiguousLayout L = build_contiguous_cpu(ids.data(), T, K, E);
  std::vector<float> x(size_t(T) * H);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);  // value names its (token, h)
  std::vector<float> rows(size_t(T) * K * H, -1.0f);
  permute_rows_cpu(x.data(), T, H, K, L.slot_of.data(), rows.data());
  for (int r = 0; r < T * K; ++r)
    for (int h = 0; h < H; ++h) ASSERT_EQ(rows[size_t(r) * H + h], float(L.slot_token[r] * H + h));
}

TEST(Combine, Bf16EqualsTheDirectWeightedSum) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uw(0.0f, 1.0f);
  const int T = 13, K = 4, E = 10, H = 33;
  const std::vector<int32_t> ids = distinct_ids(T, K, E, rng);
  const ContiguousLayout L = build_contiguous_cpu(ids.data(), T, K, E);
  const std::vector<uint16_t> rows = random_bf16(size_t(T) * K * H, rng);
  const std::vector<uint16_t> shared = random_bf16(size_t(T) * H, rng);
  const std::vector<uint16_t> resid = random_bf16(size_t(T) * H, rng);
  std::vector<float> w(size_t(T) * K);
  for (float& v : w) v = uw(rng);
  std::vector<int32_t> slot_of = L.slot_of;
  slot_of[5] = -1;  // a dropped pair contributes nothing
  for (int variant = 0; variant < 3; ++variant) {
    const float* wp = variant == 2 ? nullptr : w.data();
    const uint16_t* sp = variant >= 1 ? shared.data() : nullptr;
    const uint16_t* rp = variant >= 1 ? resid.data() : nullptr;
    std::vector<uint16_t> out(size_t(T) * H, kPoison);
    combine_bf16_cpu(rows.data(), DType::BF16, T, H, K, slot_of.data(), wp, sp, rp, out.data());
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < H; ++h) {
        double want = 0;
        for (int j = 0; j < K; ++j) {
          const int32_t row = slot_of[size_t(t) * K + j];
          if (row < 0) continue;
          want += (wp ? double(w[size_t(t) * K + j]) : 1.0) * bf16_to_float(rows[size_t(row) * H + h]);
        }
        if (sp) want += bf16_to_float(shared[size_t(t) * H + h]);
        if (rp) want += bf16_to_float(resid[size_t(t) * H + h]);
        const float got = bf16_to_float(out[size_t(t) * H + h]);
        // One bf16 rounding of a float32 sum: within half a bf16 ulp plus float noise.
        ASSERT_NEAR(got, want, std::fabs(want) * (1.0 / 256) + 1e-6)
            << "variant " << variant << " t " << t << " h " << h;
      }
    }
  }
}

TEST(Combine, F32RowsAndF32OutputAgreeWithBf16Path) {
  std::mt19937 rng(8);
  const int T = 5, K = 2, E = 3, H = 16;
  const std::vector<int32_t> ids = distinct_ids(T, K, E, rng);
  const MaskedLayout L = build_masked_cpu(ids.data(), T, K, E, T);
  std::normal_distribution<float> nd;
  std::vector<float> rows(size_t(L.num_rows()) * H);
  for (float& v : rows) v = nd(rng);
  const std::vector<float> w = {0.5f, 0.25f, 1.0f, 2.0f, 0.75f, 0.125f, 1.5f, 0.5f, 0.0f, 3.0f};
  std::vector<float> out32(size_t(T) * H);
  combine_f32_cpu(rows.data(), T, H, K, L.slot_of.data(), w.data(), out32.data());
  std::vector<uint16_t> out16(size_t(T) * H);
  combine_bf16_cpu(rows.data(), DType::F32, T, H, K, L.slot_of.data(), w.data(), nullptr, nullptr,
                   out16.data());
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      double want = 0;
      for (int j = 0; j < K; ++j)
        want += double(w[t * K + j]) * rows[size_t(L.slot_of[t * K + j]) * H + h];
      EXPECT_NEAR(out32[t * H + h], want, 1e-6 * (1 + std::fabs(want)));
      EXPECT_EQ(out16[t * H + h], float_to_bf16(out32[t * H + h]));  // same sum, then rounded
    }
  }
  EXPECT_THROW(combine_bf16_cpu(rows.data(), DType::F16, T, H, K, L.slot_of.data(), w.data(),
                                nullptr, nullptr, out16.data()),
               Error);
}
