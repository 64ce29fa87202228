// BF16 grouped MoE GEMMs vs a CPU double-accumulation reference on the same bf16 weights.
// Every case: fresh random data, outputs poisoned before each launch, guard elements around the
// outputs, rows owned by no expert must stay poisoned, NMSE <= 1e-5, no NaN/Inf.
#include <gtest/gtest.h>

#include <cmath>

#include "moe_gemm_test_util.h"
#include "ops/moe/bf16_moe.h"

namespace tetra {
namespace {

using namespace moe_test;

struct Case {
  std::string name;
  int E, H, I;
  std::vector<int> counts;  // [E] rows per expert
  bool masked = false;
  bool gather = false;
  bool slots = false;
  bool y_f32 = true;
};

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.name);
  std::mt19937 rng(seed);
  const int E = c.E, H = c.H, I = c.I;
  // Weights ~ N(0, 1/sqrt(k)) keep every intermediate O(1).
  const std::vector<uint16_t> w13 = random_bf16(size_t(E) * 2 * I * H, rng, 1.0f / std::sqrt(float(H)));
  const std::vector<uint16_t> w2 = random_bf16(size_t(E) * H * I, rng, 1.0f / std::sqrt(float(I)));
  const RowMap m = make_row_map(c.counts, c.masked, c.slots, c.gather, rng);
  const std::vector<uint16_t> x = random_bf16(size_t(m.x_rows) * H, rng);
  const std::vector<uint16_t> act_in = random_bf16(size_t(m.total) * I, rng);  // GEMM2's input

  std::vector<float> ref1(size_t(m.total) * I, 0.0f), ref2(size_t(m.total) * H, 0.0f);
  parallel_rows(m.total, [&](int r) {
    const int e = m.expert_of[size_t(r)];
    if (e < 0) return;
    const uint16_t* xr = &x[size_t(m.gather.empty() ? r : m.gather[size_t(r)]) * H];
    const uint16_t* we = &w13[size_t(e) * 2 * I * H];
    for (int n = 0; n < I; ++n) {
      double g = 0, u = 0;
      for (int k = 0; k < H; ++k) {
        const double xv = bf16_to_float(xr[k]);
        g += xv * bf16_to_float(we[size_t(n) * H + k]);
        u += xv * bf16_to_float(we[size_t(I + n) * H + k]);
      }
      ref1[size_t(r) * I + n] = float(g / (1.0 + std::exp(-g)) * u);
    }
    const uint16_t* wd = &w2[size_t(e) * H * I];
    for (int n = 0; n < H; ++n) {
      double y = 0;
      for (int k = 0; k < I; ++k)
        y += double(bf16_to_float(act_in[size_t(r) * I + k])) * bf16_to_float(wd[size_t(n) * I + k]);
      ref2[size_t(r) * H + n] = float(y);
    }
  });

  DevBuf<uint16_t> d_w13(w13.size()), d_w2(w2.size()), d_x(x.size()), d_act_in(act_in.size()),
      d_act(size_t(m.total) * I), d_y16(size_t(m.total) * H);
  DevBuf<float> d_y32(size_t(m.total) * H);
  d_w13.upload(w13);
  d_w2.upload(w2);
  d_x.upload(x);
  d_act_in.upload(act_in);
  DevRowMap dm(m);
  const MoeRows rows = dm.rows(m);
  const MoeGemmProblem p = make_problem(m, E, H, I);
  ASSERT_EQ(moe_bf16_unsupported_reason(p), "") << p;
  const MoeBf16WeightsDevice w{d_w13.ptr(), d_w2.ptr()};

  ASSERT_EQ(moe_bf16_gemm1(p, w, rows, d_x.ptr(), d_act.ptr(), nullptr), cudaSuccess);
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  const Stats s1 = compare(d_act.download_all(), m.total, I, m.expert_of, ref1);
  EXPECT_EQ(s1.bad, 0u);
  EXPECT_EQ(s1.poison_lost, 0u);
  EXPECT_LE(s1.nmse, 1e-5) << "gemm1 " << p;

  if (c.y_f32) {
    ASSERT_EQ(moe_bf16_gemm2(p, w, rows, d_act_in.ptr(), d_y32.ptr(), true, nullptr), cudaSuccess);
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    const Stats s2 = compare(d_y32.download_all(), m.total, H, m.expert_of, ref2);
    EXPECT_EQ(s2.bad, 0u);
    EXPECT_EQ(s2.poison_lost, 0u);
    EXPECT_LE(s2.nmse, 1e-5) << "gemm2 f32 " << p;
  } else {
    ASSERT_EQ(moe_bf16_gemm2(p, w, rows, d_act_in.ptr(), d_y16.ptr(), false, nullptr), cudaSuccess);
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    const Stats s2 = compare(d_y16.download_all(), m.total, H, m.expert_of, ref2);
    EXPECT_EQ(s2.bad, 0u);
    EXPECT_EQ(s2.poison_lost, 0u);
    EXPECT_LE(s2.nmse, 1e-5) << "gemm2 bf16 " << p;
  }
}

class Bf16Moe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(Bf16Moe, Glm5ShapeSmallCounts) {
  run_case({"glm5", 6, 6144, 2048, {1, 0, 3, 19, 0, 2}}, 11);
}
TEST_F(Bf16Moe, RowsPerExpertUpTo989Contiguous) {
  run_case({"counts", 7, 512, 256, {1, 3, 19, 99, 989, 0, 64}}, 12);
}
TEST_F(Bf16Moe, RowsPerExpertUpTo989MaskedSlotsGather) {
  Case c{"masked", 6, 512, 320, {989, 0, 99, 1, 19, 3}};
  c.masked = true;
  c.slots = true;
  c.gather = true;
  run_case(c, 13);
}
TEST_F(Bf16Moe, AllRowsOnOneExpertBf16Out) {
  Case c{"one-expert", 4, 1024, 512, {0, 0, 300, 0}};
  c.y_f32 = false;
  run_case(c, 14);
}
TEST_F(Bf16Moe, OddSizesNotMultiplesOfTiles) {
  // H and I multiples of 8 only: partial k chunks, partial weight tiles, partial token tiles.
  run_case({"h72-i40", 3, 72, 40, {5, 0, 67}}, 15);
  Case c{"h200-i136-masked", 4, 200, 136, {3, 130, 0, 1}};
  c.masked = true;
  c.gather = true;
  run_case(c, 16);
}
TEST_F(Bf16Moe, EveryExpertEmptyMasked) {
  Case c{"empty", 3, 64, 64, {0, 0, 0}};
  c.masked = true;  // rows exist (gaps) but none is owned: all must stay poisoned
  run_case(c, 17);
}

TEST_F(Bf16Moe, UnsupportedSizeIsRefusedWithReason) {
  MoeGemmProblem p;
  p.num_experts = 2;
  p.hidden = 100;  // not a multiple of 8
  p.inter = 64;
  p.total_rows = 4;
  const std::string why = moe_bf16_unsupported_reason(p);
  EXPECT_NE(why.find("hidden size 100"), std::string::npos) << why;
  MoeBf16WeightsDevice w;
  MoeRows rows;
  EXPECT_EQ(moe_bf16_gemm1(p, w, rows, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
  p.hidden = 64;
  EXPECT_EQ(moe_bf16_gemm2(p, w, rows, nullptr, nullptr, true, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tetra
