// Experiment (session 32): the batch-1 NVFP4 GEMV with the block scales applied after the MMA.
//
// Why: session 31 measured the one-row q/k/v GEMV at ~88 warp instructions per 1024 weights, 48
// of them the dequantize (8 integer ops and 4 bf16 multiplies by the block scale per 8 weights).
// At one row the MMA's 8 columns are 8 copies of the same token, so they can carry the scales
// instead: the production fragment order gives lane q of a quad NVFP4 block q of each chunk, so
// if B column 2q holds x on block q only (zeros elsewhere), D[row][2q] is block q's partial dot
// product and each lane applies its own two scales (rows g, g+8) after the chunk's four MMAs:
// 2 FFMA per lane and chunk instead of 16 HMUL2. The weights are the production packing, decoded
// without the multiply (E2M1 value * 2^-126 as bf16), so x enters as x * 2^E (scale_x: E = 120
// minus the exponent of max |x|, exact) to keep the products normal floats.
// Variants: register slots per warp (S), blocks per SM (B), each warp asking the L2 for its k
// range of the tile P tiles ahead (cp.async.bulk.prefetch.L2), x unscaled (E = 0), and a control
// running the production math (scales multiplied into the weights) in the same loop.
// `*Matches*` checks every variant against a CPU double-precision reference next to the
// production kernel; `*Timing*` (TETRA_BENCH_FULL=1) times them as CUDA graphs of 32 launches
// over 4 weight copies (TETRA_PARTS_COPIES=1: one, L2-resident). Not used by the model: the
// figures and what they showed are in bench/results/2026-12-02-session32-h200.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "core/kernel_launch.h"
#include "format/nvfp4.h"
#include "graph_timing.h"
#include "nvfp4_gemv_bench_data.h"
#include "moe/expert_weights.h"
#include "ops/linear/linear_cuda.h"
#include "ops/moe/w4a16_fragment.cuh"

namespace tetra {
namespace {

namespace oc = ops::cuda;
using namespace gemv_bench;
constexpr int kWarps = 8;
// ---- the kernels ----
struct ColGemvArgs {
  const uint8_t* w;    // [n/16][k/64][32][16] fragment words (production bf16 code)
  const uint8_t* s;    // [n/16][k/64][32][2] ue5m3 (row g, row g+8) of block lane % 4
  const float* alpha;  // [1] weight_scale_2 * 2^10
  const uint16_t* x;   // [k] bf16 (the control variant's input)
  const uint16_t* xs;  // [k] bf16 x * 2^E (scale_x below)
  const int* e;        // [1] E
  const uint16_t* zeros;  // [k] zeros: the B values of lanes that feed no block
  uint16_t* y;         // [n] bf16
  int n, k;
};

// xs = x * 2^E, E = 120 - (exponent of max |x|): exact (a power of two), no overflow, and the
// products with the decoded weights (E2M1 value * 2^-126) stay normal floats. One block. In a
// model the kernel that writes x (RMSNorm, the attention) would write this instead.
__global__ void scale_x(const uint16_t* x, int k, uint16_t* xs, int* e) {
  __shared__ float warp_max[32];
  float amax = 0.0f;
  for (int i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(__bfloat162float(__ushort_as_bfloat16(x[i]))));
  for (int o = 16; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int w = 0; w < int(blockDim.x / 32); ++w) amax = fmaxf(amax, warp_max[w]);
  // Zero, Inf or NaN keep E = 0 (Inf and NaN then reach y, as in the production kernel).
  const int E = amax > 0.0f && amax < INFINITY ? 120 - (int((__float_as_uint(amax) >> 23) & 255u) - 127) : 0;
  if (threadIdx.x == 0) *e = E;
  const float f = exp2f(float(E));  // exact: E in [-7, 246]; the product is rounded once
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const __nv_bfloat16 v = __float2bfloat16_rn(__bfloat162float(__ushort_as_bfloat16(x[i])) * f);
    xs[i] = *reinterpret_cast<const uint16_t*>(&v);
  }
}

// One 64-k chunk of a 16-row tile with the block scales applied after the MMAs. B column 2q
// holds x on block q only, so D[row][2q] (c0 / c2 of lane q) is block q's partial dot product
// of row g / g+8, scaled by the lane's own scale pair. w: the lane's 16 bytes (decoded without
// the scale multiply: E2M1 value * 2^-126 as bf16); xb: the lane's B values (x * 2^E on block q
// for the 4 feeding lanes, zeros otherwise); sc: (s(g), s(g+8)) ue5m3; c: exponent base.
__device__ __forceinline__ void col_chunk(float& acc_g, float& acc_g8, const uint4& w, uint32_t sc,
                                          const uint4 (&xb)[2], uint32_t c) {
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t A[4];
    fragment_word_decode(moe_detail::word_of(w, j), A);
    const uint4& xh = xb[j >> 1];
    moe_detail::mma_bf16_16816(d, A, (j & 1) ? xh.z : xh.x, (j & 1) ? xh.w : xh.y);
  }
  acc_g = fmaf(d[0], __uint_as_float(__byte_perm(sc, 0u, 0x4440u) * (1u << 20) + c), acc_g);
  acc_g8 = fmaf(d[2], __uint_as_float(__byte_perm(sc, 0u, 0x4441u) * (1u << 20) + c), acc_g8);
}

// Rolling grid as nvfp4_gemv_rolling_kernel: block b takes tiles b, b + grid, ...; each warp a
// fixed k range of cpw chunks; S register slots per warp reloaded as they are consumed.
// kControl: the production math instead (scale multiplied into every weight, every lane reading
// x), so the A/B separates the block-column math from the loop shape and the prefetch.
// P > 0: lane 0 of each warp asks the copy engine to pull its k range of the tile P tiles ahead
// (in the block's order) into the L2 (cp.async.bulk.prefetch.L2: no registers).
// kUnscaled: x as given (E = 0): the products value * 2^-126 * x then fall to or below the fp32
// normal range for |x| below ~2; measured on the H200, the results match the production kernel's
// (the same NMSE on every case), so the MMA keeps those small values.
template <int S, int kBlocksPerSm, int P, bool kControl, bool kUnscaled = false>
__global__ void __launch_bounds__(kWarps * 32, kBlocksPerSm) col_gemv_rolling(const ColGemvArgs a, int tiles) {
  __shared__ float red[2][kWarps][16];
  asm volatile("griddepcontrol.launch_dependents;");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int chunks = a.k / 64, cpw = chunks / kWarps, nb = cpw / S;
  auto tile_ptrs = [&](int u, const uint8_t*& wp, const uint8_t*& sp) {
    const size_t c0 = size_t(u) * chunks + size_t(warp) * cpw;
    wp = a.w + c0 * 512 + lane * 16;
    sp = a.s + c0 * 64 + lane * 2;
  };
  auto prefetch_tile = [&](int t) {
    if (P > 0 && lane == 0 && t < tiles) {
      const size_t c0 = size_t(t) * chunks + size_t(warp) * cpw;
      moe_detail::prefetch_l2_bulk(a.w + c0 * 512, uint32_t(cpw * 512));
      moe_detail::prefetch_l2_bulk(a.s + c0 * 64, uint32_t(cpw * 64));
    }
  };
  uint4 wv[S];
  uint32_t sv[S];
  int u = blockIdx.x, b = 0;
  const uint8_t *wp, *sp;
  tile_ptrs(u, wp, sp);
  for (int t = 1; t <= P; ++t) prefetch_tile(u + t * int(gridDim.x));
#pragma unroll
  for (int s = 0; s < S; ++s) {
    wv[s] = moe_detail::ld_stream_u4(wp + size_t(s) * 512);
    sv[s] = moe_detail::ld_stream_u16(sp + size_t(s) * 64);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const uint32_t cexp = uint32_t(233 - (kUnscaled ? 0 : *a.e)) << 23;
  // Lane (g, q) feeds B column g at the k of block q: x for g = 2q, zeros otherwise.
  const bool feeds = g == 2 * q;
  const uint16_t* xsrc = kControl ? a.x : feeds ? (kUnscaled ? a.x : a.xs) : a.zeros;
  const uint4* xl = reinterpret_cast<const uint4*>(xsrc + size_t(warp) * cpw * 64 + 16 * q);
  float acc_g = 0.0f, acc_g8 = 0.0f;
  float acc4[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // kControl: the production MMA accumulators
  int buf = 0;
  while (u < tiles) {
    int nu = u, nbi = b + 1;
    const uint8_t *nwp = wp, *nsp = sp;
    if (nbi == nb) {
      nu += gridDim.x, nbi = 0;
      if (nu < tiles) tile_ptrs(nu, nwp, nsp);
      prefetch_tile(nu + P * int(gridDim.x));
    }
    const bool more = nu < tiles;
    const size_t nc = size_t(nbi) * S;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const uint4* xc = xl + (b * S + s) * 8;
      const uint4 xb[2] = {moe_detail::ld_cached_u4(xc), moe_detail::ld_cached_u4(xc + 1)};
      if constexpr (kControl) {
        uint32_t sg, sg8;
        moe_detail::scale_pair_to_bf16x2(sv[s], sg, sg8);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t A[4];
          moe_detail::dequant_word(moe_detail::word_of(wv[s], j), sg, sg8, A);
          const uint4& xh = xb[j >> 1];
          moe_detail::mma_bf16_16816(acc4, A, (j & 1) ? xh.z : xh.x, (j & 1) ? xh.w : xh.y);
        }
      } else {
        col_chunk(acc_g, acc_g8, wv[s], sv[s], xb, cexp);
      }
      if (more) {
        wv[s] = moe_detail::ld_stream_u4(nwp + (nc + s) * 512);
        sv[s] = moe_detail::ld_stream_u16(nsp + (nc + s) * 64);
      }
    }
    if (nbi == 0) {
      if constexpr (kControl) acc_g = acc4[0], acc_g8 = acc4[2], acc4[0] = acc4[1] = acc4[2] = acc4[3] = 0.0f;
      // Sum the quad's four blocks (lanes q = 0..3 of row g and g+8). In the control, lane q = 0
      // already holds token 0's sums (acc4[0], acc4[2]) and the other lanes other columns.
      if (!kControl) acc_g += __shfl_xor_sync(0xffffffffu, acc_g, 1);
      if (!kControl) acc_g8 += __shfl_xor_sync(0xffffffffu, acc_g8, 1);
      if (!kControl) acc_g += __shfl_xor_sync(0xffffffffu, acc_g, 2);
      if (!kControl) acc_g8 += __shfl_xor_sync(0xffffffffu, acc_g8, 2);
      if (q == 0) red[buf][warp][g] = acc_g, red[buf][warp][g + 8] = acc_g8;
      acc_g = acc_g8 = 0.0f;
      __syncthreads();
      if (threadIdx.x < 16) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) sum += red[buf][w][threadIdx.x];
        a.y[size_t(u) * 16 + threadIdx.x] = moe_detail::f32_to_bf16_bits(sum * a.alpha[0]);
      }
      buf ^= 1;
    }
    u = nu, b = nbi, wp = nwp, sp = nsp;
  }
}

template <int S, int B, int P = 0, bool kControl = false, bool kUnscaled = false>
cudaError_t launch_col(const ColGemvArgs& a, cudaStream_t stream) {
  const int tiles = a.n / 16;
  const int grid = std::min(tiles, B * current_device_sm_count());
  const KernelLaunch launch(dim3(unsigned(grid)), dim3(kWarps * 32), stream);
  return launch(col_gemv_rolling<S, B, P, kControl, kUnscaled>, a, tiles);
}

using LaunchFn = cudaError_t (*)(const ColGemvArgs&, cudaStream_t);
struct Shape {
  const char* name;
  LaunchFn fn;
  int slots;  // S: a warp's chunks must be a whole number of S-chunk batches
};
const Shape kShapes[] = {
    {"S4 B4", launch_col<4, 4>, 4},
    {"S2 B4", launch_col<2, 4>, 2},
    {"S2 B4 prefetch 1", launch_col<2, 4, 1>, 2},
    {"S4 B4 prefetch 1", launch_col<4, 4, 1>, 4},
    {"S4 B4 prefetch 2", launch_col<4, 4, 2>, 4},
    {"control (production math) S4 B4", launch_col<4, 4, 0, true>, 4},
    {"control (production math) S4 B4 prefetch 1", launch_col<4, 4, 1, true>, 4},
    {"control (production math) S4 B4 prefetch 2", launch_col<4, 4, 2, true>, 4},
    {"control (production math) S2 B4 prefetch 1", launch_col<2, 4, 1, true>, 2},
    {"unscaled x S2 B4 prefetch 1", launch_col<2, 4, 1, false, true>, 2},
    {"unscaled x S4 B4 prefetch 1", launch_col<4, 4, 1, false, true>, 4}};

// ---- host data ----

// x on the device: as given (the production kernel) and scaled (scale_x, the column kernel).
struct DevX {
  explicit DevX(const std::vector<uint16_t>& host)
      : x(host.size() * 2), xs(host.size() * 2), e(sizeof(int)), zeros(host.size() * 2), k(int(host.size())) {
    TETRA_CUDA_CHECK(cudaMemcpy(x.p, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    TETRA_CUDA_CHECK(cudaMemset(zeros.p, 0, host.size() * 2));
    prepare(nullptr);
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void prepare(cudaStream_t s) {
    scale_x<<<1, 1024, 0, s>>>(x.as<uint16_t>(), k, xs.as<uint16_t>(), e.as<int>());
    TETRA_CUDA_CHECK(cudaGetLastError());
  }
  test::DeviceScratch x, xs, e, zeros;
  int k;
};

// The column kernel's arguments over the production packing (both kernels read the same bytes).
ColGemvArgs col_args(const oc::Nvfp4LinearBuffer& w, const DevX& x, uint16_t* y) {
  const auto& v = w.view();
  return {v.w, v.s, v.alpha, x.x.as<uint16_t>(), x.xs.as<uint16_t>(), x.e.as<int>(),
          x.zeros.as<uint16_t>(), y, v.n, v.k};
}



TEST(BenchGemvBlockColumns, MatchesReferenceAndBf16Kernel) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    int n, k;
    float outlier;
  };
  // q/k/v fused and o_proj of GLM-4.5-Air, a small one (k = 512: one chunk per warp), and x
  // with outliers (values 1000x and 30000x the rest).
  const Case cases[] = {{14336, 4096, 0.0f}, {4096, 12288, 0.0f}, {32, 512, 0.0f}, {4096, 4096, 1000.0f},
                        {32, 2048, 3.0e4f}};
  for (const Case& cs : cases) {
    const HostMatrix m = random_matrix(cs.n, cs.k, 11 + cs.n + cs.k);
    const auto d = upload(m);
    const auto x = random_x(cs.k, 5 + cs.k, cs.outlier);
    const auto want = reference(m, x);
    DevX dx(x);
    test::DeviceScratch dy(size_t(cs.n) * 2);
    std::vector<uint16_t> y(cs.n);
    // The production kernel (Auto), as the yardstick.
    const oc::Nvfp4GemvOutput out{&d.view(), nullptr, dy.as<uint16_t>()};
    TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(&out, 1, dx.x.as<uint16_t>(), 1, nullptr));
    TETRA_CUDA_CHECK(cudaMemcpy(y.data(), dy.p, y.size() * 2, cudaMemcpyDeviceToHost));
    const Errors eb = compare(y, want);
    const int cpw = cs.k / 64 / kWarps;
    for (const Shape& sh : kShapes) {
      if (cpw % sh.slots != 0) continue;
      TETRA_CUDA_CHECK(cudaMemset(dy.p, 0xff, y.size() * 2));
      TETRA_CUDA_CHECK(sh.fn(col_args(d, dx, dy.as<uint16_t>()), nullptr));
      TETRA_CUDA_CHECK(cudaDeviceSynchronize());
      TETRA_CUDA_CHECK(cudaMemcpy(y.data(), dy.p, y.size() * 2, cudaMemcpyDeviceToHost));
      const Errors ef = compare(y, want);
      std::printf("n %5d k %5d outlier %7g | bf16 kernel nmse %.3g max %.3g | columns %s nmse %.3g max %.3g\n",
                  cs.n, cs.k, cs.outlier, eb.nmse, eb.max_rel, sh.name, ef.nmse, ef.max_rel);
      // Both round y to bf16 (relative 2^-9): the NMSE floor is ~1e-6 from that alone.
      EXPECT_LT(ef.nmse, 1e-5) << sh.name << " n " << cs.n << " k " << cs.k;
      EXPECT_LT(ef.nmse, 4.0 * eb.nmse + 1e-7) << sh.name << " n " << cs.n << " k " << cs.k;
    }
  }
}

TEST(BenchGemvBlockColumns, Timing) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("TETRA_BENCH_FULL") == nullptr) GTEST_SKIP() << "TETRA_BENCH_FULL=1 for the table";
  struct Case {
    const char* name;
    int n, k;
  };
  const Case cases[] = {{"qkv fused 14336x4096", 14336, 4096}, {"o_proj 4096x12288", 4096, 12288}};
  std::printf("\n| matrix | kernel | us | GB/s |\n|---|---|---|---|\n");
  for (const Case& cs : cases) {
    const int n_copies = test::weight_copies();  // TETRA_PARTS_COPIES=1: L2-resident weights
    std::vector<oc::Nvfp4LinearBuffer> copies;
    for (int c = 0; c < n_copies; ++c) copies.push_back(upload(random_matrix(cs.n, cs.k, 100 + c)));
    const double bytes = double(cs.n) * cs.k * (0.5 + 1.0 / 16);
    const auto x = random_x(cs.k, 3, 0.0f);
    DevX dx(x);
    test::DeviceScratch dy(size_t(cs.n) * 2);
    const double us_scale = test::graph_us_per_launch(32, [&](int, cudaStream_t s) { dx.prepare(s); });
    std::printf("| %s | scale_x alone (one block; a model would fuse it into x's producer) | %.2f | - |\n",
                cs.name, us_scale);
    std::printf("| %s | (weight copies: %d) | | |\n", cs.name, n_copies);
    for (int round = 0; round < 2; ++round) {
      const double us_bf16 = test::graph_us_per_launch(32, [&](int i, cudaStream_t s) {
        const oc::Nvfp4GemvOutput out{&copies[size_t(i % n_copies)].view(), nullptr, dy.as<uint16_t>()};
        TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(&out, 1, dx.x.as<uint16_t>(), 1, s));
      });
      std::printf("| %s | production (auto) | %.2f | %.0f |\n", cs.name, us_bf16, bytes / us_bf16 / 1e3);
      const int cpw = cs.k / 64 / kWarps;
      for (const Shape& sh : kShapes) {
        if (cpw % sh.slots != 0) continue;
        const double us = test::graph_us_per_launch(32, [&](int i, cudaStream_t s) {
          TETRA_CUDA_CHECK(sh.fn(col_args(copies[size_t(i % n_copies)], dx, dy.as<uint16_t>()), s));
        });
        std::printf("| %s | block columns %s | %.2f | %.0f |\n", cs.name, sh.name, us, bytes / us / 1e3);
        EXPECT_TRUE(std::isfinite(us) && us > 0.0);
      }
    }
  }
}

}  // namespace
}  // namespace tetra
