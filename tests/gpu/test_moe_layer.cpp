// Every built CUDA MoE layer backend against the cpu backend on the same weights and fresh random
// data: tiny and real preset shapes (real ones at a reduced expert count so that the CPU
// reference stays fast: the GEMM shapes H, I, top-k and routing rules are the real ones),
// T in {1, 3, 19, 99, 989, 4096}, both layouts, all tokens on one expert, empty experts.
// Checks: NMSE = sum (a-b)^2 / sum b^2 <= 1e-5 (cuda-w4a4: 2e-4, see nmse_bound), no NaN/Inf,
// guard bytes around the output intact,
// the GPU's expert ids equal route_cpu's, no dropped pairs; a CUDA-graph replay equals eager.
// cuda-w4a4 layers get input scales on every linear and are held to the cpu backend with W4A4
// numerics (MoeLayerOptions::w4a4), its twin; the W4a4* tests run it alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "cpu/moe_layer_fixture.h"
#include "guarded_device_array.h"
#include "moe/moe_layer.h"
#include "moe/router.h"
#include "ops/moe/moe_layer_cuda.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/w4a16_launch.h"
#include "ops/norm/rms_norm_cuda.h"

namespace tetra {
namespace {

using moe::ExpertFormat;
using moe::RouterParams;
using test::HostMoeLayer;

// Device bf16 buffer with kGuard poisoned elements either side.
struct GuardedBf16 {
  static constexpr size_t kGuard = 256;
  static constexpr uint16_t kPoison = 0x7fa5;  // a NaN pattern nobody writes by accident
  uint16_t* base = nullptr;
  size_t n = 0;
  explicit GuardedBf16(size_t n_) : n(n_) {
    TETRA_CUDA_CHECK(cudaMalloc(&base, (n + 2 * kGuard) * 2));
    std::vector<uint16_t> p(n + 2 * kGuard, kPoison);
    TETRA_CUDA_CHECK(cudaMemcpy(base, p.data(), p.size() * 2, cudaMemcpyHostToDevice));
  }
  ~GuardedBf16() { cudaFree(base); }
  uint16_t* ptr() { return base + kGuard; }
  void upload(const std::vector<uint16_t>& v) {
    TETRA_CUDA_CHECK(cudaMemcpy(ptr(), v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  }
  std::vector<uint16_t> body() const {
    std::vector<uint16_t> v(n);
    TETRA_CUDA_CHECK(cudaMemcpy(v.data(), base + kGuard, n * 2, cudaMemcpyDeviceToHost));
    return v;
  }
  size_t guards_lost() const {
    std::vector<uint16_t> v(n + 2 * kGuard);
    TETRA_CUDA_CHECK(cudaMemcpy(v.data(), base, v.size() * 2, cudaMemcpyDeviceToHost));
    size_t lost = 0;
    for (size_t i = 0; i < kGuard; ++i) lost += (v[i] != kPoison) + (v[v.size() - 1 - i] != kPoison);
    return lost;
  }
};

std::vector<std::string> cuda_backends() {
  std::vector<std::string> out;
  for (const BackendCaps& b : moe_backends())
    if (b.built && !b.runs_on_cpu) out.push_back(b.name);
  return out;
}

ExpertFormat format_of(const std::string& backend) {
  const BackendCaps* b = find_backend(backend);
  return b->weight_formats[0] == WeightFormat::BF16 ? ExpertFormat::BF16 : ExpertFormat::NVFP4;
}

bool is_w4a4(const std::string& backend) { return backend == "cuda-w4a4"; }

// NMSE bound against the cpu backend. W4A4 requantizes GEMM1's output as GEMM2's input: a 1-ulp
// difference of a bf16 intermediate (float summation order) can move an E4M3 block scale or an
// E2M1 code, a discrete step of a whole 16-value block that the W4A16/BF16 paths do not have
// (measured on the H200: up to 4.5e-5 on one GLM-5-shape token). test_w4a4_moe holds each W4A4
// GEMM to its CPU twin on the same inputs, where there is no requantization difference.
double nmse_bound(const std::string& backend) { return is_w4a4(backend) ? 2e-4 : 1e-5; }

// A random layer in the backend's format; for cuda-w4a4 with input scales on every linear
// (the cpu runner of such a layer is then the W4A4 twin, see runner()).
HostMoeLayer layer_for(const std::string& backend, const RouterParams& rp, int H, int I, int Is,
                       uint32_t seed) {
  HostMoeLayer L = test::random_layer(rp, H, I, Is, seed, true, format_of(backend));
  if (is_w4a4(backend)) test::add_input_scales(L, seed + 777);
  return L;
}

std::unique_ptr<moe::MoeLayerRunner> runner(const HostMoeLayer& L, const std::string& backend,
                                            int max_tokens, TokenLayout layout) {
  moe::MoeLayerOptions o;
  o.backend = backend;
  o.max_tokens = max_tokens;
  o.layout = layout;
  o.w4a4 = backend == "cpu" && test::has_input_scales(L);  // the cuda-w4a4 twin
  return moe::make_moe_layer(L.weights(), o);
}

// route_cpu's ids for x, independently of both runners.
std::vector<int32_t> cpu_ids(const HostMoeLayer& L, const std::vector<uint16_t>& x, int T) {
  const int E = L.router.num_experts;
  std::vector<float> logits(size_t(T) * E);
  moe::router_logits_cpu(x.data(), L.gate.data(), T, L.hidden, E, logits.data());
  std::vector<int32_t> ids(size_t(T) * L.router.top_k);
  std::vector<float> w(ids.size());
  moe::route_cpu(logits.data(), L.bias.empty() ? nullptr : L.bias.data(), T, L.router, ids.data(),
                 w.data());
  return ids;
}

struct LayerCase {
  std::string name;
  RouterParams router;
  int H, I, shared_inter;
  std::vector<int> tokens;
  uint32_t seed;
};

// One layer, every T, both layouts, every CUDA backend (or the ones given).
void run_layer_case(const LayerCase& c,
                    const std::vector<std::string>& backends = cuda_backends()) {
  SCOPED_TRACE(c.name);
  for (const std::string& backend : backends) {
    SCOPED_TRACE(backend);
    const HostMoeLayer L = layer_for(backend, c.router, c.H, c.I, c.shared_inter, c.seed);
    int max_t = 0;
    for (int T : c.tokens) max_t = std::max(max_t, T);
    auto cpu = runner(L, "cpu", max_t, TokenLayout::Contiguous);
    auto contiguous = runner(L, backend, max_t, TokenLayout::Contiguous);
    auto masked = runner(L, backend, max_t, TokenLayout::Masked);
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const int T = c.tokens[i];
      SCOPED_TRACE("T=" + std::to_string(T));
      const bool with_residual = i % 2 == 1;
      const std::vector<uint16_t> x = test::random_x(T, c.H, c.seed * 1000 + uint32_t(T));
      const std::vector<uint16_t> res = test::random_x(T, c.H, c.seed * 1000 + uint32_t(T) + 1);
      std::vector<uint16_t> want(x.size());
      cpu->forward(x.data(), T, want.data(), with_residual ? res.data() : nullptr, nullptr);
      const std::vector<int32_t> want_ids = cpu_ids(L, x, T);
      for (auto* gpu : {contiguous.get(), masked.get()}) {
        const bool is_masked = gpu == masked.get();
        SCOPED_TRACE(is_masked ? "masked" : "contiguous");
        ASSERT_TRUE(gpu->on_device());
        GuardedBf16 dx(x.size()), dres(x.size()), dout(x.size());
        dx.upload(x);
        dres.upload(res);
        gpu->forward(dx.ptr(), T, dout.ptr(), with_residual ? dres.ptr() : nullptr, nullptr);
        TETRA_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<uint16_t> got = dout.body();
        size_t bad = 0;
        for (uint16_t v : got) bad += !std::isfinite(bf16_to_float(v));
        EXPECT_EQ(bad, 0u);
        EXPECT_EQ(dout.guards_lost(), 0u);
        EXPECT_EQ(dx.guards_lost() + dres.guards_lost(), 0u);
        const double e = test::nmse_bf16(got, want);
        EXPECT_LE(e, nmse_bound(backend));
        if (auto* w4 = dynamic_cast<moe::CudaW4a16MoeLayer*>(gpu)) {
          EXPECT_EQ(w4->dropped_pairs(), 0);
          EXPECT_EQ(w4->last_ids(T), want_ids);
        }
        std::printf("  %-22s %-10s %-10s T=%-5d nmse %.3g\n", c.name.c_str(), backend.c_str(),
                    is_masked ? "masked" : "contiguous", T, e);
      }
    }
  }
}

class MoeLayerGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

RouterParams preset_router(const std::string& preset, int experts) {
  const ModelConfig c = preset_config(preset);
  RouterParams rp = moe::router_params_of(c);
  rp.num_experts = experts;
  moe::validate_router_params(rp);
  return rp;
}

TEST_F(MoeLayerGpu, TinyPresetsEveryTokenCount) {
  for (const std::string preset : {"tiny-glm5", "tiny-glm4.5-air", "tiny-glm4.7",
                                   "tiny-deepseek-v3", "tiny-qwen3-30b-a3b"}) {
    const ModelConfig c = preset_config(preset);
    run_layer_case({preset, moe::router_params_of(c), int(c.hidden_size),
                    int(c.moe_intermediate_size),
                    int(c.n_shared_experts * c.moe_intermediate_size),
                    {1, 3, 19, 99, 989, 4096}, 1});
  }
}

// Real H, I, top-k and routing rules; 16 experts (32 for Qwen3) instead of 128..256 to keep the
// CPU reference's dequantized weights and time small. DeepSeek-V3 keeps 8 groups (of 2).
TEST_F(MoeLayerGpu, Glm5Shape) {
  run_layer_case({"glm5 (E=16)", preset_router("glm5", 16), 6144, 2048, 2048, {1, 3, 19, 99}, 2});
}
TEST_F(MoeLayerGpu, Glm45AirShape) {
  run_layer_case({"glm4.5-air (E=16)", preset_router("glm4.5-air", 16), 4096, 1408, 1408,
                  {1, 3, 19, 99}, 3});
}
TEST_F(MoeLayerGpu, Glm47Shape) {
  run_layer_case({"glm4.7 (E=16)", preset_router("glm4.7", 16), 5120, 1536, 1536, {1, 19}, 4});
}
TEST_F(MoeLayerGpu, DeepseekV3ShapeGrouped) {
  run_layer_case({"deepseek-v3 (E=16)", preset_router("deepseek-v3", 16), 7168, 2048, 2048,
                  {1, 3, 19}, 5});
}
TEST_F(MoeLayerGpu, Qwen3ShapeUpTo4096) {
  run_layer_case({"qwen3-30b-a3b (E=32)", preset_router("qwen3-30b-a3b", 32), 2048, 768, 0,
                  {1, 3, 19, 99, 989, 4096}, 6});
}

// All tokens on expert 5 (the bias forces it), every other expert empty; top-1 and top-4.
void all_tokens_on_one_expert(const std::vector<std::string>& backends) {
  for (int top_k : {1, 4}) {
    RouterParams rp;
    rp.num_experts = 8;
    rp.top_k = top_k;
    for (const std::string& backend : backends) {
      HostMoeLayer L = layer_for(backend, rp, 256, 128, 0, 9);
      L.bias[5] = 100.0f;
      const int T = 300;
      const std::vector<uint16_t> x = test::random_x(T, 256, 10);
      const std::vector<int32_t> ids = cpu_ids(L, x, T);
      for (int t = 0; t < T; ++t) EXPECT_EQ(ids[size_t(t) * top_k], 5);
      std::vector<uint16_t> want(x.size());
      runner(L, "cpu", T, TokenLayout::Contiguous)->forward(x.data(), T, want.data(), nullptr, nullptr);
      for (TokenLayout layout : {TokenLayout::Contiguous, TokenLayout::Masked}) {
        auto gpu = runner(L, backend, T, layout);
        GuardedBf16 dx(x.size()), dout(x.size());
        dx.upload(x);
        gpu->forward(dx.ptr(), T, dout.ptr(), nullptr, nullptr);
        TETRA_CUDA_CHECK(cudaDeviceSynchronize());
        const double e = test::nmse_bf16(dout.body(), want);
        EXPECT_LE(e, nmse_bound(backend)) << backend << " top_k " << top_k;
        EXPECT_EQ(dout.guards_lost(), 0u);
        std::printf("  one expert %-10s top-%d %-10s T=%d nmse %.3g\n", backend.c_str(), top_k,
                    layout == TokenLayout::Masked ? "masked" : "contiguous", T, e);
      }
    }
  }
}
TEST_F(MoeLayerGpu, AllTokensOnOneExpert) { all_tokens_on_one_expert(cuda_backends()); }

// An NVFP4 layer whose shared expert stayed BF16 (the shared expert runs on the BF16 GEMMs).
TEST_F(MoeLayerGpu, Nvfp4ExpertsBf16SharedExpert) {
  const ModelConfig c = preset_config("tiny-glm5");
  const HostMoeLayer L = test::random_layer(moe::router_params_of(c), 256, 128, 192, 14, true,
                                            ExpertFormat::NVFP4, ExpertFormat::BF16);
  const int T = 37;
  const std::vector<uint16_t> x = test::random_x(T, 256, 15);
  std::vector<uint16_t> want(x.size());
  runner(L, "cpu", T, TokenLayout::Contiguous)->forward(x.data(), T, want.data(), nullptr, nullptr);
  auto gpu = runner(L, "cuda-w4a16", T, TokenLayout::Contiguous);
  GuardedBf16 dx(x.size()), dout(x.size());
  dx.upload(x);
  gpu->forward(dx.ptr(), T, dout.ptr(), nullptr, nullptr);
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  const double e = test::nmse_bf16(dout.body(), want);
  std::printf("  nvfp4 experts + bf16 shared T=%d nmse %.3g\n", T, e);
  EXPECT_LE(e, 1e-5);
  EXPECT_EQ(dout.guards_lost(), 0u);
}

// Many experts, few tokens: almost every expert is empty (also the GEMMs' slot padding).
TEST_F(MoeLayerGpu, MostExpertsEmpty) {
  RouterParams rp;
  rp.num_experts = 256;
  rp.top_k = 2;
  rp.scoring = moe::Scoring::Softmax;
  run_layer_case({"E=256 top-2", rp, 128, 64, 64, {1, 2, 3}, 12});
}

// Expert-parallel blocks (MoeLayerWeights::expert_begin): every CUDA backend against the cpu
// backend on the same block, both layouts; blocks with and without the shared expert, and one
// that no token routes to (the bias sends every token to experts 0..3).
TEST_F(MoeLayerGpu, ExpertParallelBlocksMatchCpu) {
  RouterParams rp = moe::router_params_of(preset_config("tiny-glm5"));
  struct Block {
    int begin, count;
    bool shared;
  };
  for (const bool forced : {false, true}) {
    RouterParams r = rp;
    if (forced) {
      r.n_group = 1, r.topk_group = 1, r.top_k = 4;
    }
    for (const std::string& backend : cuda_backends()) {
      SCOPED_TRACE(backend + (forced ? " forced" : ""));
      HostMoeLayer L = layer_for(backend, r, 256, 128, 128, 31);
      if (forced)
        for (int e = 0; e < 4; ++e) L.bias[size_t(e)] = 50.0f;
      const int E = r.num_experts;
      const std::vector<Block> blocks =
          forced ? std::vector<Block>{{8, E - 8, true}, {4, 4, false}}
                 : std::vector<Block>{{0, E / 2, true}, {E / 2, E / 2, false}, {3, 5, false}};
      for (const Block& b : blocks) {
        SCOPED_TRACE("block " + std::to_string(b.begin) + "+" + std::to_string(b.count));
        moe::MoeLayerOptions o;
        o.max_tokens = 99;
        o.backend = "cpu";
        o.w4a4 = is_w4a4(backend);
        auto cpu = moe::make_moe_layer(L.block_weights(b.begin, b.count, b.shared), o);
        for (TokenLayout layout : {TokenLayout::Contiguous, TokenLayout::Masked}) {
          o.backend = backend;
          o.layout = layout;
          auto gpu = moe::make_moe_layer(L.block_weights(b.begin, b.count, b.shared), o);
          for (int T : {1, 19, 99}) {
            const std::vector<uint16_t> x = test::random_x(T, 256, 40 + uint32_t(T));
            const std::vector<uint16_t> res = test::random_x(T, 256, 41 + uint32_t(T));
            const uint16_t* residual = b.shared ? res.data() : nullptr;
            std::vector<uint16_t> want(x.size());
            cpu->forward(x.data(), T, want.data(), residual, nullptr);
            GuardedBf16 dx(x.size()), dres(x.size()), dout(x.size());
            dx.upload(x);
            dres.upload(res);
            gpu->forward(dx.ptr(), T, dout.ptr(), residual ? dres.ptr() : nullptr, nullptr);
            TETRA_CUDA_CHECK(cudaDeviceSynchronize());
            const std::vector<uint16_t> got = dout.body();
            const double e = test::nmse_bf16(got, want);
            EXPECT_LE(e, nmse_bound(backend)) << "T=" << T;
            EXPECT_EQ(dout.guards_lost(), 0u);
            if (forced && b.begin >= 4 && !b.shared) {  // nothing routed here: exact zeros
              size_t nonzero = 0;
              for (uint16_t v : got) nonzero += bf16_to_float(v) != 0.0f;
              EXPECT_EQ(nonzero, 0u) << "T=" << T;
            }
            if (auto* w4 = dynamic_cast<moe::CudaMoeLayer*>(gpu.get())) {
              EXPECT_EQ(w4->dropped_pairs(), 0);  // other ranks' pairs are not "dropped"
              EXPECT_EQ(w4->last_ids(T), cpu_ids(L, x, T));
            }
            std::printf("  EP %-10s %-10s block %2d+%-2d T=%-3d nmse %.3g\n", backend.c_str(),
                        layout == TokenLayout::Masked ? "masked" : "contiguous", b.begin,
                        b.count, T, e);
          }
        }
      }
    }
  }
}

// The token path's settings (moe::CudaTokenPath) all match cpu to nmse_bound with the same expert ids,
// on both layouts and around each threshold: the one-launch token path (forced up to 99 tokens)
// against the separate launches, the shared expert as a slot of the routed GEMMs (also forced up
// to 99 tokens: several passes over its rows) against its own launches, serial or on the side
// stream, the combine and the token path with and without PDL, and GEMM1 routing one token
// itself. An EP block too. The side stream
// runs the same kernels as the serial launches: bit-equal. (The shared slot may pick another GEMM kernel than
// the shared expert's own launch, so it is held to the cpu tolerance, not to bits.)
TEST_F(MoeLayerGpu, TokenPathSettingsAgree) {
  moe::CudaTokenPath old_path;  // the launches before the fused path: all off
  old_path.persistent_max_tokens = 0;
  old_path.fused_route_max_tokens = 0;
  old_path.shared_slot_max_tokens = 0;
  old_path.shared_side_stream = false;
  old_path.combine_pdl = false;
  old_path.token_path_pdl = false;
  old_path.gemm_pair = 0;
  old_path.gemm1_pdl = false;
  old_path.gemm1_routes = false;
  old_path.route_pdl = false;
  moe::CudaTokenPath all_fused;  // everything fused up to 99 tokens
  all_fused.persistent_max_tokens = 0;  // the launches' fusions (the one-launch layer: below)
  all_fused.fused_route_max_tokens = 99;
  all_fused.shared_slot_max_tokens = 99;
  all_fused.combine_pdl = true;
  moe::CudaTokenPath side_only = old_path;
  side_only.shared_side_stream = true;
  moe::CudaTokenPath cold;  // the default without the token path's L2 warm-up (a hint only)
  cold.warm_shared = false;
  moe::CudaTokenPath plain_launch;  // the default with the token path and combine without PDL,
  plain_launch.token_path_pdl = false;  // and the routed GEMMs as one launch
  plain_launch.combine_pdl = false;
  plain_launch.gemm_pair = 2;
  plain_launch.gemm1_pdl = false;
  plain_launch.route_pdl = false;
  moe::CudaTokenPath path_routes;  // one token routed by the token path (the default: by GEMM1)
  path_routes.gemm1_routes = false;
  moe::CudaTokenPath narrow_gemm2;  // the default with 4-warp GEMM2 blocks on small grids, the
  narrow_gemm2.gemm2_wide = false;  // pair kernel's k split
  const std::vector<std::pair<std::string, moe::CudaTokenPath>> paths = {
      {"default", moe::CudaTokenPath{}}, {"no L2 warm-up", cold}, {"no PDL launches", plain_launch},
      {"token path routes", path_routes}, {"old", old_path}, {"all fused", all_fused},
      {"side stream", side_only}, {"4-warp GEMM2", narrow_gemm2}};
  const RouterParams glm = preset_router("glm5", 16);
  RouterParams soft;
  soft.scoring = moe::Scoring::Softmax;
  soft.num_experts = 40;
  soft.top_k = 6;
  struct Case {
    std::string name;
    RouterParams router;
    int H, I, Is, begin, count;
  };
  // 128 experts, top-8: up to 99 tokens the routed GEMMs stay on the decode kernel (<= 8 rows per
  // expert) while the shared expert's own launches from 33 rows take the tiled kernel.
  RouterParams soft128 = soft;
  soft128.num_experts = 128;
  soft128.top_k = 8;
  const std::vector<Case> cases = {{"glm5 (E=16)", glm, 6144, 2048, 2048, 0, 16},
                                   {"glm4.5-air shape (E=16)", preset_router("glm4.5-air", 16),
                                    4096, 1408, 1408, 0, 16},
                                   {"glm4.5-air router E=128", preset_router("glm4.5-air", 128),
                                    256, 128, 128, 0, 128},
                                   {"grouped sigmoid E=64", preset_router("deepseek-v3", 64), 256,
                                    128, 128, 0, 64},
                                   {"softmax E=40 top-6", soft, 256, 128, 128, 0, 40},
                                   {"softmax E=128 top-8", soft128, 256, 128, 128, 0, 128},
                                   {"softmax no shared", soft, 256, 128, 0, 0, 40},
                                   {"EP block 8+12 of 40", soft, 256, 128, 128, 8, 12}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    for (const std::string& backend : cuda_backends()) {
      SCOPED_TRACE(backend);
      // The real shape only on NVFP4 (random BF16 weights of that size take long to make).
      if (c.H > 1024 && format_of(backend) == ExpertFormat::BF16) continue;
      const HostMoeLayer L = layer_for(backend, c.router, c.H, c.I, c.Is, 51);
      const moe::MoeLayerWeights w = L.block_weights(c.begin, c.count, c.Is > 0);
      moe::validate_layer_weights(w);
      moe::MoeLayerOptions o;
      o.backend = "cpu";
      o.max_tokens = 99;
      o.w4a4 = is_w4a4(backend);
      auto cpu = moe::make_moe_layer(w, o);
      for (TokenLayout layout : {TokenLayout::Contiguous, TokenLayout::Masked}) {
        SCOPED_TRACE(layout == TokenLayout::Masked ? "masked" : "contiguous");
        // The real shape is slow to build and check on the CPU: the first four paths only
        // (default, no warm-up, no PDL for the token path and the combine, the token path
        // routing one token instead of GEMM1).
        const size_t n_paths = c.H > 1024 ? 4 : paths.size();
        std::vector<std::unique_ptr<moe::CudaMoeLayer>> gpus;
        for (size_t i = 0; i < n_paths; ++i)
          gpus.push_back(std::make_unique<moe::CudaMoeLayer>(w, 99, layout, paths[i].second,
                                                             is_w4a4(backend)));
        for (int T : {1, 2, 8, 9, 64, 65, 99}) {
          if (c.H > 1024 && T != 1 && T != 9 && T != 65) continue;  // the CPU reference is slow
          const std::vector<uint16_t> x = test::random_x(T, c.H, 60 + uint32_t(T));
          const std::vector<uint16_t> res = test::random_x(T, c.H, 61 + uint32_t(T));
          const uint16_t* residual = T % 2 ? res.data() : nullptr;
          std::vector<uint16_t> want(x.size());
          cpu->forward(x.data(), T, want.data(), residual, nullptr);
          const std::vector<int32_t> ids = cpu_ids(L, x, T);
          std::vector<std::vector<uint16_t>> outs;
          for (size_t i = 0; i < gpus.size(); ++i) {
            SCOPED_TRACE(paths[i].first + " T=" + std::to_string(T));
            GuardedBf16 dx(x.size()), dres(x.size()), dout(x.size());
            dx.upload(x);
            dres.upload(res);
            gpus[i]->forward(dx.ptr(), T, dout.ptr(), residual ? dres.ptr() : nullptr, nullptr);
            TETRA_CUDA_CHECK(cudaDeviceSynchronize());
            const std::vector<uint16_t> got = dout.body();
            const double e = test::nmse_bf16(got, want);
            EXPECT_LE(e, nmse_bound(backend));
            EXPECT_EQ(dout.guards_lost(), 0u);
            EXPECT_EQ(gpus[i]->dropped_pairs(), 0);
            EXPECT_EQ(gpus[i]->last_ids(T), ids);
            outs.push_back(got);
            std::printf("  path %-20s %-10s %-10s %-11s T=%-3d nmse %.3g%s\n", c.name.c_str(),
                        backend.c_str(), layout == TokenLayout::Masked ? "masked" : "contiguous",
                        paths[i].first.c_str(), T, e,
                        i > 0 && got == outs[0] ? " (bits of default)" : "");
          }
          EXPECT_EQ(outs[1], outs[0]) << "the L2 warm-up changed the result";
          // The GEMM pair's GEMM2 has 4-warp blocks: against the default with them (the small
          // shapes, where the default's GEMM2 may take 8-warp blocks), or the default itself (the
          // real shapes, whose GEMM2 grids are too large for that).
          const auto& same_gemm2 = outs.size() == paths.size() ? outs[7] : outs[0];
          EXPECT_EQ(outs[2], same_gemm2) << "the PDL launches or the GEMM pair changed the result";
          // The same kernels' code on the same routing: bit-equal (where it does not apply,
          // T > 1 or the masked layout, it is the default path), unless the routed GEMM1 takes
          // its wide shape (8 k-warps: another summation order; the same ids, checked above).
          const long g1_blocks = long(2 * c.I / 32) * (c.router.top_k + (c.Is > 0 ? 1 : 0));
          if (T != 1 || !moe_detail::late_grid_takes_wide_shape(g1_blocks, current_device_sm_count()))
            EXPECT_EQ(outs[3], outs[0]) << "GEMM1's routing differs from the token path's";
          if (outs.size() == paths.size()) EXPECT_EQ(outs[6], outs[4]) << "side stream vs serial";
        }
      }
    }
  }
}

// The one-launch layer (ops/moe/persistent_layer.h, T <= 8) against the separate launches
// (persistent_max_tokens = 0) on the same weights: the same bits (the same device code and
// summation orders), cpu to nmse_bound and route_cpu's ids, for every T in 1..8 on both layouts'
// buffers: a real shape, softmax routing with and without the shared expert, an EP block, all
// tokens on one expert. Three launches in a row give the same bits (the counters it leaves at zero
// are reused). A 320-expert router is over its limit: the layer falls back to the launches.
TEST_F(MoeLayerGpu, PersistentLayerEqualsLaunches) {
  moe::CudaTokenPath launches;
  launches.persistent_max_tokens = 0;
  // The persistent layer runs GEMM2 in 4-warp blocks; the launches take 3-warp blocks where only
  // they fit one wave (GLM-4.5-Air's shape at T = 1 on a 132-SM GPU), a different k split whose
  // sums round differently. The bits are compared against the launches with the same split.
  launches.gemm2_one_wave = false;
  moe::CudaTokenPath persistent;
  persistent.persistent_max_tokens = 8;
  RouterParams soft;
  soft.scoring = moe::Scoring::Softmax;
  soft.num_experts = 40;
  soft.top_k = 6;
  RouterParams eight;
  eight.num_experts = 8;
  eight.top_k = 4;
  RouterParams wide;
  wide.num_experts = 320;
  wide.top_k = 8;
  struct Case {
    std::string name;
    RouterParams router;
    int H, I, Is, begin, count;
    bool all_on_5;  // the bias sends every token to expert 5 first
  };
  const std::vector<Case> cases = {
      {"glm4.5-air (E=16)", preset_router("glm4.5-air", 16), 4096, 1408, 1408, 0, 16, false},
      {"softmax E=40 top-6", soft, 256, 128, 128, 0, 40, false},
      {"softmax no shared", soft, 256, 128, 0, 0, 40, false},
      {"EP block 8+12 of 40", soft, 256, 128, 128, 8, 12, false},
      {"all on expert 5, top-4", eight, 256, 192, 192, 0, 8, true},
      {"320 experts (falls back)", wide, 256, 128, 128, 0, 320, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    HostMoeLayer L = layer_for("cuda-w4a16", c.router, c.H, c.I, c.Is, 77);
    if (c.all_on_5) L.bias[5] = 100.0f;
    const moe::MoeLayerWeights w = L.block_weights(c.begin, c.count, c.Is > 0);
    moe::MoeLayerOptions o;
    o.backend = "cpu";
    o.max_tokens = 8;
    auto cpu = moe::make_moe_layer(w, o);
    const bool takes = c.router.num_experts <= 256;
    for (TokenLayout layout : {TokenLayout::Contiguous, TokenLayout::Masked}) {
      SCOPED_TRACE(layout == TokenLayout::Masked ? "masked" : "contiguous");
      moe::CudaMoeLayer one(w, 8, layout, persistent);
      moe::CudaMoeLayer many(w, 8, layout, launches);
      for (int T = 1; T <= 8; ++T) {
        SCOPED_TRACE("T=" + std::to_string(T));
        const std::vector<uint16_t> x = test::random_x(T, c.H, 300 + uint32_t(T));
        const std::vector<uint16_t> res = test::random_x(T, c.H, 400 + uint32_t(T));
        const uint16_t* residual = T % 2 ? res.data() : nullptr;
        std::vector<uint16_t> want(x.size());
        cpu->forward(x.data(), T, want.data(), residual, nullptr);
        const std::vector<int32_t> ids = cpu_ids(L, x, T);
        if (c.all_on_5)
          for (int t = 0; t < T; ++t) ASSERT_EQ(ids[size_t(t) * c.router.top_k], 5);
        GuardedBf16 dx(x.size()), dres(x.size()), d_one(x.size()), d_many(x.size());
        dx.upload(x);
        dres.upload(res);
        const uint16_t* dr = residual ? dres.ptr() : nullptr;
        many.forward(dx.ptr(), T, d_many.ptr(), dr, nullptr);
        std::vector<uint16_t> first;
        for (int rep = 0; rep < 3; ++rep) {
          one.forward(dx.ptr(), T, d_one.ptr(), dr, nullptr);
          TETRA_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_EQ(one.last_forward_persistent(), takes);
          if (rep == 0) first = d_one.body();
          else EXPECT_EQ(d_one.body(), first) << "launch " << rep;
        }
        EXPECT_FALSE(many.last_forward_persistent());
        EXPECT_EQ(first, d_many.body()) << "one launch vs separate launches";
        const double e = test::nmse_bf16(first, want);
        EXPECT_LE(e, nmse_bound("cuda-w4a16"));
        EXPECT_EQ(d_one.guards_lost(), 0u);
        EXPECT_EQ(one.dropped_pairs(), 0);
        EXPECT_EQ(one.last_ids(T), ids);
        std::printf("  persistent %-26s %-10s T=%d nmse %.3g%s\n", c.name.c_str(),
                    layout == TokenLayout::Masked ? "masked" : "contiguous", T, e,
                    first == d_many.body() ? " (bits of the launches)" : "");
      }
    }
  }
}

// forward is graph-capturable: a captured forward replayed on new input equals eager, for every
// shared-expert arrangement (T=1: the one-launch token path and the shared slot; T=19: the shared
// expert on the side stream, forked and joined inside the graph; and serially), and for the
// persistent one-launch layer at T=1 (three replays: its counters are back at zero each time).
TEST_F(MoeLayerGpu, CapturedGraphEqualsEager) {
  const ModelConfig c = preset_config("tiny-glm5");
  moe::CudaTokenPath serial;
  serial.shared_side_stream = false;
  moe::CudaTokenPath persistent;  // T = 1: one persistent launch (cuda-w4a16)
  persistent.persistent_max_tokens = 8;
  for (const std::string& backend : cuda_backends()) {
    const HostMoeLayer L = layer_for(backend, moe::router_params_of(c), 64, 64, 64, 13);
    for (const moe::CudaTokenPath& path : {moe::CudaTokenPath{}, serial, persistent}) {
      moe::CudaMoeLayer gpu(L.weights(), 32, TokenLayout::Masked, path, is_w4a4(backend));
      for (int T : {1, 19}) {
        SCOPED_TRACE(backend + " T=" + std::to_string(T) +
                     (path.persistent_max_tokens > 0 ? " persistent"
                      : path.shared_side_stream      ? " side stream"
                                                     : " serial"));
        GuardedBf16 dx(size_t(T) * 64), dout(size_t(T) * 64), dref(size_t(T) * 64);
        cudaStream_t s;
        TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        dx.upload(test::random_x(T, 64, 1));
        cudaGraph_t graph;
        TETRA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        gpu.forward(dx.ptr(), T, dout.ptr(), nullptr, s);
        TETRA_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
        cudaGraphExec_t exec;
        TETRA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        dx.upload(test::random_x(T, 64, 2));  // new input after capture
        for (int rep = 0; rep < 3; ++rep) TETRA_CUDA_CHECK(cudaGraphLaunch(exec, s));
        TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
        gpu.forward(dx.ptr(), T, dref.ptr(), nullptr, s);
        TETRA_CUDA_CHECK(cudaStreamSynchronize(s));
        EXPECT_EQ(dout.body(), dref.body());
        EXPECT_EQ(gpu.dropped_pairs(), 0);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(s);
      }
    }
  }
}

// How many elements of got differ from want, each expected within one bf16 step of it (a norm's
// sum of squares summed in another order).
size_t differ_within_one_bf16_step(const std::vector<uint16_t>& got,
                                   const std::vector<uint16_t>& want) {
  EXPECT_EQ(got.size(), want.size());
  size_t differ = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] == want[i]) continue;
    ++differ;
    const float a = bf16_to_float(got[i]), b = bf16_to_float(want[i]);
    EXPECT_LE(std::fabs(a - b), std::ldexp(std::fabs(b), -7)) << "element " << i;
  }
  return differ;
}

// forward_add_rms_norm (the decoder's add + RMSNorm in the combine's launch) against forward then
// the separate fused_add_rms_norm kernel: out and the residual bit-identical, normed within one
// bf16 step (its sum of squares runs in another order), written over the layer's own input as
// the model does; the persistent layer declines it and writes nothing. With the norm folded into
// the next linear (NormFold): out and residual the same bits, gx = bf16(residual * g) exactly,
// the sums' inv_rms within 1e-5 of the double reference; a fold of another part count declined.
TEST_F(MoeLayerGpu, ForwardAddRmsNormEqualsForwardThenNorm) {
  const ModelConfig c = preset_config("tiny-glm5");
  moe::CudaTokenPath serial;
  serial.shared_side_stream = false;
  moe::CudaTokenPath persistent;
  persistent.persistent_max_tokens = 8;
  const int H = 64;
  const float eps = 1e-5f;
  std::vector<uint16_t> gain(H);
  for (int i = 0; i < H; ++i) gain[size_t(i)] = float_to_bf16(0.5f + 0.03f * float(i));
  GuardedBf16 dgain(H);
  dgain.upload(gain);
  for (const std::string& backend : cuda_backends()) {
    const HostMoeLayer L = layer_for(backend, moe::router_params_of(c), 64, 64, 64, 17);
    for (const moe::CudaTokenPath& path : {moe::CudaTokenPath{}, serial, persistent}) {
      moe::CudaMoeLayer gpu(L.weights(), 32, TokenLayout::Masked, path, is_w4a4(backend));
      for (int T : {1, 19}) {
        const bool declines = path.persistent_max_tokens >= T && backend == "cuda-w4a16";
        SCOPED_TRACE(backend + " T=" + std::to_string(T) + (declines ? " persistent" : ""));
        const size_t n = size_t(T) * H;
        const std::vector<uint16_t> x = test::random_x(T, H, 3), res = test::random_x(T, H, 4);
        GuardedBf16 dx(n), dout(n), dres(n), dnorm(n), dx2(n), dout2(n), dres2(n);
        dx.upload(x), dres.upload(res), dx2.upload(x), dres2.upload(res);
        gpu.forward(dx.ptr(), T, dout.ptr(), nullptr, nullptr);
        TETRA_CUDA_CHECK(ops::cuda::fused_add_rms_norm(dout.ptr(), dres.ptr(), dgain.ptr(), T, H,
                                                       eps, dnorm.ptr(), nullptr));
        const moe::AddRmsNormStep step{dres2.ptr(), dgain.ptr(), eps, dx2.ptr()};
        const bool ran = gpu.forward_add_rms_norm(dx2.ptr(), T, dout2.ptr(), step, nullptr);
        TETRA_CUDA_CHECK(cudaDeviceSynchronize());
        if (declines) {
          EXPECT_FALSE(ran);
          EXPECT_EQ(dx2.body(), x);  // nothing ran
          EXPECT_EQ(dres2.body(), res);
          continue;
        }
        ASSERT_TRUE(ran);
        EXPECT_EQ(dout2.body(), dout.body());
        EXPECT_EQ(dres2.body(), dres.body());
        EXPECT_LE(differ_within_one_bf16_step(dx2.body(), dnorm.body()), n / 20);
        EXPECT_EQ(dx2.guards_lost() + dout2.guards_lost() + dres2.guards_lost(), 0u);
        // Folded (NormFold): the same out and residual, gx = bf16(residual * g) exactly, and the
        // sums give the row's inv_rms.
        GuardedBf16 dx3(n), dout3(n), dres3(n);
        dx3.upload(x), dres3.upload(res);
        const int parts = gpu.norm_fold_parts();
        EXPECT_EQ(parts, moe::cuda::combine_norm_fold_parts(H));
        test::GuardedDeviceArray<float> dsums(size_t(T) * parts);
        const moe::NormFold fold{dsums.ptr(), parts, H, eps};
        const moe::AddRmsNormStep folded{dres3.ptr(), dgain.ptr(), eps, dx3.ptr(), &fold};
        ASSERT_TRUE(gpu.forward_add_rms_norm(dx3.ptr(), T, dout3.ptr(), folded, nullptr));
        TETRA_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(dout3.body(), dout.body());
        const std::vector<uint16_t> h = dres.body(), gx = dx3.body();
        EXPECT_EQ(dres3.body(), h);
        const std::vector<float> sums = dsums.download();
        for (int t = 0; t < T; ++t) {
          double ss = 0;
          for (int i = 0; i < H; ++i) {
            const size_t e = size_t(t) * H + i;
            const float v = bf16_to_float(h[e]);
            ss += double(v) * v;
            EXPECT_EQ(gx[e], float_to_bf16(v * bf16_to_float(gain[size_t(i)]))) << "t=" << t << " i=" << i;
          }
          const double inv = 1.0 / std::sqrt(ss / H + eps);
          EXPECT_NEAR(moe::norm_fold_inv_rms(&sums[size_t(t) * parts], parts, H, eps), inv, 1e-5 * inv);
        }
        EXPECT_EQ(dx3.guards_lost() + dout3.guards_lost() + dres3.guards_lost(), 0u);
        EXPECT_TRUE(dsums.guards_intact());
        // A fold of another part count is declined, nothing written.
        const moe::NormFold other{dsums.ptr(), parts + 1, H, eps};
        const moe::AddRmsNormStep refused{dres3.ptr(), dgain.ptr(), eps, dx3.ptr(), &other};
        EXPECT_FALSE(gpu.forward_add_rms_norm(dx3.ptr(), T, dout3.ptr(), refused, nullptr));
      }
    }
  }
}

// A norm weight [H] bf16 that ramps over a period: base + step * (i % period).
std::vector<uint16_t> ramp_gain(int H, float base, float step, int period) {
  std::vector<uint16_t> g(static_cast<size_t>(H));
  for (int i = 0; i < H; ++i) g[size_t(i)] = float_to_bf16(base + step * float(i % period));
  return g;
}

// The post-attention norm folded into the layer (PreRmsNormStep: x is the un-normalised row, the
// one-launch token path normalises it) against the RMSNorm kernel then forward_add_rms_norm on
// its output: the normalised row within one bf16 step (another summation order) and the same as
// its own reference bit for bit wherever the rows agree; where every normalised element agrees,
// out, residual and the next norm bit-identical. takes_pre_norm is false (and nothing runs) at
// more than one token and with the persistent layer.
TEST_F(MoeLayerGpu, FoldedPreNormEqualsNormThenForward) {
  const float eps = 1e-5f;
  moe::CudaTokenPath persistent;
  persistent.persistent_max_tokens = 8;
  struct Shape { std::string name; RouterParams router; int H, I, Ish; };
  const ModelConfig c = preset_config("tiny-glm5");
  const Shape shapes[] = {{"tiny-glm5", moe::router_params_of(c), 64, 64, 64},
                          {"glm4.5-air (E=16)", preset_router("glm4.5-air", 16), 4096, 1408, 1408}};
  for (const Shape& sh : shapes) {
    const int H = sh.H;
    GuardedBf16 dgain(H), dgain2(H);
    dgain.upload(ramp_gain(H, 0.5f, 0.03f, 50)), dgain2.upload(ramp_gain(H, 1.5f, -0.01f, 70));
    for (const std::string& backend : cuda_backends()) {
      const HostMoeLayer L = layer_for(backend, sh.router, H, sh.I, sh.Ish, 23);
      for (const TokenLayout layout : {TokenLayout::Contiguous, TokenLayout::Masked})
        for (const moe::CudaTokenPath& path : {moe::CudaTokenPath{}, persistent}) {
          moe::CudaMoeLayer gpu(L.weights(), 32, layout, path, is_w4a4(backend));
          for (int T : {1, 3}) {
            // (the persistent layer runs W4A16 only: the other backends keep the launches)
            const bool takes = T == 1 && !(path.persistent_max_tokens >= T && backend == "cuda-w4a16");
            SCOPED_TRACE(sh.name + " " + backend + " T=" + std::to_string(T) +
                         (layout == TokenLayout::Masked ? " masked" : " contiguous") +
                         (path.persistent_max_tokens > 0 ? " persistent" : ""));
            EXPECT_EQ(gpu.takes_pre_norm(T), takes);
            const size_t n = size_t(T) * H;
            const std::vector<uint16_t> h = test::random_x(T, H, 5), res = test::random_x(T, H, 6);
            // Reference: the RMSNorm kernel, then the layer with the add + RMSNorm after it.
            GuardedBf16 dh(n), dnorm(n), dout(n), dres(n), dnext(n);
            dh.upload(h), dres.upload(res);
            TETRA_CUDA_CHECK(ops::cuda::rms_norm(dh.ptr(), dgain.ptr(), T, H, eps, dnorm.ptr(), nullptr));
            const moe::AddRmsNormStep step{dres.ptr(), dgain2.ptr(), eps, dnext.ptr()};
            const bool ran_ref = gpu.forward_add_rms_norm(dnorm.ptr(), T, dout.ptr(), step, nullptr);
            // Folded: h in, the normalised row out.
            GuardedBf16 dh2(n), dnorm2(n), dout2(n), dres2(n), dnext2(n);
            dh2.upload(h), dres2.upload(res);
            const moe::AddRmsNormStep step2{dres2.ptr(), dgain2.ptr(), eps, dnext2.ptr()};
            const moe::PreRmsNormStep pre{dgain.ptr(), eps, dnorm2.ptr()};
            const bool ran = gpu.forward_add_rms_norm(dh2.ptr(), T, dout2.ptr(), step2, nullptr, &pre);
            TETRA_CUDA_CHECK(cudaDeviceSynchronize());
            if (!takes) {
              EXPECT_FALSE(ran);
              EXPECT_EQ(dres2.body(), res);  // nothing ran
              EXPECT_EQ(dh2.body(), h);
              continue;
            }
            ASSERT_TRUE(ran_ref);
            ASSERT_TRUE(ran);
            const size_t differ = differ_within_one_bf16_step(dnorm2.body(), dnorm.body());
            EXPECT_LE(differ, n / 20);
            EXPECT_EQ(dh2.body(), h);  // x is read only
            if (differ == 0) {
              EXPECT_EQ(dout2.body(), dout.body());
              EXPECT_EQ(dres2.body(), dres.body());
              EXPECT_EQ(dnext2.body(), dnext.body());
            }
            EXPECT_EQ(dh2.guards_lost() + dnorm2.guards_lost() + dout2.guards_lost() +
                          dres2.guards_lost() + dnext2.guards_lost(), 0u);
          }
        }
    }
  }
}

// The router folded into o_proj (moe/router_fold.h): the sums and gx as o_proj's epilogue leaves
// them (the host twin over h, tested against the kernel in test_linear_cuda) against the folded
// pre-norm path on the same h. The logits differ only by where the bf16 rounding of the
// normalised row falls, so the same experts (random router, no near ties at E = 16) and outputs
// within bf16 noise (relative L2 <= 1e-2; a missing or doubled 1/rms gives order 1); the sums
// are zero again afterwards (the combine clears them for the next step). Not taken before
// prepare_router_fold, at 3 tokens, or with softmax scoring.
TEST_F(MoeLayerGpu, RouterFoldEqualsFoldedPreNorm) {
  const float eps = 1e-5f;
  struct Shape { std::string name; RouterParams router; int H, I, Ish; };
  const ModelConfig c = preset_config("tiny-glm5");
  const Shape shapes[] = {{"tiny-glm5", moe::router_params_of(c), 64, 64, 64},
                          {"glm4.5-air (E=16)", preset_router("glm4.5-air", 16), 4096, 1408, 1408},
                          {"qwen3 (softmax)", preset_router("qwen3-30b-a3b", 16), 256, 64, 0}};
  auto rel_l2 = [](const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    double e = 0, r = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = double(bf16_to_float(a[i])) - bf16_to_float(b[i]);
      e += d * d;
      r += double(bf16_to_float(b[i])) * bf16_to_float(b[i]);
    }
    return std::sqrt(e / std::max(r, 1e-30));
  };
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(sh.name);
    const int H = sh.H, E = sh.router.num_experts;
    const std::vector<uint16_t> gain = ramp_gain(H, 0.5f, 0.03f, 50);
    GuardedBf16 dgain(H), dgain2(H);
    dgain.upload(gain), dgain2.upload(ramp_gain(H, 1.5f, -0.01f, 70));
    const HostMoeLayer L = layer_for("cuda-w4a16", sh.router, H, sh.I, sh.Ish, 23);
    moe::CudaMoeLayer gpu(L.weights(), 32, TokenLayout::Contiguous);
    EXPECT_EQ(gpu.router_fold(1), nullptr);  // not prepared
    gpu.prepare_router_fold(dgain.ptr());
    const moe::RouterFold* f = gpu.router_fold(1);
    if (sh.router.scoring == moe::Scoring::Softmax) {
      EXPECT_EQ(f, nullptr);
      continue;
    }
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(gpu.router_fold(3), nullptr);
    ASSERT_EQ(f->E, E);
    const size_t n = size_t(H);
    const std::vector<uint16_t> h = test::random_x(1, H, 5), res = test::random_x(1, H, 6);
    // Reference: the folded pre-norm (the token path normalises h).
    GuardedBf16 dh(n), dnorm(n), dout(n), dres(n), dnext(n);
    dh.upload(h), dres.upload(res);
    const moe::AddRmsNormStep step{dres.ptr(), dgain2.ptr(), eps, dnext.ptr()};
    const moe::PreRmsNormStep pre{dgain.ptr(), eps, dnorm.ptr()};
    ASSERT_TRUE(gpu.forward_add_rms_norm(dh.ptr(), 1, dout.ptr(), step, nullptr, &pre));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> ids_ref = gpu.last_ids(1);
    // The fold: what o_proj's epilogue would have left.
    const std::vector<uint8_t> tiles = moe::router_fold_tiles(L.gate.data(), gain.data(), E, H);
    std::vector<double> sums;
    std::vector<uint16_t> gx;
    moe::router_fold_sums(tiles, h.data(), E, H, sums, gx);
    TETRA_CUDA_CHECK(cudaMemcpy(f->sums, sums.data(), sums.size() * 8, cudaMemcpyHostToDevice));
    GuardedBf16 dh2(n), dgx(n), dout2(n), dres2(n), dnext2(n);
    dh2.upload(h), dres2.upload(res), dgx.upload(gx);
    const moe::AddRmsNormStep step2{dres2.ptr(), dgain2.ptr(), eps, dnext2.ptr()};
    const moe::PreRmsNormStep pre2{dgain.ptr(), eps, dgx.ptr(), true};
    ASSERT_TRUE(gpu.forward_add_rms_norm(dh2.ptr(), 1, dout2.ptr(), step2, nullptr, &pre2));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<int32_t> ids = gpu.last_ids(1);
    std::sort(ids.begin(), ids.end());
    std::sort(ids_ref.begin(), ids_ref.end());
    EXPECT_EQ(ids, ids_ref);
    EXPECT_LE(rel_l2(dout2.body(), dout.body()), 1e-2);
    EXPECT_LE(rel_l2(dres2.body(), dres.body()), 1e-2);
    EXPECT_LE(rel_l2(dnext2.body(), dnext.body()), 1e-2);
    EXPECT_EQ(dh2.body(), h);  // read only
    std::vector<double> after(size_t(f->copies) * sums.size(), 1.0);
    TETRA_CUDA_CHECK(cudaMemcpy(after.data(), f->sums, after.size() * 8, cudaMemcpyDeviceToHost));
    EXPECT_EQ(after, std::vector<double>(after.size(), 0.0));
    EXPECT_EQ(dh2.guards_lost() + dgx.guards_lost() + dout2.guards_lost() + dres2.guards_lost() +
                  dnext2.guards_lost(), 0u);
  }
}

// ---- cuda-w4a4 against its cpu twin (the cpu backend with W4A4 numerics) ------------------------
// run_layer_case / all_tokens_on_one_expert above cover every built backend, cuda-w4a4 included;
// these name it alone so that one device call can run exactly the W4A4 cases.
const std::vector<std::string> kW4a4 = {"cuda-w4a4"};

TEST_F(MoeLayerGpu, W4a4TinyGlm5EveryTokenCount) {
  const ModelConfig c = preset_config("tiny-glm5");
  run_layer_case({"tiny-glm5", moe::router_params_of(c), int(c.hidden_size),
                  int(c.moe_intermediate_size), int(c.n_shared_experts * c.moe_intermediate_size),
                  {1, 3, 19, 99, 989}, 1},
                 kW4a4);
}
TEST_F(MoeLayerGpu, W4a4Glm5Shape) {
  run_layer_case({"glm5 (E=16)", preset_router("glm5", 16), 6144, 2048, 2048, {1, 3, 19}, 2}, kW4a4);
}
TEST_F(MoeLayerGpu, W4a4Qwen3ShapeNoShared) {
  run_layer_case({"qwen3-30b-a3b (E=32)", preset_router("qwen3-30b-a3b", 32), 2048, 768, 0,
                  {1, 3, 19, 99, 989}, 6},
                 kW4a4);
}
TEST_F(MoeLayerGpu, W4a4AllTokensOnOneExpert) { all_tokens_on_one_expert(kW4a4); }
TEST_F(MoeLayerGpu, W4a4MostExpertsEmpty) {
  RouterParams rp;
  rp.num_experts = 256;
  rp.top_k = 2;
  rp.scoring = moe::Scoring::Softmax;
  run_layer_case({"E=256 top-2", rp, 128, 64, 64, {1, 2, 3}, 12}, kW4a4);
}

// W4A4 routed experts, the shared expert without input scales (W4A16 on its own launches, never
// the routed slot), and a shared expert of another width; both layouts, T across the slot limit.
TEST_F(MoeLayerGpu, W4a4SharedExpertVariants) {
  const RouterParams rp = moe::router_params_of(preset_config("tiny-glm5"));
  struct Variant {
    const char* name;
    int Is;
    bool shared_scales;
  };
  for (const Variant& v : {Variant{"shared W4A16", 128, false}, Variant{"shared W4A4 Is=192", 192, true}}) {
    SCOPED_TRACE(v.name);
    HostMoeLayer L = test::random_layer(rp, 256, 128, v.Is, 71, true, ExpertFormat::NVFP4);
    test::add_input_scales(L, 72, v.shared_scales);
    auto cpu = runner(L, "cpu", 40, TokenLayout::Contiguous);
    for (TokenLayout layout : {TokenLayout::Contiguous, TokenLayout::Masked}) {
      auto gpu = runner(L, "cuda-w4a4", 40, layout);
      EXPECT_EQ(gpu->backend(), "cuda-w4a4");
      for (int T : {1, 5, 40}) {
        const std::vector<uint16_t> x = test::random_x(T, 256, 73 + uint32_t(T));
        std::vector<uint16_t> want(x.size());
        cpu->forward(x.data(), T, want.data(), nullptr, nullptr);
        GuardedBf16 dx(x.size()), dout(x.size());
        dx.upload(x);
        gpu->forward(dx.ptr(), T, dout.ptr(), nullptr, nullptr);
        TETRA_CUDA_CHECK(cudaDeviceSynchronize());
        const double e = test::nmse_bf16(dout.body(), want);
        EXPECT_LE(e, nmse_bound("cuda-w4a4")) << "T=" << T;
        EXPECT_EQ(dout.guards_lost(), 0u);
        std::printf("  w4a4 %-20s %-10s T=%-3d nmse %.3g\n", v.name,
                    layout == TokenLayout::Masked ? "masked" : "contiguous", T, e);
      }
    }
  }
}

// The W4A4 result is not the W4A16 one: the activation quantization really runs on the GPU.
TEST_F(MoeLayerGpu, W4a4DiffersFromW4a16) {
  const RouterParams rp = moe::router_params_of(preset_config("tiny-glm5"));
  HostMoeLayer L = layer_for("cuda-w4a4", rp, 256, 128, 128, 81);
  const int T = 19;
  const std::vector<uint16_t> x = test::random_x(T, 256, 82);
  GuardedBf16 dx(x.size()), d4(x.size()), d16(x.size());
  dx.upload(x);
  runner(L, "cuda-w4a4", T, TokenLayout::Contiguous)->forward(dx.ptr(), T, d4.ptr(), nullptr, nullptr);
  runner(L, "cuda-w4a16", T, TokenLayout::Contiguous)->forward(dx.ptr(), T, d16.ptr(), nullptr, nullptr);
  TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  const double moved = test::nmse_bf16(d4.body(), d16.body());
  std::printf("  w4a4 vs w4a16 nmse %.3g\n", moved);
  EXPECT_GT(moved, 1e-5);
  EXPECT_LT(moved, 0.1);
}

}  // namespace
}  // namespace tetra
