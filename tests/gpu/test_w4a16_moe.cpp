// W4A16 grouped MoE GEMMs vs a CPU reference on the same dequantized weights.
// Every case: fresh random data, outputs poisoned (NaN bytes) before each launch, guard bytes
// around the outputs, rows owned by no expert must stay poisoned, NMSE <= 1e-5, no NaN/Inf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "core/cuda_check.h"
#include "core/half.h"
#include "moe/expert_weights.h"
#include "ops/moe/w4a16_launch.h"
#include "ops/moe/w4a16_moe.h"
#include "ops/moe/w4a16_weights.h"
#include "wgmma_order_rows.h"

namespace tetra {
namespace {

float e4m3_value(uint8_t b) {  // independent of the code under test
  const int e = (b >> 3) & 15, m = b & 7;
  return e == 0 ? std::ldexp(float(m) / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
}
float e2m1_value(uint8_t code) {
  static const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}

struct HostMatrix {  // ModelOpt bytes plus the float dequantization the reference uses
  int n = 0, k = 0;
  float s2 = 1.0f;
  std::vector<uint8_t> weight;  // [n, k/2]
  std::vector<uint8_t> scale;   // [n, k/16] e4m3
  std::vector<float> deq;       // [n, k] E2M1 * scale * s2
  void fill(int n_, int k_, float s2_, std::mt19937& rng) {
    n = n_, k = k_, s2 = s2_;
    weight.resize(size_t(n) * k / 2);
    scale.resize(size_t(n) * k / 16);
    for (auto& b : weight) b = uint8_t(rng());
    // Scales 2^-9 (subnormal) .. 448, weighted towards the normal middle; a few subnormals.
    for (auto& s : scale) {
      const uint32_t r = rng() % 64;
      s = r == 0 ? uint8_t(1 + rng() % 7) : uint8_t(0x30 + rng() % 0x30);
    }
    deq.resize(size_t(n) * k);
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < k; ++c) {
        const uint8_t b = weight[size_t(r) * k / 2 + c / 2];
        const uint8_t code = (c & 1) ? (b >> 4) : (b & 15);
        deq[size_t(r) * k + c] = e2m1_value(code) * e4m3_value(scale[size_t(r) * k / 16 + c / 16]) * s2;
      }
  }
  Nvfp4MatrixView view(const std::string& name) const {
    return Nvfp4MatrixView{weight.data(), scale.data(), s2, n, k, name};
  }
};

struct HostLayer {
  int E, H, I;
  std::vector<HostMatrix> gate, up, down;  // [E]
};

HostLayer make_layer(int E, int H, int I, std::mt19937& rng, bool split_s2) {
  HostLayer L{E, H, I, std::vector<HostMatrix>(E), std::vector<HostMatrix>(E), std::vector<HostMatrix>(E)};
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  for (int e = 0; e < E; ++e) {
    // s2 so that weights are O(1/sqrt(k)) and activations stay O(1)
    const float s2g = u(rng) / (40.0f * std::sqrt(float(H)));
    const float s2u = split_s2 ? s2g * u(rng) : s2g;
    L.gate[e].fill(I, H, s2g, rng);
    L.up[e].fill(I, H, s2u, rng);
    L.down[e].fill(H, I, u(rng) / (40.0f * std::sqrt(float(I))), rng);
  }
  return L;
}

PackedMoeLayer pack_layer(const HostLayer& L) {
  PackedMoeLayer P = make_packed_moe_layer(L.E, L.H, L.I);
  for (int e = 0; e < L.E; ++e)
    pack_moe_expert(P, e, L.gate[e].view("gate"), L.up[e].view("up"), L.down[e].view("down"));
  return P;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = float_to_bf16(d(rng));
  return v;
}

// Parallel loop over rows (the GPU machine has 16 cores; the CPU reference is the slow part).
template <typename F>
void parallel_rows(int rows, F f) {
  const int nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (int t = 0; t < nt; ++t)
    th.emplace_back([&, t] {
      for (int r = t; r < rows; r += nt) f(r);
    });
  for (auto& x : th) x.join();
}

template <typename T>
struct DevBuf {  // device buffer with `guard` poisoned elements either side
  static constexpr size_t kGuard = 64;
  T* base = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t n_) : n(n_) { TETRA_CUDA_CHECK(cudaMalloc(&base, (n + 2 * kGuard) * sizeof(T))); }
  ~DevBuf() { cudaFree(base); }
  T* ptr() { return base + kGuard; }
  void poison() { TETRA_CUDA_CHECK(cudaMemset(base, 0xff, (n + 2 * kGuard) * sizeof(T))); }
  void upload(const std::vector<T>& v) {
    TETRA_CUDA_CHECK(cudaMemcpy(ptr(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download_all() {  // guards included
    std::vector<T> v(n + 2 * kGuard);
    TETRA_CUDA_CHECK(cudaMemcpy(v.data(), base, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

struct Case {
  std::string name;
  int E, H, I;
  std::vector<int> counts;     // [E] rows per expert
  bool masked = false;         // row_start = e * max_m (gaps stay poisoned)
  bool gather = false;         // GEMM1 reads x through a random gather index
  bool slots = false;          // expert_ids: active experts shuffled, padded with -1
  bool split_s2 = false;
  bool y_f32 = true;
};

struct Stats {
  double nmse = 0;
  size_t bad = 0;  // NaN/Inf among the outputs that must be written
  size_t poison_lost = 0;
};

// Checks a [rows, cols] output against ref for rows in `owned`, and that other rows and the
// guards still hold the poison pattern.
template <typename T>
Stats compare(const std::vector<T>& all, size_t guard, int rows, int cols,
              const std::vector<char>& owned, const std::vector<float>& ref) {
  Stats s;
  double num = 0, den = 0;
  auto value = [](T v) -> float {
    if constexpr (sizeof(T) == 2) return bf16_to_float(v);
    else return v;
  };
  auto poisoned = [](T v) {
    if constexpr (sizeof(T) == 2) return v == 0xffff;
    else { uint32_t u; std::memcpy(&u, &v, 4); return u == 0xffffffffu; }
  };
  for (size_t i = 0; i < guard; ++i) {
    s.poison_lost += !poisoned(all[i]);
    s.poison_lost += !poisoned(all[all.size() - 1 - i]);
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const T v = all[guard + size_t(r) * cols + c];
      if (!owned[r]) {
        s.poison_lost += !poisoned(v);
        continue;
      }
      const float f = value(v);
      if (!std::isfinite(f)) {
        ++s.bad;
        continue;
      }
      const double d = double(f) - ref[size_t(r) * cols + c];
      num += d * d;
      den += double(ref[size_t(r) * cols + c]) * ref[size_t(r) * cols + c];
    }
  s.nmse = den > 0 ? num / den : (num > 0 ? 1.0 : 0.0);
  return s;
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.name);
  std::mt19937 rng(seed);
  const int E = c.E, H = c.H, I = c.I;
  const HostLayer L = make_layer(E, H, I, rng, c.split_s2);
  const PackedMoeLayer P = pack_layer(L);
  EXPECT_EQ(P.experts_with_split_s2 > 0, c.split_s2);
  const MoeWeightsBuffer W(P);

  // Row mapping.
  std::vector<int> start(E), count = c.counts;
  int max_m = *std::max_element(count.begin(), count.end());
  int total = 0;
  for (int e = 0; e < E; ++e) {
    start[e] = c.masked ? e * (max_m + 2) : total;
    total = c.masked ? (e + 1) * (max_m + 2) : total + count[e];
  }
  std::vector<char> owned(size_t(total), 0);
  std::vector<int> expert_of(size_t(total), -1);
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < count[e]; ++r) owned[start[e] + r] = 1, expert_of[start[e] + r] = e;
  std::vector<int> slot_ids;
  if (c.slots) {
    for (int e = 0; e < E; ++e)
      if (count[e] > 0) slot_ids.push_back(e);
    std::shuffle(slot_ids.begin(), slot_ids.end(), rng);
    slot_ids.push_back(-1);
    slot_ids.push_back(-1);
  }
  const int x_rows = c.gather ? total + 5 : total;
  std::vector<int> gather_idx;
  if (c.gather) {
    gather_idx.resize(size_t(total));
    for (auto& g : gather_idx) g = int(rng() % uint32_t(x_rows));
  }
  const std::vector<uint16_t> x = random_bf16(size_t(x_rows) * H, rng);
  const std::vector<uint16_t> act_in = random_bf16(size_t(total) * I, rng);  // GEMM2's own input

  // CPU reference (double accumulation).
  std::vector<float> ref1(size_t(total) * I, 0.0f), ref2(size_t(total) * H, 0.0f);
  parallel_rows(total, [&](int r) {
    const int e = expert_of[r];
    if (e < 0) return;
    const uint16_t* xr = &x[size_t(c.gather ? gather_idx[r] : r) * H];
    std::vector<float> xf(H);
    for (int k = 0; k < H; ++k) xf[k] = bf16_to_float(xr[k]);
    for (int n = 0; n < I; ++n) {
      double g = 0, u = 0;
      const float* wg = &L.gate[e].deq[size_t(n) * H];
      const float* wu = &L.up[e].deq[size_t(n) * H];
      for (int k = 0; k < H; ++k) g += double(xf[k]) * wg[k], u += double(xf[k]) * wu[k];
      ref1[size_t(r) * I + n] = float(g / (1.0 + std::exp(-g)) * u);
    }
    for (int n = 0; n < H; ++n) {
      double y = 0;
      const float* wd = &L.down[e].deq[size_t(n) * I];
      for (int k = 0; k < I; ++k) y += double(bf16_to_float(act_in[size_t(r) * I + k])) * wd[k];
      ref2[size_t(r) * H + n] = float(y);
    }
  });

  // Device inputs.
  DevBuf<int> d_start(E), d_count(E), d_slots(std::max<size_t>(1, slot_ids.size())),
      d_gather(std::max(1, total));
  d_start.upload(start);
  d_count.upload(count);
  if (c.slots) d_slots.upload(slot_ids);
  if (c.gather) d_gather.upload(gather_idx);
  DevBuf<uint16_t> d_x(size_t(x_rows) * H), d_act_in(size_t(total) * I), d_act(size_t(total) * I);
  d_x.upload(x);
  d_act_in.upload(act_in);
  DevBuf<float> d_y32(size_t(total) * H);
  DevBuf<uint16_t> d_y16(size_t(total) * H);

  MoeGemmProblem p;
  p.num_experts = E;
  p.hidden = H;
  p.inter = I;
  p.total_rows = total;
  p.num_slots = c.slots ? int(slot_ids.size()) : 0;
  MoeRows rows;
  rows.row_start = d_start.ptr();
  rows.row_count = d_count.ptr();
  rows.expert_ids = c.slots ? d_slots.ptr() : nullptr;
  rows.gather = c.gather ? d_gather.ptr() : nullptr;
  ASSERT_EQ(moe_gemm_unsupported_reason(p), "") << p;

  struct Variant {
    MoeKernel kernel;
    bool explicit_cfg;
    moe_detail::DecodeConfig cfg;
    bool pdl = false;
  };
  const Variant variants[] = {
      {MoeKernel::kAuto, false, {}},
      {MoeKernel::kAuto, false, {}, true},                   // GEMM2 as programmatic dependent
      {MoeKernel::kDecode, false, {}},
      // Classic decode kernel (4 chunks per batch, activations with the weights).
      {MoeKernel::kDecode, true, {.token_tiles = 1, .k_warps = 4}, true},  // + PDL GEMM2
      {MoeKernel::kDecode, true, {.token_tiles = 1, .k_warps = 8}},
      {MoeKernel::kDecode, true, {.token_tiles = 2, .k_warps = 8}},  // 16 rows per pass
      {MoeKernel::kDecode, true, {.token_tiles = 4, .k_warps = 4}},  // 32 rows per pass
      // Late activations (more than 8 rows per expert run as repeated passes).
      {MoeKernel::kDecode, true, {.late_x = true, .chunks_per_batch = 4, .min_blocks_per_sm = 4}},
      {MoeKernel::kDecode, true, {.late_x = true, .chunks_per_batch = 4, .min_blocks_per_sm = 5}, true},
      {MoeKernel::kDecode, true, {.late_x = true, .chunks_per_batch = 4, .min_blocks_per_sm = 6}},
      {MoeKernel::kDecode, true, {.late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 8}, true},
      // ... with the scales staged in shared memory, and without (whatever decode_scales_in_smem
      // would pick for the grid)
      {MoeKernel::kDecode, true,
       {.late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 8, .scales_smem = 1}, true},
      {MoeKernel::kDecode, true,
       {.late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 8, .scales_smem = 0}},
      {MoeKernel::kDecode, true,
       {.k_warps = 2, .late_x = true, .chunks_per_batch = 8, .min_blocks_per_sm = 8}},
      {MoeKernel::kDecode, true,  // the 3-warp one-wave variant (one_wave_late_config)
       {.k_warps = 3, .late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 10}, true},
      {MoeKernel::kDecode, true,
       {.k_warps = 3, .late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 10,
        .scales_smem = 1}, true},
      {MoeKernel::kDecode, true,  // the 8-warp shape of small grids (one_wave_late_config)
       {.k_warps = 8, .late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 4}, true},
      {MoeKernel::kDecode, true,
       {.k_warps = 8, .late_x = true, .chunks_per_batch = 2, .min_blocks_per_sm = 4,
        .scales_smem = 1}},
      {MoeKernel::kTiled, true, {.tiled_blocks_per_sm = 1}},  // tiled, one block per SM
      {MoeKernel::kTiled, false, {}},                       // tiled, two blocks per SM
      {MoeKernel::kWgmma, false, {}},                       // warpgroup MMA (SM90a)
      // ... with k split over clusters of 2 and 8 blocks (shapes with fewer chunks than blocks
      // leave ranks without work) and each token tile forced
      {MoeKernel::kWgmma, true, {.wgmma = {.k_split = 2, .token_tile = 32}}},
      {MoeKernel::kWgmma, true, {.wgmma = {.k_split = 8, .token_tile = 128}}},
      {MoeKernel::kWgmma, true, {.wgmma = {.k_split = 1, .token_tile = 128}}},
      {MoeKernel::kWgmma, true, {.wgmma = {.k_split = 1, .token_tile = 64}}},
      {MoeKernel::kWgmma, true, {.wgmma = {.k_split = 4, .token_tile = 64}}},
  };
  // The wgmma kernel reads x and act in wgmma order (moe/wgmma_order.h) and writes act so.
  DevBuf<uint16_t> d_xw(size_t(x_rows) * H), d_act_in_w(size_t(total) * I);
  ASSERT_EQ(moe_w4a16_to_wgmma_order(d_x.ptr(), x_rows, H, d_xw.ptr(), nullptr), cudaSuccess);
  ASSERT_EQ(moe_w4a16_to_wgmma_order(d_act_in.ptr(), total, I, d_act_in_w.ptr(), nullptr), cudaSuccess);
  auto natural_act = [&](std::vector<uint16_t> all) {  // act rows of a download_all() back in order
    return test::rows_from_wgmma_order(std::move(all), DevBuf<uint16_t>::kGuard, total, I);
  };
  for (const Variant& v : variants) {
    const MoeKernel k = v.kernel;
    const bool wg = k == MoeKernel::kWgmma;
    p.x_wgmma_order = wg;
    const uint16_t* x_in = wg ? d_xw.ptr() : d_x.ptr();
    const uint16_t* act_in_dev = wg ? d_act_in_w.ptr() : d_act_in.ptr();
    auto act_out = [&] { return wg ? natural_act(d_act.download_all()) : d_act.download_all(); };
    const moe_detail::DecodeConfig* cfg = v.explicit_cfg ? &v.cfg : nullptr;
    std::ostringstream label;
    label << moe_kernel_name(k);
    if (cfg) label << " " << *cfg;
    if (v.pdl) label << " pdl";
    SCOPED_TRACE(label.str());
    p.gemm2_pdl = v.pdl;
    d_act.poison();
    ASSERT_EQ(moe_detail::gemm1_with(p, W.view(), rows, x_in, d_act.ptr(), nullptr, k, cfg),
              cudaSuccess);
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    const Stats s1 = compare(act_out(), DevBuf<uint16_t>::kGuard, total, I, owned, ref1);
    EXPECT_EQ(s1.bad, 0u);
    EXPECT_EQ(s1.poison_lost, 0u);
    EXPECT_LE(s1.nmse, 1e-5) << "gemm1 " << p;
    {  // fixed summation order (no atomics): a second run is bit-identical
      const auto first = d_act.download_all();
      ASSERT_EQ(moe_detail::gemm1_with(p, W.view(), rows, x_in, d_act.ptr(), nullptr, k, cfg),
                cudaSuccess);
      TETRA_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(d_act.download_all(), first) << "gemm1 second run differs";
    }

    if (c.y_f32) {
      d_y32.poison();
      ASSERT_EQ(moe_detail::gemm2_with(p, W.view(), rows, act_in_dev, d_y32.ptr(), true, nullptr,
                                       k, cfg),
                cudaSuccess);
      TETRA_CUDA_CHECK(cudaDeviceSynchronize());
      const Stats s2 = compare(d_y32.download_all(), DevBuf<float>::kGuard, total, H, owned, ref2);
      EXPECT_EQ(s2.bad, 0u);
      EXPECT_EQ(s2.poison_lost, 0u);
      EXPECT_LE(s2.nmse, 1e-5) << "gemm2 f32 " << p;
    } else {
      d_y16.poison();
      ASSERT_EQ(moe_detail::gemm2_with(p, W.view(), rows, act_in_dev, d_y16.ptr(), false, nullptr,
                                       k, cfg),
                cudaSuccess);
      TETRA_CUDA_CHECK(cudaDeviceSynchronize());
      const Stats s2 = compare(d_y16.download_all(), DevBuf<uint16_t>::kGuard, total, H, owned, ref2);
      EXPECT_EQ(s2.bad, 0u);
      EXPECT_EQ(s2.poison_lost, 0u);
      EXPECT_LE(s2.nmse, 1e-5) << "gemm2 bf16 " << p;
    }
  }
}

class W4a16Moe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(W4a16Moe, Glm5Shape) {
  run_case({"glm5", 8, 6144, 2048, {1, 0, 3, 19, 2, 0, 5, 8}}, 1);
}
TEST_F(W4a16Moe, Glm45AirShapeSlotsAndGather) {
  Case c{"air", 6, 4096, 1408, {99, 1, 0, 3, 19, 7}};
  c.slots = true;
  c.gather = true;
  run_case(c, 2);
}
TEST_F(W4a16Moe, Qwen3ShapeLargeCountsSplitS2) {
  Case c{"qwen3", 4, 2048, 768, {989, 0, 1, 130}};
  c.split_s2 = true;
  run_case(c, 3);
}
TEST_F(W4a16Moe, AllTokensOnOneExpertMaskedBf16Out) {
  Case c{"one-expert", 4, 512, 256, {0, 0, 300, 0}};
  c.masked = true;
  c.y_f32 = false;
  run_case(c, 4);
}
TEST_F(W4a16Moe, OddSmallShapes) {
  run_case({"h64-i64", 3, 64, 64, {5, 17, 0}}, 5);
  run_case({"h192-i320", 5, 192, 320, {1, 0, 40, 9, 129}}, 6);
  Case c{"h512-i448-masked-slots", 4, 512, 448, {3, 0, 77, 1}};
  c.masked = true;
  c.slots = true;
  c.split_s2 = true;
  run_case(c, 7);
}

TEST_F(W4a16Moe, UnsupportedSizeIsRefusedWithReason) {
  MoeGemmProblem p;
  p.num_experts = 4;
  p.hidden = 512;
  p.inter = 80;  // multiple of 16, not of 64
  p.total_rows = 4;
  const std::string why = moe_gemm_unsupported_reason(p);
  EXPECT_NE(why.find("intermediate size 80"), std::string::npos) << why;
  MoeWeightsDevice w;
  MoeRows rows;
  EXPECT_EQ(moe_w4a16_gemm1(p, w, rows, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

// The wgmma kernel needs x in its order: asked for explicitly without it, the launch is refused;
// kAuto picks it only with the order and enough rows per expert, and without it the tiled kernel
// except for one or two experts at up to 32 rows (the decode kernel).
TEST_F(W4a16Moe, WgmmaKernelNeedsWgmmaOrder) {
  std::mt19937 rng(9);
  const HostLayer L = make_layer(2, 128, 64, rng, false);
  const PackedMoeLayer P = pack_layer(L);
  const MoeWeightsBuffer W(P);
  DevBuf<int> d_start(2), d_count(2);
  d_start.upload({0, 100});
  d_count.upload({100, 100});
  DevBuf<uint16_t> d_x(size_t(200) * 128), d_act(size_t(200) * 64);
  MoeGemmProblem p;
  p.num_experts = 2;
  p.hidden = 128;
  p.inter = 64;
  p.total_rows = 200;
  MoeRows rows;
  rows.row_start = d_start.ptr();
  rows.row_count = d_count.ptr();
  EXPECT_EQ(moe_pick_kernel(p), MoeKernel::kTiled);
  EXPECT_EQ(moe_w4a16_gemm1(p, W.view(), rows, d_x.ptr(), d_act.ptr(), nullptr, MoeKernel::kWgmma),
            cudaErrorInvalidValue);
  p.x_wgmma_order = true;
  EXPECT_EQ(moe_pick_kernel(p), MoeKernel::kWgmma);
  p.total_rows = 18;  // 9 rows per expert: still the wgmma kernel
  EXPECT_EQ(moe_pick_kernel(p), MoeKernel::kWgmma);
  p.total_rows = 16;  // 8 rows per expert: the decode kernel, whatever the order
  EXPECT_EQ(moe_pick_kernel(p), MoeKernel::kDecode);
  p.x_wgmma_order = false;
  p.total_rows = 18;  // two experts (a shared expert's own launch) up to 32 rows: decode
  EXPECT_EQ(moe_pick_kernel(p), MoeKernel::kDecode);
  p.total_rows = 66;  // 33 rows each: tiled
  EXPECT_EQ(moe_pick_kernel(p), MoeKernel::kTiled);
  p.num_experts = 3;  // three experts at 9 rows: tiled
  p.total_rows = 27;
  EXPECT_EQ(moe_pick_kernel(p), MoeKernel::kTiled);
}

}  // namespace
}  // namespace tetra
