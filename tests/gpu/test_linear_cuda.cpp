// CUDA dense linears and elementwise ops against their CPU twins, fresh random data each case:
// NVFP4 linear (one-expert W4A16 GEMM, decode and tiled kernels by M), gated gate/up + SiLU,
// BF16 linear (cuBLASLt), bias add, embedding gather, silu_mul, add. Odd M, outputs poisoned
// (NaN bytes) before each launch, guard bytes around every output that must survive.
// Bound: NMSE <= 1e-5 (NMSE = sum (a-b)^2 / sum b^2). Both sides accumulate in float from the
// same exactly-representable products (E2M1 * E4M3 is exact in bf16), so they differ by the
// summation order (~1e-7 relative) and by bf16 output rounding flips of 1 ulp (2^-8 relative,
// rare), far below 1e-5 in NMSE; a wrong tile, row or scale gives NMSE of order 1.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/half.h"
#include "guarded_device_array.h"
#include "ops/elementwise/elementwise.h"
#include "ops/elementwise/elementwise_cuda.h"
#include "ops/linear/linear.h"
#include "ops/linear/linear_cuda.h"
#include "ops/moe/w4a16_moe.h"

namespace tetra::ops {
namespace {

template <typename T>
using Dev = test::GuardedDeviceArray<T>;

void sync_ok(cudaError_t e) {
  TETRA_CUDA_CHECK(e);
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float a) {
  std::uniform_real_distribution<float> u(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(u(rng));
  return v;
}

struct HostNvfp4 {
  std::vector<uint8_t> weight, scale;  // [n, k/2], [n, k/16]
  Nvfp4MatrixView view;
};
HostNvfp4 random_nvfp4(int n, int k, std::mt19937& rng, float s2, const std::string& name) {
  HostNvfp4 h;
  h.weight.resize(size_t(n) * k / 2);
  h.scale.resize(size_t(n) * k / 16);
  std::uniform_int_distribution<int> byte(0, 255), sc(0x18, 0x40);
  for (auto& b : h.weight) b = uint8_t(byte(rng));
  for (auto& b : h.scale) b = uint8_t(sc(rng));
  h.scale[0] = 0;  // one all-zero block
  h.view = {h.weight.data(), h.scale.data(), s2, n, k, name};
  return h;
}

template <typename G, typename W>
double nmse(const std::vector<G>& got, const std::vector<W>& want, double (*to_d)(G),
            double (*to_dw)(W), const std::string& what) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = to_d(got[i]), w = to_dw(want[i]);
    EXPECT_TRUE(std::isfinite(g)) << what << " element " << i;
    if (!std::isfinite(g)) return 1e30;
    err += (g - w) * (g - w);
    ref += w * w;
  }
  return ref > 0 ? err / ref : err;
}
double from_bf16(uint16_t h) { return bf16_to_float(h); }
double from_f32(float f) { return f; }

class LinearCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(LinearCuda, Nvfp4MatchesCpu) {
  std::mt19937 rng(21);
  cuda::RowCountTable rows(1100);
  struct Shape { int n, k; };
  for (Shape s : {Shape{32, 64}, Shape{96, 192}, Shape{1024, 4096}, Shape{4096, 1408}})
    for (int M : {1, 3, 19, 64, 99, 989}) {
      if (size_t(M) * s.n * s.k > size_t(2) << 30) continue;  // keep the CPU side quick
      if (M > 99 && s.k > 1408) continue;
      const std::string what = "N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                                " M=" + std::to_string(M);
      auto w = random_nvfp4(s.n, s.k, rng, 0.013f, "test.q_proj");
      auto x = random_bf16(size_t(M) * s.k, rng, 2.0f);
      auto bias = random_bf16(s.n, rng, 0.5f);
      std::vector<uint16_t> want(size_t(M) * s.n);
      std::vector<float> want_f(size_t(M) * s.n);
      linear_nvfp4_cpu(x.data(), M, w.view, bias.data(), want.data(), DType::BF16);
      linear_nvfp4_cpu(x.data(), M, w.view, nullptr, want_f.data(), DType::F32);

      cuda::Nvfp4LinearBuffer dw(w.view);
      Dev<uint16_t> dx(x), dy(want.size()), dbias(bias);
      Dev<float> dyf(want_f.size());
      dy.poison();
      dyf.poison();
      sync_ok(cuda::linear_nvfp4(dw.view(), dx.ptr(), M, rows, dy.ptr(), DType::BF16, nullptr));
      sync_ok(cuda::add_bias(dy.ptr(), false, M, s.n, dbias.ptr(), nullptr));
      sync_ok(cuda::linear_nvfp4(dw.view(), dx.ptr(), M, rows, dyf.ptr(), DType::F32, nullptr));
      EXPECT_LE(nmse(dy.download(), want, from_bf16, from_bf16, what), 1e-5) << what << " bf16+bias";
      EXPECT_LE(nmse(dyf.download(), want_f, from_f32, from_f32, what), 1e-5) << what << " f32";
      EXPECT_TRUE(dy.guards_intact()) << what;
      EXPECT_TRUE(dyf.guards_intact()) << what;
      if (M >= cuda::kNvfp4WgmmaMinRows) {  // the wgmma kernel (x reordered into scratch)
        Dev<uint16_t> scratch(size_t(M) * s.k);
        dy.poison();
        dyf.poison();
        sync_ok(cuda::linear_nvfp4(dw.view(), dx.ptr(), M, rows, dy.ptr(), DType::BF16, nullptr,
                                   scratch.ptr()));
        sync_ok(cuda::add_bias(dy.ptr(), false, M, s.n, dbias.ptr(), nullptr));
        sync_ok(cuda::linear_nvfp4(dw.view(), dx.ptr(), M, rows, dyf.ptr(), DType::F32, nullptr,
                                   scratch.ptr()));
        EXPECT_LE(nmse(dy.download(), want, from_bf16, from_bf16, what), 1e-5) << what << " wgmma bf16";
        EXPECT_LE(nmse(dyf.download(), want_f, from_f32, from_f32, what), 1e-5) << what << " wgmma f32";
        EXPECT_TRUE(dy.guards_intact() && dyf.guards_intact() && scratch.guards_intact()) << what;
      }
    }
}

// Outputs of one GEMV-style launch over x [M, k]: random NVFP4 weights (and biases), the CPU
// linear's results (want) and the W4A16 kernel + add_bias ones (dref) on the GPU, poisoned outputs.
struct GemvOut { int n; bool bias; };
struct GemvProblem {
  std::string what;
  Dev<uint16_t> dx;
  std::vector<HostNvfp4> hw;
  std::vector<std::vector<uint16_t>> bias, want;
  std::vector<std::unique_ptr<cuda::Nvfp4LinearBuffer>> dw;
  std::vector<std::unique_ptr<Dev<uint16_t>>> dbias, dy, dref;  // [output] device buffers
  std::vector<cuda::Nvfp4GemvOutput> outs;

  GemvProblem(int k, const std::vector<GemvOut>& spec, int M, std::mt19937& rng,
              const cuda::RowCountTable& rows)
      : what("K=" + std::to_string(k) + " outputs=" + std::to_string(spec.size()) +
             " M=" + std::to_string(M)),
        dx(random_bf16(size_t(M) * k, rng, 2.0f)) {
    const std::vector<uint16_t> x = dx.download();
    for (const GemvOut& o : spec) {
      hw.push_back(random_nvfp4(o.n, k, rng, 0.004f * float(hw.size() + 1), "test.proj"));
      bias.push_back(o.bias ? random_bf16(o.n, rng, 0.5f) : std::vector<uint16_t>());
      want.emplace_back(size_t(M) * o.n);
      linear_nvfp4_cpu(x.data(), M, hw.back().view, o.bias ? bias.back().data() : nullptr,
                       want.back().data(), DType::BF16);
      dw.push_back(std::make_unique<cuda::Nvfp4LinearBuffer>(hw.back().view));
      dbias.push_back(std::make_unique<Dev<uint16_t>>(o.bias ? bias.back() : std::vector<uint16_t>(1)));
      dy.push_back(std::make_unique<Dev<uint16_t>>(size_t(M) * o.n));
      dref.push_back(std::make_unique<Dev<uint16_t>>(size_t(M) * o.n));
      dy.back()->poison();
      outs.push_back({&dw.back()->view(), o.bias ? dbias.back()->ptr() : nullptr, dy.back()->ptr()});
    }
    for (size_t i = 0; i < spec.size(); ++i) {
      sync_ok(cuda::linear_nvfp4(dw[i]->view(), dx.ptr(), M, rows, dref[i]->ptr(), DType::BF16,
                                 nullptr));
      if (spec[i].bias)
        sync_ok(cuda::add_bias(dref[i]->ptr(), false, M, spec[i].n, dbias[i]->ptr(), nullptr));
    }
  }
  void poison() {
    for (auto& y : dy) y->poison();
  }
  // The outputs as written, each checked against the CPU linear (want) and the W4A16 path (dref).
  std::vector<std::vector<uint16_t>> check(const std::string& kernel) {
    std::vector<std::vector<uint16_t>> got;
    for (size_t i = 0; i < dy.size(); ++i) {
      const std::string wi = what + " output " + std::to_string(i) + " " + kernel;
      got.push_back(dy[i]->download());
      EXPECT_LE(nmse(got[i], want[i], from_bf16, from_bf16, wi), 1e-5) << wi;
      EXPECT_TRUE(dy[i]->guards_intact()) << wi;
      EXPECT_LE(nmse(got[i], dref[i]->download(), from_bf16, from_bf16, wi), 1e-5) << wi << " vs W4A16";
    }
    return got;
  }
};

// The decode GEMV: one to three outputs (fused q/k/v) with and without bias against the CPU
// linear, and against the W4A16 kernel + add_bias on the GPU (same rounding steps, so only the
// float summation order differs). Outputs of different sizes in one launch, odd M.
// The Rolling kernel's shape: 4 slots at 4 blocks per SM where 4 divides a warp's k / 512 chunks,
// else the largest of 7..5 at 3 blocks per SM, else none.
TEST_F(LinearCuda, Nvfp4GemvRollingShape) {
  const auto expect_shape = [](int k, int slots, int blocks_per_sm) {
    const cuda::Nvfp4GemvRollingShape got = cuda::nvfp4_gemv_rolling_shape(k);
    EXPECT_EQ(got.slots, slots) << "k " << k;
    EXPECT_EQ(got.blocks_per_sm, blocks_per_sm) << "k " << k;
  };
  expect_shape(4096, 4, 4);   // 8 chunks per warp
  expect_shape(8192, 4, 4);   // 16
  expect_shape(2048, 4, 4);   // 4
  expect_shape(12288, 4, 4);  // 24
  expect_shape(6144, 4, 4);   // 12
  expect_shape(5120, 5, 3);   // 10
  expect_shape(3072, 6, 3);   // 6
  expect_shape(3584, 7, 3);   // 7
  expect_shape(4608, 0, 0);   // 9 per warp
  expect_shape(1536, 0, 0);   // 3 per warp
  expect_shape(4160, 0, 0);   // not whole chunks per warp
  expect_shape(0, 0, 0);
}

TEST_F(LinearCuda, Nvfp4GemvSeveralOutputsMatchCpu) {
  std::mt19937 rng(23);
  cuda::RowCountTable rows(8);
  struct Case { int k; std::vector<GemvOut> outs; };
  // Nvfp4LinearBuffer (and the W4A16 reference) take n % 32 == 0; the GEMV itself needs 16.
  const Case cases[] = {{64, {{32, true}}},
                        {192, {{96, true}, {32, false}, {64, true}}},
                        {4096, {{12288, true}, {1024, true}, {1024, true}}},  // GLM-4.5-Air q/k/v
                        {12288, {{4096, false}}},                             // its o_proj
                        {1408, {{224, false}, {4096, true}}},
                        // Rolling at every M with 4 (at 4 blocks per SM), 5, 6 and 7 register
                        // slots per warp; over 416 tiles the 3-per-SM grids' blocks roll into a
                        // second tile (the 4-slot grid rolls on the q/k/v case's 896 tiles)
                        {4096, {{6656, true}}},
                        {5120, {{6656, true}}},
                        {6144, {{6656, false}}},
                        {3072, {{6656, true}}},
                        {3584, {{6656, true}}},
                        // Qwen3-30B-A3B q/k/v: 320 tiles, 4 slots
                        {2048, {{4096, true}, {512, true}, {512, true}}},
                        {128, {{256, true}, {64, false}, {128, true}}}};
  for (const Case& c : cases)
    for (int M : {1, 2, 5, 8}) {
      size_t n_total = 0;
      for (const GemvOut& o : c.outs) n_total += size_t(o.n);
      // keep the CPU side quick: the largest problems at M = 1 and 8 only
      if (size_t(c.k) * n_total > (size_t(30) << 20) && (M == 2 || M == 5)) continue;
      GemvProblem pb(c.k, c.outs, M, rng, rows);
      const std::string& what = pb.what;
      const auto& outs = pb.outs;
      ASSERT_EQ(cuda::nvfp4_gemv_unsupported_reason(outs.data(), int(outs.size()), M), "") << what;
      // Every kernel: Auto (streaming for few tiles, else batched), the register-batched one, and
      // streaming shapes whose 2-3 stage rings wrap many times and whose grids give blocks
      // several tiles.
      struct Kern { cuda::Nvfp4GemvKernel kernel; cuda::Nvfp4GemvStreamConfig cfg; const char* name; };
      const Kern kernels[] = {{cuda::Nvfp4GemvKernel::Auto, {}, "auto"},
                              {cuda::Nvfp4GemvKernel::Batched, {}, "batched"},
                              {cuda::Nvfp4GemvKernel::Stream, {}, "stream default"},
                              {cuda::Nvfp4GemvKernel::Stream, {4, 2, 1, 2}, "stream c4 st2 b1 j2"},
                              {cuda::Nvfp4GemvKernel::Stream, {8, 3, 2, 2}, "stream c8 st3 b2 j2"},
                              {cuda::Nvfp4GemvKernel::Stream, {16, 2, 1, 1}, "stream c16 st2 b1 j1"},
                              {cuda::Nvfp4GemvKernel::Rolling, {}, "rolling"}};
      for (const Kern& kn : kernels) {
        const bool rolls = cuda::nvfp4_gemv_rolling_shape(c.k).slots > 0;
        if (kn.kernel == cuda::Nvfp4GemvKernel::Rolling && !rolls) continue;
        auto launch = [&] {
          sync_ok(cuda::linear_nvfp4_gemv(outs.data(), int(outs.size()), pb.dx.ptr(), M, nullptr,
                                          kn.kernel, &kn.cfg));
        };
        pb.poison();
        launch();
        const auto first = pb.check(kn.name);
        if (kn.kernel == cuda::Nvfp4GemvKernel::Batched) continue;
        // Fixed summation order: a second run is bit-identical.
        launch();
        for (size_t i = 0; i < first.size(); ++i)
          EXPECT_EQ(pb.dy[i]->download(), first[i])
              << what << " output " << i << " " << kn.name << " second run differs";
      }
    }
}

// The residual add in the GEMV's epilogue (Nvfp4GemvOutput::residual, o_proj at decode): every
// GEMV kernel, against the same kernel's plain output added to the residual on the host with the
// add + RMSNorm kernel's rounding (bf16(bf16(y) + r)): bit-identical, guards intact; refused
// above the GEMV's 8 rows.
TEST_F(LinearCuda, Nvfp4GemvResidualAddEqualsSeparateAdd) {
  std::mt19937 rng(29);
  cuda::RowCountTable rows(8);
  struct Case { int k, n; bool bias; };
  const Case cases[] = {{12288, 4096, false},  // GLM-4.5-Air o_proj (the streaming kernel)
                        {4096, 6656, true},    // Rolling
                        {192, 96, true},
                        {1408, 224, false}};
  const cuda::Nvfp4GemvKernel kernels[] = {cuda::Nvfp4GemvKernel::Auto, cuda::Nvfp4GemvKernel::Batched,
                                           cuda::Nvfp4GemvKernel::Stream, cuda::Nvfp4GemvKernel::Rolling};
  for (const Case& c : cases)
    for (int M : {1, 3, 8}) {
      GemvProblem pb(c.k, {{c.n, c.bias}}, M, rng, rows);
      const std::vector<uint16_t> r0 = random_bf16(size_t(M) * c.n, rng, 4.0f);
      for (const cuda::Nvfp4GemvKernel kernel : kernels) {
        if (kernel == cuda::Nvfp4GemvKernel::Rolling && cuda::nvfp4_gemv_rolling_shape(c.k).slots == 0)
          continue;
        const std::string what = pb.what + " kernel " + std::to_string(int(kernel));
        pb.poison();
        sync_ok(cuda::linear_nvfp4_gemv(pb.outs.data(), 1, pb.dx.ptr(), M, nullptr, kernel));
        const std::vector<uint16_t> y = pb.check(what)[0];
        std::vector<uint16_t> want(r0.size());
        for (size_t i = 0; i < want.size(); ++i)
          want[i] = float_to_bf16(from_bf16(y[i]) + from_bf16(r0[i]));
        Dev<uint16_t> dres(r0);
        cuda::Nvfp4GemvOutput o = pb.outs[0];
        o.y = nullptr;
        o.residual = dres.ptr();
        ASSERT_EQ(cuda::nvfp4_gemv_unsupported_reason(&o, 1, M), "") << what;
        sync_ok(cuda::linear_nvfp4_gemv(&o, 1, pb.dx.ptr(), M, nullptr, kernel));
        EXPECT_EQ(dres.download(), want) << what;
        EXPECT_TRUE(dres.guards_intact()) << what;
      }
    }
  cuda::RowCountTable rows9(9);
  GemvProblem pb(256, {{64, false}}, 9, rng, rows9);
  Dev<uint16_t> dres(size_t(9) * 64);
  cuda::Nvfp4GemvOutput o = pb.outs[0];
  o.residual = dres.ptr();
  EXPECT_NE(cuda::nvfp4_gemv_unsupported_reason(&o, 1, 9), "");
  EXPECT_NE(cuda::nvfp4_small_m_unsupported_reason(&o, 1, 3), "");  // the small-M kernel, called directly
}

// o_proj with the router folded into its epilogue (moe/router_fold.h): the residual exactly as
// the plain residual add, gx and the sums against the host twin on the row it stored. The sums
// are double additions of f32 partials (exact for these magnitudes), so they match the twin to
// the last bit of a double rounding (1e-12 of the partials' absolute sum); a wrong tile, expert
// or row gives errors of order 1. Guards around gx and the sums intact; refused past one row,
// without a residual, with too many tiles.
TEST_F(LinearCuda, Nvfp4GemvRouterFoldMatchesTwin) {
  std::mt19937 rng(31);
  cuda::RowCountTable rows(1);
  struct Case { int k, n, E, copies; };
  const Case cases[] = {{12288, 4096, 128, 8},  // GLM-4.5-Air o_proj, 128 experts
                        {4096, 2048, 256, 1},   // more experts than threads of the epilogue
                        {192, 96, 7, 3},        // odd expert count, fewer blocks than copies
                        {1408, 224, 160, 16}};
  for (const Case& c : cases) {
    GemvProblem pb(c.k, {{c.n, false}}, 1, rng, rows);
    const std::string what = pb.what + " E=" + std::to_string(c.E);
    const std::vector<uint16_t> r0 = random_bf16(c.n, rng, 4.0f);
    const std::vector<uint16_t> W = random_bf16(size_t(c.E) * c.n, rng, 0.1f);
    const std::vector<uint16_t> g = random_bf16(c.n, rng, 2.0f);
    // the plain residual add: the h the fold must see
    Dev<uint16_t> dplain(r0);
    cuda::Nvfp4GemvOutput o = pb.outs[0];
    o.y = nullptr;
    o.residual = dplain.ptr();
    sync_ok(cuda::linear_nvfp4_gemv(&o, 1, pb.dx.ptr(), 1, nullptr));
    const std::vector<uint16_t> h = dplain.download();

    const std::vector<uint8_t> tiles = moe::router_fold_tiles(W.data(), g.data(), c.E, c.n);
    Dev<uint8_t> dtiles(tiles);
    Dev<uint16_t> dres(r0), dgx(size_t(c.n));
    Dev<double> dsums(std::vector<double>(size_t(c.copies) * (c.E + 1), 0.0));
    dgx.poison();
    moe::RouterFold f{dtiles.ptr(), dgx.ptr(), dsums.ptr(), c.E, c.copies};
    auto summed = [&] {  // the copies added in order, as GEMM1 does
      const std::vector<double> all = dsums.download();
      std::vector<double> v(size_t(c.E) + 1, 0.0);
      for (int k = 0; k < c.copies; ++k)
        for (int e = 0; e <= c.E; ++e) v[size_t(e)] += all[size_t(k) * (c.E + 1) + e];
      return v;
    };
    o.residual = dres.ptr();
    ASSERT_EQ(cuda::nvfp4_gemv_router_fold_unsupported_reason(o, 1, f), "") << what;
    sync_ok(cuda::linear_nvfp4_gemv_router_fold(o, pb.dx.ptr(), f, nullptr));
    EXPECT_EQ(dres.download(), h) << what;

    std::vector<double> want_sums;
    std::vector<uint16_t> want_gx;
    moe::router_fold_sums(tiles, h.data(), c.E, c.n, want_sums, want_gx);
    EXPECT_EQ(dgx.download(), want_gx) << what;
    const std::vector<double> sums = summed();
    for (int e = 0; e <= c.E; ++e) {
      double scale = 0;  // the partials' absolute sum bounds the rounding
      for (int i = 0; i < c.n; ++i) {
        const double hv = bf16_to_float(h[size_t(i)]);
        scale += e == c.E ? hv * hv
                          : std::fabs(bf16_to_float(W[size_t(e) * c.n + i]) *
                                      bf16_to_float(g[size_t(i)]) * hv);
      }
      EXPECT_NEAR(sums[size_t(e)], want_sums[size_t(e)], 1e-12 * scale + 1e-30)
          << what << " sum " << e;
    }
    EXPECT_TRUE(dgx.guards_intact() && dsums.guards_intact() && dres.guards_intact()) << what;
    // Added again: the sums double (the caller zeroes them between steps).
    Dev<uint16_t> dres2(r0);
    o.residual = dres2.ptr();
    sync_ok(cuda::linear_nvfp4_gemv_router_fold(o, pb.dx.ptr(), f, nullptr));
    const std::vector<double> twice = summed();
    EXPECT_NEAR(twice[0], 2 * sums[0], 1e-9 * std::fabs(sums[0]) + 1e-30) << what;

    cuda::Nvfp4GemvOutput plain = pb.outs[0];  // no residual: refused
    EXPECT_NE(cuda::nvfp4_gemv_router_fold_unsupported_reason(plain, 1, f), "") << what;
    EXPECT_NE(cuda::nvfp4_gemv_router_fold_unsupported_reason(o, 2, f), "") << what;
  }
}

// q/k/v over gx with the input norm's 1/rms folded in (linear_nvfp4_gemv_norm_folded, the
// Rolling and streaming kernels): against the CPU linear's f32 dot products of gx, scaled per row
// by the host twin's inv_rms, rounded, plus the bias, as the epilogue does (NMSE <= 1e-5, the
// bound of the plain GEMV). The sums give every row its own inv_rms (a row mix-up is an error of
// order 1); part counts of the combine kernel (16, 12, 1), of GEMM2's combine (H / 32) and the
// staging's limit. Auto, Rolling where k allows and Stream; bit-identical on a second run;
// Batched, shapes Auto gives to Batched, nine rows, a residual output, too many parts and H != k
// refused.
TEST_F(LinearCuda, Nvfp4GemvNormFoldedMatchesTwin) {
  std::mt19937 rng(37);
  cuda::RowCountTable rows(8);
  struct Case { int k; std::vector<GemvOut> outs; int parts; std::vector<int> ms; };
  // (the last two: few tiles, Auto's streaming kernel, as the tiny presets' q/k/v)
  const std::vector<GemvOut> air_qkv = {{12288, true}, {1024, true}, {1024, true}};
  const Case cases[] = {{4096, air_qkv, 16, {1, 3, 8}},     // GLM-4.5-Air, the combine's parts
                        {4096, air_qkv, 128, {1, 2}},       // GEMM2's combine: H / 32
                        {5120, {{6656, true}}, 160, {1}},    // 5 slots, GLM-4.7's H / 32
                        {3072, {{6656, false}}, 12, {1, 8}},  // 6 slots
                        {4096, air_qkv, 256, {1}},           // the staging's limit
                        {64, {{256, true}, {128, true}, {128, true}}, 2, {1, 4}},
                        {192, {{96, true}, {32, false}}, 1, {1, 3, 8}}};
  std::uniform_real_distribution<float> part_sum(0.5f, 4.0f);
  for (const Case& c : cases)
    for (int M : c.ms) {
      GemvProblem pb(c.k, c.outs, M, rng, rows);
      const std::string what = pb.what + " parts=" + std::to_string(c.parts);
      std::vector<float> sums(size_t(M) * c.parts);
      for (int r = 0; r < M; ++r)  // row r's mean square ~ (r + 1)^2: distinct inv_rms per row
        for (int p = 0; p < c.parts; ++p)
          sums[size_t(r) * c.parts + p] = part_sum(rng) * float((r + 1) * (r + 1)) * float(c.k) /
                                          float(c.parts);
      Dev<float> dsums(sums);
      const moe::NormFold f{dsums.ptr(), c.parts, c.k, 1e-5f};
      const std::vector<uint16_t> gx = pb.dx.download();
      std::vector<std::vector<uint16_t>> want(pb.outs.size());
      for (size_t i = 0; i < pb.outs.size(); ++i) {
        const int n = c.outs[i].n;
        std::vector<float> dot(size_t(M) * n);
        linear_nvfp4_cpu(gx.data(), M, pb.hw[i].view, nullptr, dot.data(), DType::F32);
        want[i].resize(dot.size());
        for (int r = 0; r < M; ++r) {
          const float inv = moe::norm_fold_inv_rms(&sums[size_t(r) * c.parts], c.parts, c.k, 1e-5f);
          for (int j = 0; j < n; ++j) {
            float y = bf16_to_float(float_to_bf16(dot[size_t(r) * n + j] * inv));
            if (c.outs[i].bias) y += bf16_to_float(pb.bias[i][size_t(j)]);
            want[i][size_t(r) * n + j] = float_to_bf16(y);
          }
        }
      }
      const int n_outs = int(pb.outs.size());
      ASSERT_EQ(cuda::nvfp4_gemv_norm_folded_unsupported_reason(pb.outs.data(), n_outs, M, f), "")
          << what;
      const bool rolls = cuda::nvfp4_gemv_rolling_shape(c.k).slots > 0;
      for (const cuda::Nvfp4GemvKernel kernel : {cuda::Nvfp4GemvKernel::Auto, cuda::Nvfp4GemvKernel::Rolling,
                                                 cuda::Nvfp4GemvKernel::Stream}) {
        if (kernel == cuda::Nvfp4GemvKernel::Rolling && !rolls) {
          EXPECT_THROW(cuda::linear_nvfp4_gemv_norm_folded(pb.outs.data(), n_outs, pb.dx.ptr(), M,
                                                           f, nullptr, kernel),
                       Error)
              << what;
          continue;
        }
        const std::string wk = what + " kernel " + std::to_string(int(kernel));
        auto launch = [&] {
          sync_ok(cuda::linear_nvfp4_gemv_norm_folded(pb.outs.data(), n_outs, pb.dx.ptr(), M, f,
                                                      nullptr, kernel));
        };
        pb.poison();
        launch();
        std::vector<std::vector<uint16_t>> first;
        for (size_t i = 0; i < pb.outs.size(); ++i) {
          first.push_back(pb.dy[i]->download());
          EXPECT_LE(nmse(first[i], want[i], from_bf16, from_bf16, wk), 1e-5) << wk << " output " << i;
          EXPECT_TRUE(pb.dy[i]->guards_intact()) << wk;
        }
        launch();
        for (size_t i = 0; i < pb.outs.size(); ++i)
          EXPECT_EQ(pb.dy[i]->download(), first[i]) << wk << " output " << i << " second run differs";
      }
      EXPECT_THROW(cuda::linear_nvfp4_gemv_norm_folded(pb.outs.data(), n_outs, pb.dx.ptr(), M, f,
                                                       nullptr, cuda::Nvfp4GemvKernel::Batched),
                   Error)
          << what;
      const moe::NormFold too_many{dsums.ptr(), moe::kNormFoldMaxSums / M + 1, c.k, 1e-5f};
      EXPECT_NE(cuda::nvfp4_gemv_norm_folded_unsupported_reason(pb.outs.data(), n_outs, M, too_many), "");
      const moe::NormFold other_h{dsums.ptr(), c.parts, c.k + 64, 1e-5f};
      EXPECT_NE(cuda::nvfp4_gemv_norm_folded_unsupported_reason(pb.outs.data(), n_outs, M, other_h), "");
      std::vector<cuda::Nvfp4GemvOutput> with_residual = pb.outs;
      with_residual[0].residual = with_residual[0].y;
      EXPECT_NE(cuda::nvfp4_gemv_norm_folded_unsupported_reason(with_residual.data(), n_outs, M, f), "");
    }
  // Shapes Auto gives the Batched kernel (Qwen3-30B-A3B's q/k/v; 270 tiles of k 1408): refused,
  // so the model keeps their norm unfolded.
  for (const Case& c : {Case{2048, {{4096, true}, {512, true}, {512, true}}, 8, {1}},
                        Case{1408, {{224, false}, {4096, true}}, 1, {1}}}) {
    GemvProblem pb(c.k, c.outs, 1, rng, rows);
    Dev<float> dsums(std::vector<float>(size_t(c.parts), 1.0f));
    const moe::NormFold f{dsums.ptr(), c.parts, c.k, 1e-5f};
    EXPECT_NE(cuda::nvfp4_gemv_norm_folded_unsupported_reason(pb.outs.data(), int(pb.outs.size()), 1, f), "")
        << pb.what;
  }
  cuda::RowCountTable rows9(9);
  GemvProblem pb(4096, {{6656, false}}, 9, rng, rows9);
  Dev<float> dsums(std::vector<float>(9, 1.0f));
  const moe::NormFold f{dsums.ptr(), 1, 4096, 1e-5f};
  EXPECT_NE(cuda::nvfp4_gemv_norm_folded_unsupported_reason(pb.outs.data(), 1, 9, f), "");
}

// The small-M kernel (9..64 rows; linear_nvfp4_gemv dispatches there above 8 rows for k <= 4096;
// called directly here for every k and configuration, M <= 8 too): every token-tile
// count, outputs whose row counts leave the last 128/256-row group part empty, chunk counts not
// divisible by the cluster split (and fewer chunks than blocks: k = 64 at split 8), with and
// without bias; against the CPU linear and against linear_nvfp4 + add_bias, bit-identical reruns.
TEST_F(LinearCuda, Nvfp4SmallMMatchesCpu) {
  std::mt19937 rng(29);
  cuda::RowCountTable rows(64);
  struct Case { int k; std::vector<GemvOut> outs; std::vector<int> ms; };
  // Nvfp4LinearBuffer takes n % 32 == 0: 32, 96, 160, 288, 544, 1056 rows are 2..66 tiles, none
  // a whole number of 128-row groups.
  const Case cases[] = {{64, {{32, true}}, {9, 13, 16, 31, 33, 64, 1, 5}},
                        {192, {{96, true}, {32, false}, {160, true}}, {9, 13, 16, 31, 33, 64}},
                        {4096, {{1056, true}, {288, false}, {96, true}}, {16, 33, 64}},
                        {12288, {{544, false}}, {13, 64}},
                        {1408, {{160, false}, {288, true}}, {31, 64}}};
  struct Cfg { cuda::Nvfp4SmallMConfig cfg; const char* name; };
  const Cfg cfgs[] = {{{0, 0}, "auto"},   {{1, 1}, "tw1 s1"}, {{1, 2}, "tw1 s2"}, {{2, 2}, "tw2 s2"},
                      {{1, 4}, "tw1 s4"}, {{2, 4}, "tw2 s4"}, {{2, 8}, "tw2 s8"}, {{1, 8}, "tw1 s8"}};
  for (const Case& c : cases)
    for (int M : c.ms) {
      GemvProblem pb(c.k, c.outs, M, rng, rows);
      const std::string& what = pb.what;
      const auto& outs = pb.outs;
      ASSERT_EQ(cuda::nvfp4_small_m_unsupported_reason(outs.data(), int(outs.size()), M), "") << what;
      int ran = 0;
      for (int variant = 0; variant <= int(std::size(cfgs)); ++variant) {
        // variant 0: through linear_nvfp4_gemv (what the model calls); then each configuration.
        const bool via_gemv = variant == 0;
        if (via_gemv && (M <= cuda::kNvfp4GemvKernelRows || c.k > cuda::kNvfp4SmallMGemvMaxK)) continue;
        const char* name = via_gemv ? "linear_nvfp4_gemv" : cfgs[variant - 1].name;
        auto launch = [&] {
          const uint16_t* x = pb.dx.ptr();
          return via_gemv ? cuda::linear_nvfp4_gemv(outs.data(), int(outs.size()), x, M, nullptr)
                          : cuda::linear_nvfp4_small_m(outs.data(), int(outs.size()), x, M,
                                                       nullptr, &cfgs[variant - 1].cfg);
        };
        pb.poison();
        try {
          sync_ok(launch());
        } catch (const Error& e) {
          // Only an explicit split too small for the x slice may be refused.
          EXPECT_FALSE(via_gemv || variant == 1) << what << " " << name << ": " << e.what();
          EXPECT_NE(std::string(e.what()).find("shared memory"), std::string::npos)
              << what << " " << name << ": " << e.what();
          continue;
        }
        ++ran;
        const auto first = pb.check(name);
        // Fixed summation order (cluster partials in rank order): a second run is bit-identical.
        pb.poison();
        sync_ok(launch());
        for (size_t i = 0; i < first.size(); ++i)
          EXPECT_EQ(pb.dy[i]->download(), first[i]) << what << " output " << i << " " << name
                                                    << " second run differs";
      }
      EXPECT_GE(ran, 3) << what;
    }
}

// Several matrices over the same x (q/k/v) in one wgmma launch, with the k split the launcher
// picks: outputs whose rows end inside a 256-row block (a block's warps read two or three
// matrices and write two or three outputs), with and without bias, M from the threshold (64) to
// several token tiles; against the CPU linear and linear_nvfp4 + add_bias per output,
// bit-identical reruns; refusals.
TEST_F(LinearCuda, Nvfp4WgmmaOutputsMatchCpu) {
  if (!moe_wgmma_available()) GTEST_SKIP() << "the wgmma kernel needs SM 9.0";
  std::mt19937 rng(31);
  cuda::RowCountTable rows(300);
  struct Case { int k; std::vector<GemvOut> outs; std::vector<int> ms; };
  const Case cases[] = {{4096, {{12288, true}, {1024, true}, {1024, true}}, {64}},  // Air q/k/v
                        {192, {{96, true}, {32, false}, {160, true}}, {64, 65, 130, 257}},
                        {1408, {{160, false}, {288, true}}, {64, 300}},
                        {2048, {{4096, true}, {512, true}, {512, true}}, {64, 100}},  // Qwen3
                        {64, {{32, true}}, {77}}};
  for (const Case& c : cases)
    for (int M : c.ms) {
      GemvProblem pb(c.k, c.outs, M, rng, rows);
      const auto& outs = pb.outs;
      const int n = int(outs.size());
      ASSERT_EQ(cuda::nvfp4_wgmma_outputs_unsupported_reason(outs.data(), n, M), "") << pb.what;
      Dev<uint16_t> scratch(size_t(M) * c.k);
      auto launch = [&] {
        sync_ok(cuda::linear_nvfp4_wgmma(outs.data(), n, pb.dx.ptr(), M, rows, scratch.ptr(),
                                         nullptr));
      };
      launch();
      const auto first = pb.check("wgmma outputs");
      EXPECT_TRUE(scratch.guards_intact()) << pb.what;
      pb.poison();
      launch();
      for (size_t i = 0; i < first.size(); ++i)
        EXPECT_EQ(pb.dy[i]->download(), first[i]) << pb.what << " output " << i << " second run";
    }
  // Refused: too few rows, a gated matrix, k that differs between outputs.
  GemvProblem p(192, {{96, true}, {32, false}}, 64, rng, rows);
  EXPECT_NE(cuda::nvfp4_wgmma_outputs_unsupported_reason(p.outs.data(), 2, 63), "");
  auto g = random_nvfp4(32, 192, rng, 0.01f, "g");
  cuda::Nvfp4LinearBuffer dg(g.view, g.view);
  cuda::Nvfp4GemvOutput gated[2] = {p.outs[0], {&dg.view(), nullptr, p.outs[1].y}};
  EXPECT_NE(cuda::nvfp4_wgmma_outputs_unsupported_reason(gated, 2, 64).find("gated"),
            std::string::npos);
  auto other_k = random_nvfp4(32, 128, rng, 0.01f, "k128");
  cuda::Nvfp4LinearBuffer dk(other_k.view);
  cuda::Nvfp4GemvOutput mixed[2] = {p.outs[0], {&dk.view(), nullptr, p.outs[1].y}};
  EXPECT_NE(cuda::nvfp4_wgmma_outputs_unsupported_reason(mixed, 2, 64).find("has k"),
            std::string::npos);
}

TEST_F(LinearCuda, Nvfp4GemvRefusesWhatItCannotRun) {
  std::mt19937 rng(24);
  auto a = random_nvfp4(32, 128, rng, 0.01f, "a"), b = random_nvfp4(32, 192, rng, 0.01f, "b");
  cuda::Nvfp4LinearBuffer da(a.view), db(b.view), dg(a.view, a.view);
  const cuda::Nvfp4GemvOutput one[1] = {{&da.view(), nullptr, nullptr}};
  EXPECT_EQ(cuda::nvfp4_gemv_unsupported_reason(one, 1, 8), "");
  EXPECT_EQ(cuda::nvfp4_gemv_unsupported_reason(one, 1, 9), "") << "9 rows (small-M kernel)";
  EXPECT_EQ(cuda::nvfp4_gemv_unsupported_reason(one, 1, 64), "") << "64 rows (small-M kernel)";
  EXPECT_NE(cuda::nvfp4_gemv_unsupported_reason(one, 1, 65), "") << "65 rows";
  // At 64 rows an x slice of k = 16384 / 8 per block (263 KB) does not fit shared memory; at 32
  // rows it does; at 8 rows the GEMV takes it. Through linear_nvfp4_gemv, 9..64 rows take
  // k <= kNvfp4SmallMGemvMaxK only (longer k is faster in linear_nvfp4).
  auto longk = random_nvfp4(32, 16384, rng, 0.01f, "long");
  cuda::Nvfp4LinearBuffer dl(longk.view);
  const cuda::Nvfp4GemvOutput lo[1] = {{&dl.view(), nullptr, nullptr}};
  EXPECT_NE(cuda::nvfp4_small_m_unsupported_reason(lo, 1, 64), "") << "k 16384 at 64 rows";
  EXPECT_EQ(cuda::nvfp4_small_m_unsupported_reason(lo, 1, 32), "") << "k 16384 at 32 rows";
  EXPECT_EQ(cuda::nvfp4_gemv_unsupported_reason(lo, 1, 8), "") << "k 16384 at 8 rows";
  EXPECT_NE(cuda::nvfp4_gemv_unsupported_reason(lo, 1, 9), "") << "k 16384 at 9 rows";
  EXPECT_THROW(cuda::linear_nvfp4_gemv(lo, 1, nullptr, 64, nullptr), Error);
  EXPECT_THROW(cuda::linear_nvfp4_small_m(lo, 1, nullptr, 64, nullptr), Error);
  auto at_max = random_nvfp4(32, cuda::kNvfp4SmallMGemvMaxK, rng, 0.01f, "at max");
  cuda::Nvfp4LinearBuffer dm(at_max.view);
  const cuda::Nvfp4GemvOutput mo[1] = {{&dm.view(), nullptr, nullptr}};
  EXPECT_EQ(cuda::nvfp4_gemv_unsupported_reason(mo, 1, 64), "") << "k 4096 at 64 rows";
  EXPECT_NE(cuda::nvfp4_gemv_unsupported_reason(one, 1, 0), "") << "0 rows";
  const cuda::Nvfp4GemvOutput mixed[2] = {{&da.view(), nullptr, nullptr}, {&db.view(), nullptr, nullptr}};
  EXPECT_NE(cuda::nvfp4_gemv_unsupported_reason(mixed, 2, 1), "") << "k differs";
  const cuda::Nvfp4GemvOutput gated[1] = {{&dg.view(), nullptr, nullptr}};
  EXPECT_NE(cuda::nvfp4_gemv_unsupported_reason(gated, 1, 1), "") << "gated";
  EXPECT_THROW(cuda::linear_nvfp4_gemv(mixed, 2, nullptr, 1, nullptr), Error);
}

TEST_F(LinearCuda, GateUpSiluMatchesCpu) {
  std::mt19937 rng(22);
  cuda::RowCountTable rows(1000);
  struct Shape { int i, k; };
  for (Shape s : {Shape{16, 64}, Shape{64, 128}, Shape{1408, 4096}})
    for (int M : {1, 7, 33, 99, 989}) {
      if (M > 99 && s.k > 128) continue;
      const std::string what = "I=" + std::to_string(s.i) + " K=" + std::to_string(s.k) +
                                " M=" + std::to_string(M);
      auto g = random_nvfp4(s.i, s.k, rng, 0.02f, "gate"), u = random_nvfp4(s.i, s.k, rng, 0.03f, "up");
      auto x = random_bf16(size_t(M) * s.k, rng, 1.0f);
      std::vector<uint16_t> want(size_t(M) * s.i);
      gate_up_silu_nvfp4_cpu(x.data(), M, g.view, u.view, want.data());
      cuda::Nvfp4LinearBuffer dw(g.view, u.view);
      Dev<uint16_t> dx(x), da(want.size());
      da.poison();
      sync_ok(cuda::gate_up_silu_nvfp4(dw.view(), dx.ptr(), M, rows, da.ptr(), nullptr));
      EXPECT_LE(nmse(da.download(), want, from_bf16, from_bf16, what), 1e-5) << what;
      EXPECT_TRUE(da.guards_intact()) << what;
    }
}

TEST_F(LinearCuda, RefusesUnalignedShapes) {
  EXPECT_NE(cuda::nvfp4_linear_unsupported_reason(32, 96, false), "");   // K % 64
  EXPECT_NE(cuda::nvfp4_linear_unsupported_reason(48, 64, false), "");   // N % 32
  EXPECT_EQ(cuda::nvfp4_linear_unsupported_reason(48, 64, true), "");    // gated: 2I = 96
  std::mt19937 rng(23);
  auto w = random_nvfp4(48, 64, rng, 1.0f, "model.layers.0.self_attn.k_proj");
  try {
    cuda::Nvfp4LinearBuffer b(w.view);
    FAIL() << "48 rows accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k_proj"), std::string::npos) << e.what();
  }
}

// Both BF16 paths (the small-M GEMV and cuBLASLt) against the CPU: odd N, K not a multiple of
// a warp's batch (8, 264, 6152), M on both sides of the GEMV's limit, f32 and bf16 outputs.
TEST_F(LinearCuda, Bf16MatchesCpu) {
  std::mt19937 rng(24);
  cuda::Bf16Linear gemv_lin(true), lt_lin(false);
  struct Shape { int n, k; };
  for (Shape s : {Shape{8, 64}, Shape{151, 96}, Shape{1, 8}, Shape{37, 264}, Shape{4096, 1024},
                  Shape{1003, 6152}})
    for (int M : {1, 2, 3, 4, 5, 19, 99}) {
      auto w = random_bf16(size_t(s.n) * s.k, rng, 0.1f), x = random_bf16(size_t(M) * s.k, rng, 1.0f);
      std::vector<uint16_t> want(size_t(M) * s.n);
      std::vector<float> want_f(want.size());
      linear_bf16_cpu(x.data(), M, s.k, w.data(), s.n, nullptr, want.data(), DType::BF16);
      linear_bf16_cpu(x.data(), M, s.k, w.data(), s.n, nullptr, want_f.data(), DType::F32);
      Dev<uint16_t> dw(w), dx(x);
      for (cuda::Bf16Linear* lin : {&gemv_lin, &lt_lin}) {
        const bool gemv_path = lin == &gemv_lin &&
                               cuda::bf16_gemv_unsupported_reason(dw.ptr(), s.n, s.k, dx.ptr(), M,
                                                                  dw.ptr())
                                   .empty();
        const std::string what = "N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
                                  " M=" + std::to_string(M) + (gemv_path ? " gemv" : " cublaslt");
        EXPECT_EQ(gemv_path, lin == &gemv_lin && M <= cuda::kBf16GemvMaxRows &&
                                 size_t(M) * s.k * 4 <= size_t(cuda::kBf16GemvMaxSmemBytes))
            << what;
        Dev<uint16_t> dy(want.size());
        Dev<float> dyf(want.size());
        dy.poison();
        dyf.poison();
        lin->run(dw.ptr(), s.n, s.k, dx.ptr(), M, dy.ptr(), DType::BF16, nullptr);
        lin->run(dw.ptr(), s.n, s.k, dx.ptr(), M, dyf.ptr(), DType::F32, nullptr);
        TETRA_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_LE(nmse(dy.download(), want, from_bf16, from_bf16, what), 1e-5) << what;
        EXPECT_LE(nmse(dyf.download(), want_f, from_f32, from_f32, what), 1e-5) << what;
        EXPECT_TRUE(dy.guards_intact() && dyf.guards_intact()) << what;
      }
    }
}

// The GEMV names what it cannot run; the linear then takes cuBLASLt (checked above).
TEST_F(LinearCuda, Bf16GemvRefusesWhatItCannotRun) {
  std::vector<uint16_t> zeros(4096 * 20, 0);
  Dev<uint16_t> buf(zeros);
  const uint16_t* p = buf.ptr();
  auto reason = [&](const uint16_t* w, int N, int K, const uint16_t* x, int M) {
    return cuda::bf16_gemv_unsupported_reason(w, N, K, x, M, buf.ptr());
  };
  EXPECT_EQ(reason(p, 16, 64, p, 1), "");
  EXPECT_NE(reason(p, 16, 64, p, cuda::kBf16GemvMaxRows + 1).find("rows"), std::string::npos);
  EXPECT_NE(reason(p, 16, 64, p, 0).find("rows"), std::string::npos);
  EXPECT_NE(reason(p, 16, 60, p, 1).find("multiple of 8"), std::string::npos);
  EXPECT_NE(reason(p, 0, 64, p, 1).find("N >= 1"), std::string::npos);
  EXPECT_NE(reason(p, 16, 16384, p, 2).find("shared memory"), std::string::npos);
  EXPECT_NE(reason(p + 1, 16, 64, p, 1).find("aligned"), std::string::npos);
  EXPECT_NE(reason(p, 16, 64, p + 4, 1).find("aligned"), std::string::npos);
  EXPECT_NE(cuda::bf16_gemv_unsupported_reason(p, 16, 64, p, 1, nullptr).find("output"),
            std::string::npos);
}

TEST_F(LinearCuda, ElementwiseMatchCpu) {
  std::mt19937 rng(25);
  for (int T : {1, 3, 19, 99}) {
    const int V = 1000, H = 136, I = 77;
    auto table = random_bf16(size_t(V) * H, rng, 1.0f);
    std::vector<int32_t> ids(T);
    for (auto& id : ids) id = int32_t(rng() % V);
    std::vector<uint16_t> want(size_t(T) * H);
    embedding_gather_cpu(table.data(), V, H, ids.data(), T, want.data());
    Dev<uint16_t> dt(table), dout(want.size());
    Dev<int32_t> di(ids);
    dout.poison();
    sync_ok(cuda::embedding_gather(dt.ptr(), V, H, di.ptr(), T, dout.ptr(), nullptr));
    EXPECT_EQ(dout.download(), want) << "gather T=" << T;
    EXPECT_TRUE(dout.guards_intact());

    auto gu = random_bf16(size_t(T) * 2 * I, rng, 4.0f);
    std::vector<uint16_t> act(size_t(T) * I);
    silu_mul_cpu(gu.data(), T, I, act.data());
    Dev<uint16_t> dgu(gu), dact(act.size());
    dact.poison();
    sync_ok(cuda::silu_mul(dgu.ptr(), T, I, dact.ptr(), nullptr));
    EXPECT_LE(nmse(dact.download(), act, from_bf16, from_bf16, "silu_mul"), 1e-5);
    EXPECT_TRUE(dact.guards_intact());

    auto a = random_bf16(size_t(T) * H, rng, 1.0f), b = random_bf16(a.size(), rng, 1.0f);
    std::vector<uint16_t> sum(a.size());
    add_cpu(a.data(), b.data(), int64_t(a.size()), sum.data());
    Dev<uint16_t> da(a), db(b), ds(a.size());
    ds.poison();
    sync_ok(cuda::add(da.ptr(), db.ptr(), int64_t(a.size()), ds.ptr(), nullptr));
    EXPECT_EQ(ds.download(), sum) << "add is exact float math with one rounding on both sides";
    EXPECT_TRUE(ds.guards_intact());

    auto bias = random_bf16(H, rng, 1.0f);
    std::vector<uint16_t> yb = a;
    add_bias_cpu(yb.data(), T, H, bias.data());
    Dev<uint16_t> dyb(a), dbias(bias);
    sync_ok(cuda::add_bias(dyb.ptr(), false, T, H, dbias.ptr(), nullptr));
    EXPECT_EQ(dyb.download(), yb);
    EXPECT_TRUE(dyb.guards_intact());
  }
}

}  // namespace
}  // namespace tetra::ops
