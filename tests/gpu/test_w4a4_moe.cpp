// W4A4 grouped MoE GEMMs vs their CPU twin (moe/w4a4_reference.h) on the same NVFP4 weights.
//   - the grouped activation quantizer equals the CPU quantize_activation bit for bit;
//   - GEMM1 (quantize x, GEMM, SiLU*up, quantize act) and GEMM2: NMSE <= 1e-5 against the twin,
//     for both kernels, both layouts, gather and expert slots, empty experts;
//   - outputs poisoned before each launch, guard elements, unowned rows stay poisoned, no NaN/Inf.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "format/nvfp4.h"
#include "moe/expert_weights.h"
#include "moe/w4a4_reference.h"
#include "moe/w4a4_scales.h"
#include "moe/wgmma_order.h"
#include "moe_gemm_test_util.h"
#include "ops/moe/w4a16_weights.h"
#include "ops/moe/w4a4_moe.h"
#include "wgmma_order_rows.h"

namespace tetra {
namespace {

using namespace moe_test;

struct Matrix {  // one ModelOpt NVFP4 linear
  int n = 0, k = 0;
  float s2 = 1.0f;
  std::vector<uint8_t> weight;  // [n, k/2] e2m1 pairs
  std::vector<uint8_t> scale;   // [n, k/16] e4m3
  void fill(int n_, int k_, float s2_, std::mt19937& rng) {
    n = n_, k = k_, s2 = s2_;
    weight.resize(size_t(n) * k / 2);
    scale.resize(size_t(n) * k / 16);
    for (auto& b : weight) b = uint8_t(rng());
    for (auto& s : scale) {  // mostly normal scales, a few subnormal ones
      const uint32_t r = rng() % 64;
      s = r == 0 ? uint8_t(1 + rng() % 7) : uint8_t(0x30 + rng() % 0x30);
    }
  }
  Nvfp4MatrixView view(const char* name) const {
    return Nvfp4MatrixView{weight.data(), scale.data(), s2, n, k, name};
  }
  void dequantize_into(float* out) const {  // [n, k]
    nvfp4::dequantize_weight(weight.data(), scale.data(), s2, n, k, out);
  }
};

struct Layer {
  int E, H, I;
  std::vector<float> w13f, w2f;        // [E, 2I, H], [E, H, I] dequantized
  std::vector<float> is13, is2;        // [E] input scales
  PackedMoeLayer packed;               // alphas folded with the input scales
  moe::ExpertMlpF32 mlp() const { return {w13f.data(), w2f.data(), E, H, I}; }
};

Layer make_layer(int E, int H, int I, std::mt19937& rng) {
  Layer L{E, H, I, {}, {}, {}, {}, make_packed_moe_layer(E, H, I)};
  L.w13f.resize(size_t(E) * 2 * I * H);
  L.w2f.resize(size_t(E) * H * I);
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  std::uniform_real_distribution<float> log2_spread(-3.0f, 3.0f);
  for (int e = 0; e < E; ++e) {
    Matrix gate, up, down;
    const float s2g = u(rng) / (40.0f * std::sqrt(float(H)));
    gate.fill(I, H, s2g, rng);
    up.fill(I, H, s2g, rng);
    down.fill(H, I, u(rng) / (40.0f * std::sqrt(float(I))), rng);
    gate.dequantize_into(&L.w13f[size_t(e) * 2 * I * H]);
    up.dequantize_into(&L.w13f[(size_t(e) * 2 + 1) * I * H]);
    down.dequantize_into(&L.w2f[size_t(e) * H * I]);
    pack_moe_expert(L.packed, e, gate.view("gate"), up.view("up"), down.view("down"));
    // Calibrated-looking scales (amax / 2688) spread 8x either way, so some experts clip at
    // SF = 448 and others use subnormal block scales.
    L.is13.push_back(4.5f / 2688.0f * std::exp2(log2_spread(rng)));
    L.is2.push_back(1.0f / 2688.0f * std::exp2(log2_spread(rng)));
  }
  fold_w4a4_input_scales(L.packed, L.is13, L.is2);
  return L;
}

struct DevScales {
  DevBuf<float> is13, is2;
  explicit DevScales(const Layer& L) : is13(L.is13.size()), is2(L.is2.size()) {
    is13.upload(L.is13);
    is2.upload(L.is2);
  }
};

struct Case {
  std::string name;
  int E, H, I;
  std::vector<int> counts;
  bool masked = false, gather = false, slots = false, y_f32 = true;
};

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.name);
  std::mt19937 rng(seed);
  const int E = c.E, H = c.H, I = c.I;
  const Layer L = make_layer(E, H, I, rng);
  const moe::ExpertMlpF32 mlp = L.mlp();
  const RowMap m = make_row_map(c.counts, c.masked, c.slots, c.gather, rng);
  const std::vector<uint16_t> x = random_bf16(size_t(m.x_rows) * H, rng);
  const std::vector<uint16_t> act_in = random_bf16(size_t(m.total) * I, rng, 0.3f);

  // Twin: GEMM1 output (unscaled NVFP4 act), GEMM2 output for act_in.
  std::vector<float> ref1(size_t(m.total) * I, 0.0f), ref2(size_t(m.total) * H, 0.0f);
  parallel_rows(m.total, [&](int r) {
    const int e = m.expert_of[size_t(r)];
    if (e < 0) return;
    const uint16_t* xr = &x[size_t(m.gather.empty() ? r : m.gather[size_t(r)]) * H];
    moe::w4a4_gemm1_row_cpu(mlp, e, xr, L.is13[size_t(e)], L.is2[size_t(e)], &ref1[size_t(r) * I]);
    std::vector<float> aq(static_cast<size_t>(I));
    moe::w4a4_quantize_rows_cpu(&act_in[size_t(r) * I], 1, I, L.is2[size_t(e)], aq.data());
    moe::w4a4_gemm2_row_cpu(mlp, e, aq.data(), L.is2[size_t(e)], &ref2[size_t(r) * H]);
  });

  const MoeWeightsBuffer W(L.packed);
  DevScales ds(L);
  const MoeW4a4WeightsDevice w{W.view(), ds.is13.ptr(), ds.is2.ptr()};
  DevBuf<uint16_t> d_x(x.size()), d_xq(size_t(m.total) * H), d_act(size_t(m.total) * I),
      d_act_in(size_t(m.total) * I), d_y16(size_t(m.total) * H);
  DevBuf<float> d_y32(size_t(m.total) * H);
  d_x.upload(x);
  DevRowMap dm(m);
  const MoeRows rows = dm.rows(m);
  MoeRows no_gather = rows;
  no_gather.gather = nullptr;
  const MoeGemmProblem p = make_problem(m, E, H, I);
  ASSERT_EQ(moe_gemm_unsupported_reason(p), "") << p;

  // kWgmma keeps xq and act in wgmma order: act rows are put back in natural order to compare.
  auto natural_rows = [&](std::vector<uint16_t> all) {
    return test::rows_from_wgmma_order(std::move(all), DevBuf<uint16_t>::kGuard, m.total, I);
  };
  DevBuf<uint16_t> d_act_in_w(size_t(m.total) * I);
  std::vector<MoeKernel> kernels = {MoeKernel::kAuto, MoeKernel::kDecode, MoeKernel::kTiled};
  if (moe_wgmma_available()) kernels.push_back(MoeKernel::kWgmma);
  for (MoeKernel k : kernels) {
    SCOPED_TRACE(moe_kernel_name(k));
    const bool wg = k == MoeKernel::kWgmma;
    d_act.poison();
    ASSERT_EQ(moe_w4a4_gemm1(p, w, rows, d_x.ptr(), d_xq.ptr(), d_act.ptr(), nullptr, k),
              cudaSuccess);
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> act_all = wg ? natural_rows(d_act.download_all()) : d_act.download_all();
    const Stats s1 = compare(act_all, m.total, I, m.expert_of, ref1);
    EXPECT_EQ(s1.bad, 0u);
    EXPECT_EQ(s1.poison_lost, 0u);
    EXPECT_LE(s1.nmse, 1e-5) << "gemm1 " << p;

    // GEMM2 on its own input: quantize act_in in place on the GPU (unowned rows keep poison).
    d_act_in.poison();
    d_act_in.upload(act_in);
    uint16_t* act_in_dev = d_act_in.ptr();
    if (wg) {
      ASSERT_EQ(moe_w4a16_to_wgmma_order(d_act_in.ptr(), m.total, I, d_act_in_w.ptr(), nullptr),
                cudaSuccess);
      act_in_dev = d_act_in_w.ptr();
    }
    ASSERT_EQ(moe_w4a4_quantize_rows(p, no_gather, false, act_in_dev, I, ds.is2.ptr(), act_in_dev,
                                     nullptr, {wg, wg}),
              cudaSuccess);
    DevBuf<float>* y32 = &d_y32;
    DevBuf<uint16_t>* y16 = &d_y16;
    if (c.y_f32) y32->poison(); else y16->poison();
    void* y = c.y_f32 ? static_cast<void*>(y32->ptr()) : static_cast<void*>(y16->ptr());
    ASSERT_EQ(moe_w4a4_gemm2(p, w, rows, act_in_dev, y, c.y_f32, nullptr, k), cudaSuccess);
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    const Stats s2 = c.y_f32 ? compare(y32->download_all(), m.total, H, m.expert_of, ref2)
                             : compare(y16->download_all(), m.total, H, m.expert_of, ref2);
    EXPECT_EQ(s2.bad, 0u);
    EXPECT_EQ(s2.poison_lost, 0u);
    EXPECT_LE(s2.nmse, 1e-5) << "gemm2 " << p;

    // Chained: GEMM2 on GEMM1's own act vs the twin's GEMM2 on the same act values.
    std::vector<float> ref3(size_t(m.total) * H, 0.0f);
    parallel_rows(m.total, [&](int r) {
      const int e = m.expert_of[size_t(r)];
      if (e < 0) return;
      std::vector<float> a(static_cast<size_t>(I));
      for (int i = 0; i < I; ++i) a[size_t(i)] = bf16_to_float(act_all[DevBuf<uint16_t>::kGuard + size_t(r) * I + i]);
      moe::w4a4_gemm2_row_cpu(mlp, e, a.data(), L.is2[size_t(e)], &ref3[size_t(r) * H]);
    });
    d_y32.poison();
    ASSERT_EQ(moe_w4a4_gemm2(p, w, rows, d_act.ptr(), d_y32.ptr(), true, nullptr, k), cudaSuccess);
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    const Stats s3 = compare(d_y32.download_all(), m.total, H, m.expert_of, ref3);
    EXPECT_EQ(s3.bad, 0u);
    EXPECT_EQ(s3.poison_lost, 0u);
    EXPECT_LE(s3.nmse, 1e-5) << "gemm1 -> gemm2 " << p;
    std::cout << "[ " << c.name << " " << moe_kernel_name(k) << " ] nmse gemm1 " << s1.nmse
              << " gemm2 " << s2.nmse << " chained " << s3.nmse << "\n";
  }
}

class W4a4Moe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// The quantizer alone: every bf16 it writes equals E2M1 * SF from the CPU quantize_activation.
// wgmma: dst (and src when in place) rows in wgmma order; the values must be the same.
void check_quantizer(bool masked, bool gather, bool slots, bool in_place, uint32_t seed,
                     bool wgmma = false) {
  std::ostringstream label;
  label << "masked=" << masked << " gather=" << gather << " slots=" << slots << " in_place=" << in_place
        << " wgmma=" << wgmma;
  SCOPED_TRACE(label.str());
  std::mt19937 rng(seed);
  const int E = 5, cols = 256;
  const RowMap m = make_row_map({3, 0, 19, 1, 140}, masked, slots, gather, rng);
  // Rows of very different magnitudes, some all-zero blocks and one all-zero row.
  std::vector<uint16_t> x = random_bf16(size_t(m.x_rows) * cols, rng);
  std::uniform_real_distribution<float> lg(-12.0f, 12.0f);
  for (int r = 0; r < m.x_rows; ++r) {
    const float f = std::exp2(lg(rng));
    for (int c = 0; c < cols; ++c) {
      uint16_t& v = x[size_t(r) * cols + c];
      v = (r == 1 || (c / 16) % 7 == 3) ? 0 : float_to_bf16(bf16_to_float(v) * f);
    }
  }
  std::vector<float> scales;
  for (int e = 0; e < E; ++e) scales.push_back(std::exp2(lg(rng)) / 2688.0f);
  DevBuf<float> d_scales(scales.size());
  d_scales.upload(scales);
  DevBuf<uint16_t> d_x(x.size()), d_dst(size_t(m.total) * cols);
  d_x.upload(x);
  DevRowMap dm(m);
  const MoeRows rows = dm.rows(m);
  const MoeGemmProblem p = make_problem(m, E, 64, 64);
  auto pos = [&](int c) { return wgmma ? wgmma_order_column(c) : c; };  // column c's place in dst
  if (in_place) {  // dst starts as x (no gather in place) with poison in unowned rows
    std::vector<uint16_t> row(static_cast<size_t>(cols));
    for (int r = 0; r < m.total; ++r) {
      if (m.expert_of[size_t(r)] < 0) continue;
      for (int c = 0; c < cols; ++c) row[size_t(pos(c))] = x[size_t(r) * cols + c];
      TETRA_CUDA_CHECK(cudaMemcpy(d_dst.ptr() + size_t(r) * cols, row.data(), cols * 2,
                                  cudaMemcpyHostToDevice));
    }
    ASSERT_EQ(moe_w4a4_quantize_rows(p, rows, false, d_dst.ptr(), cols, d_scales.ptr(),
                                     d_dst.ptr(), nullptr, {wgmma, wgmma}),
              cudaSuccess);
  } else {
    ASSERT_EQ(moe_w4a4_quantize_rows(p, rows, gather, d_x.ptr(), cols, d_scales.ptr(),
                                     d_dst.ptr(), nullptr, {false, wgmma}),
              cudaSuccess);
  }
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = d_dst.download_all();
  size_t mismatches = 0, poison_lost = 0, nonzero = 0;
  std::vector<float> want(static_cast<size_t>(cols));
  for (size_t i = 0; i < DevBuf<uint16_t>::kGuard; ++i)
    poison_lost += (got[i] != 0xffff) + (got[got.size() - 1 - i] != 0xffff);
  for (int r = 0; r < m.total; ++r) {
    const uint16_t* g = &got[DevBuf<uint16_t>::kGuard + size_t(r) * cols];
    const int e = m.expert_of[size_t(r)];
    if (e < 0) {
      for (int c = 0; c < cols; ++c) poison_lost += g[c] != 0xffff;
      continue;
    }
    const int src = (gather && !in_place) ? m.gather[size_t(r)] : r;
    moe::w4a4_quantize_rows_cpu(&x[size_t(src) * cols], 1, cols, scales[size_t(e)], want.data());
    for (int c = 0; c < cols; ++c) {
      mismatches += g[pos(c)] != float_to_bf16(want[size_t(c)]);
      nonzero += want[size_t(c)] != 0.0f;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(poison_lost, 0u);
  EXPECT_GT(nonzero, size_t(100 * cols));  // the comparison was not over zeros only
}

TEST_F(W4a4Moe, QuantizerMatchesCpuBitForBit) {
  check_quantizer(false, false, false, false, 21);
  check_quantizer(true, true, true, false, 22);
  check_quantizer(false, true, false, false, 23);
  check_quantizer(true, false, true, true, 24);
  // For the wgmma kernel: natural x -> xq in wgmma order, act quantized in place in that order.
  check_quantizer(false, true, true, false, 25, true);
  check_quantizer(true, false, false, true, 26, true);
}

TEST_F(W4a4Moe, Glm5ShapeSmallCounts) {
  run_case({"glm5", 6, 6144, 2048, {1, 3, 0, 19, 2, 0}}, 31);
}
TEST_F(W4a4Moe, RowsPerExpertUpTo989Contiguous) {
  run_case({"counts", 7, 512, 256, {1, 3, 19, 99, 989, 0, 40}}, 32);
}
TEST_F(W4a4Moe, RowsPerExpertUpTo989MaskedSlotsGatherBf16Out) {
  Case c{"masked", 6, 512, 192, {989, 0, 99, 1, 19, 3}};
  c.masked = c.slots = c.gather = true;
  c.y_f32 = false;
  run_case(c, 33);
}
TEST_F(W4a4Moe, AllRowsOnOneExpert) {
  run_case({"one-expert", 4, 1024, 512, {0, 0, 300, 0}}, 34);
}
TEST_F(W4a4Moe, EveryExpertEmptyMasked) {
  Case c{"empty", 3, 64, 64, {0, 0, 0}};
  c.masked = true;
  run_case(c, 35);
}

TEST_F(W4a4Moe, BadArgumentsAreRefused) {
  MoeGemmProblem p;
  p.num_experts = 2;
  p.hidden = 64;
  p.inter = 64;
  p.total_rows = 4;
  MoeW4a4WeightsDevice w;  // no input scales
  MoeRows rows;
  EXPECT_EQ(moe_w4a4_gemm1(p, w, rows, nullptr, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(moe_w4a4_gemm2(p, w, rows, nullptr, nullptr, true, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(moe_w4a4_quantize_rows(p, rows, false, nullptr, 40, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);  // 40 columns: not whole 16-blocks
}

}  // namespace
}  // namespace tetra
