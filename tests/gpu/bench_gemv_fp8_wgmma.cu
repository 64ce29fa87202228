// Experiment (session 43): the batch-1 NVFP4 GEMV on FP8 warpgroup MMA, to cut the instructions
// per weight that bound the one-row GEMVs (session 31: ~88 warp instructions per 1024 weights in
// the q/k/v kernel, 48 of them the dequantize to bf16 and the block-scale multiply).
//
// The idea: Hopper's wgmma multiplies E4M3 natively (k = 32 per instruction), and an E2M1 code is
// an E4M3 byte after a bit move (value * 2^-6: sign to bit 7, the 3 code bits to bits 4..2), so
// the weights need 4 integer ops per 8 (no multiply): r_lo = w & M, r_hi = ((w >> 2) ^ (w << 2))
// & M on a stored word the packer encodes for that decode (a GF(2) code, as moe/fragment_code.h).
// x enters as two E4M3 parts per element, hi = e4m3(x * 2^E) and lo = e4m3(x * 2^E - hi), with
// one power-of-two E per 16-element block: a bf16 value has 8 significant bits and each part
// carries 4, so hi + lo is x exactly unless the element is ~2^15 below its block's largest.
// The block scales cannot go into the MMA (they depend on the weight row), so B's 8 columns
// carry blocks instead of tokens: over a pair of k-steps (64 k, 4 NVFP4 blocks) column 2q holds
// hi and 2q+1 lo of block q, zeros elsewhere, and D's 4 values per thread are (row g, row g+8) x
// (hi, lo) of block t = lane % 4. After each pair a thread adds hi + lo and multiplies in its two
// block scales (fp32 FFMA): ~1.2 instructions per weight per thread against ~2.75.
//
// Kernels: one warpgroup per block owns 64 weight rows over 1/SPLIT of k; the SPLIT blocks of a
// cluster sum their partial rows over distributed shared memory (rank order: the same bits every
// run). f8_gemv keeps S pairs of weights (16 bytes per thread each) in flight in registers,
// reloading a slot once it is decoded (the production Rolling kernel's scheme); f8_stream_gemv
// streams them through a shared-memory ring (the production o_proj kernel's scheme). The B tiles
// (512 bytes per pair) and the block factors 2^(6 - E) sit in shared memory.
// `*Matches*` checks every variant against a double-precision CPU reference next to the
// production kernel; with TETRA_BENCH_FULL=1, `*Timing*` times them as CUDA graphs of 32 launches
// over 4 weight copies, `*StepEmulation*` times o_proj after a 10 us stand-in for the attention
// (what it adds to the chain with its weights streaming meanwhile, production ring depths and
// copy-only mode included), `*WgmmaRate*` the wgmma alone. Not used by the model: every variant
// was as accurate as the production kernel and none faster where it matters (o_proj);
// bench/results/2026-12-03-gemv-fp8-wgmma-h200-s43.md has the figures and the reading.
// Session 45 added the production stream kernel's scheme on mma.sync m16n8k32 E4M3 (independent
// warps, no warpgroup lockstep; f8_mma_stream_gemv): as accurate, but slower (o_proj 11.2 vs 8.7
// us exposed in the step emulation), because sm_90 has no FP8 path for mma.sync: ptxas lowers it
// to F2FP conversions and HMMA.16816.F32 (bench/results/2026-12-03-session45-h200.md).
#include <cooperative_groups.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/half.h"
#include "core/kernel_launch.h"
#include "format/nvfp4.h"
#include "graph_timing.h"
#include "nvfp4_gemv_bench_data.h"
#include "ops/linear/linear_cuda.h"
#include "ops/moe/mbarrier.cuh"
#include "ops/moe/w4a16_fragment.cuh"
#include "ops/moe/w4a16_stream.cuh"

#if defined(__CUDA_ARCH__) && !(__CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define TETRA_NO_WGMMA 1
#endif

namespace tetra {
namespace {

namespace oc = ops::cuda;
using namespace gemv_bench;
namespace cg = cooperative_groups;

// ---- the stored word code ----
constexpr uint32_t kF8Live = 0x9C9C9C9Cu;  // E4M3 sign + the 3 code bits (exponent 1..0, mantissa 2)

// Stored word -> two registers of four E4M3 bytes (E2M1 value * 2^-6 each).
__host__ __device__ inline void f8_word_decode(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = w & kF8Live;
  hi = ((w >> 2) ^ (w << 2)) & kF8Live;
}

// The inverse over GF(2), built once on the host: row j gives stored bit j as the parity of
// (row & live vector), the live vector being lo's 16 live bits then hi's.
struct F8Encoder {
  std::array<uint32_t, 32> row{};
  // lo's 16 live bits, then hi's, as one 32-bit vector.
  static uint32_t live_vector(uint32_t lo, uint32_t hi) {
    uint32_t v = 0;
    int j = 0;
    for (int i = 0; i < 32; ++i)
      if ((kF8Live >> i) & 1u) v |= ((lo >> i) & 1u) << j, v |= ((hi >> i) & 1u) << (16 + j), ++j;
    return v;
  }
  F8Encoder() {
    std::array<uint32_t, 32> a{}, inv{};
    for (int i = 0; i < 32; ++i) {
      for (int j = 0; j < 32; ++j) {
        uint32_t lo, hi;
        f8_word_decode(1u << j, lo, hi);
        a[i] |= ((live_vector(lo, hi) >> i) & 1u) << j;
      }
      inv[i] = 1u << i;
    }
    for (int col = 0; col < 32; ++col) {
      int piv = col;
      while (piv < 32 && !((a[piv] >> col) & 1u)) ++piv;
      if (piv == 32) throw std::runtime_error("f8 word code is singular");
      std::swap(a[col], a[piv]);
      std::swap(inv[col], inv[piv]);
      for (int i = 0; i < 32; ++i)
        if (i != col && ((a[i] >> col) & 1u)) a[i] ^= a[col], inv[i] ^= inv[col];
    }
    row = inv;
  }
  uint32_t encode(uint32_t lo, uint32_t hi) const {
    const uint32_t v = live_vector(lo, hi);
    uint32_t w = 0;
    for (int j = 0; j < 32; ++j) w |= uint32_t(__builtin_popcount(row[j] & v) & 1) << j;
    return w;
  }
};

// E2M1 code (sign bit 3) -> E4M3 byte of value * 2^-6.
inline uint8_t e2m1_as_e4m3(uint8_t code) { return uint8_t(((code & 8u) << 4) | ((code & 7u) << 2)); }

// ---- the kernels ----
struct F8GemvArgs {
  const uint4* w;        // [n/64][pairs][128 threads] 4 stored words (k-steps 2p, 2p+1)
  const uint16_t* s;     // [n/64][pairs][128] E4M3 scales (row g, row g+8) of block 4p + lane % 4
  const uint8_t* b;      // [pairs][512] B tiles (x hi / lo per block, see prep_x)
  const float* xf;       // [k/16] 2^(6 - E) per block
  float alpha;           // weight_scale_2
  uint16_t* y;           // [n] bf16
  int n, pairs;
};

// 16-element block b of x -> its hi and lo E4M3 parts (4 words of 4 bytes each, element i in
// byte i % 4 of word i / 4) and E; returns false past the end (b >= k / 16).
__device__ __forceinline__ bool split_x_block(const uint16_t* x, int k, int b, uint32_t (&hi)[4],
                                              uint32_t (&lo)[4], int& e) {
  if (b >= k / 16) return false;
  float v[16];
  float amax = 0.0f;
  const uint4* src = reinterpret_cast<const uint4*>(x + size_t(b) * 16);
  const uint4 u[2] = {src[0], src[1]};
  const uint16_t* h = reinterpret_cast<const uint16_t*>(u);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    v[i] = __bfloat162float(__ushort_as_bfloat16(h[i]));
    amax = fmaxf(amax, fabsf(v[i]));
  }
  // amax * 2^E in [2^7, 2^8): E4M3's largest normal binade below its 448 maximum.
  e = amax > 0.0f && amax < INFINITY ? 7 - (int((__float_as_uint(amax) >> 23) & 255u) - 127) : 0;
  const float f = exp2f(float(e));
#pragma unroll
  for (int i = 0; i < 4; ++i) hi[i] = lo[i] = 0u;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float s = v[i] * f;  // exact: a power of two
    const __nv_fp8_e4m3 H(s);
    const __nv_fp8_e4m3 L(s - float(H));
    hi[i / 4] |= uint32_t(H.__x) << (8 * (i % 4));
    lo[i / 4] |= uint32_t(L.__x) << (8 * (i % 4));
  }
  return true;
}

// x -> B operands and block factors; thread per 16-element block b = 4p + q.
// wgmma (MMA_IMAGE false): its hi and lo rows go to column 2q and 2q+1 of pair p's 512-byte tile
// (k-step q / 2, core matrix q % 2), 16 bytes each.
// mma.sync (MMA_IMAGE true): pair p's 512-byte image of every lane's four B registers
// (f8_mma_stream_gemv): lane (2q + part, t) holds part (hi, lo) of block q at k 4t..4t+3 in
// register q.
// Elsewhere the tiles and images are zero from the first memset and never written.
template <bool MMA_IMAGE>
__global__ void prep_x(const uint16_t* x, int k, uint32_t* out, float* xf) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  uint32_t hi[4], lo[4];
  int e;
  if (!split_x_block(x, k, b, hi, lo, e)) return;
  const int p = b / 4, q = b % 4;
  uint32_t* pair = out + size_t(p) * 128;
  if constexpr (MMA_IMAGE) {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      pair[((2 * q) * 4 + t) * 4 + q] = hi[t];
      pair[((2 * q + 1) * 4 + t) * 4 + q] = lo[t];
    }
  } else {
    uint4* tile = reinterpret_cast<uint4*>(pair) + (q / 2) * 16 + (q % 2) * 8;
    tile[2 * q] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    tile[2 * q + 1] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
  xf[b] = exp2f(float(6 - e));
}

#ifndef TETRA_NO_WGMMA
// K-major B (32 k x 8 columns) without swizzle: two core matrices of 8 columns x 16 bytes, the
// second (k 16..31) 128 bytes after the first.
__device__ __forceinline__ uint64_t b_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(128 >> 4) << 16) | (uint64_t(256 >> 4) << 32);
}
// d (row g / g+8 x columns 2t, 2t+1) = A (registers) * B (+ d when acc).
__device__ __forceinline__ void wgmma_f8_k32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint64_t b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(acc));
}
#endif

// E4M3 scale byte (sign clear) -> float, exact (subnormals too: the shifted bits read as the
// value * 2^-120).
__device__ __forceinline__ float scale_f32(uint32_t byte) {
  return __uint_as_float(byte << 20) * 0x1p120f;
}

#ifndef TETRA_NO_WGMMA
// A thread's 16 stored bytes of a pair -> the A registers of its two k-steps (a[0..3], a[4..7]).
__device__ __forceinline__ void decode_pair(const uint4& w, uint32_t (&a)[8]) {
  f8_word_decode(w.x, a[0], a[1]);
  f8_word_decode(w.y, a[2], a[3]);
  f8_word_decode(w.z, a[4], a[5]);
  f8_word_decode(w.w, a[6], a[7]);
}
// d = the pair's (block, hi/lo) partial sums: two k-steps over the pair's 512-byte B tile.
__device__ __forceinline__ void mma_pair(float (&d)[4], const uint32_t (&a)[8], uint32_t b_tile) {
  wgmma_f8_k32(d, a[0], a[1], a[2], a[3], b_desc(b_tile), 0);
  wgmma_f8_k32(d, a[4], a[5], a[6], a[7], b_desc(b_tile + 256), 1);
}
#endif
// acc (rows g, g+8) += block t's scale * x factor * (hi + lo).
__device__ __forceinline__ void apply_pair(float& acc0, float& acc1, const float (&d)[4], uint32_t sc,
                                           float xf) {
  acc0 = fmaf(scale_f32(sc & 0xffu) * xf, d[0] + d[1], acc0);
  acc1 = fmaf(scale_f32(sc >> 8) * xf, d[2] + d[3], acc1);
}
// Rows g, g+8 summed over the quad's four blocks (lanes t = 0..3).
__device__ __forceinline__ void quad_sum(float& acc0, float& acc1) {
  acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
  acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
  acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
  acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
}

template <int SPLIT, int S>
__global__ void __cluster_dims__(SPLIT, 1, 1) __launch_bounds__(128)
    f8_gemv(const F8GemvArgs a) {
#ifndef TETRA_NO_WGMMA
  extern __shared__ __align__(128) uint8_t sm[];
  __shared__ float red[64];
  const int split = blockIdx.x, grp = blockIdx.y;
  const int np = a.pairs / SPLIT, p0 = split * np;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const uint4* wp = a.w + (size_t(grp) * a.pairs + p0) * 128 + tid;
  const uint16_t* sp = a.s + (size_t(grp) * a.pairs + p0) * 128 + tid;
  asm volatile("griddepcontrol.launch_dependents;");
  uint4 wv[S];
  uint32_t sv[S];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    wv[s] = moe_detail::ld_stream_u4(wp + size_t(s) * 128);
    sv[s] = moe_detail::ld_stream_u16(sp + size_t(s) * 128);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // This block's B tiles and block factors.
  float* xs = reinterpret_cast<float*>(sm + size_t(np) * 512);
  for (int i = tid; i < np * 32; i += 128)
    moe_detail::cp_async_16(sm + size_t(i) * 16, a.b + size_t(p0) * 512 + size_t(i) * 16, 16);
  for (int i = tid; i < np; i += 128)
    moe_detail::cp_async_16(xs + 4 * i, a.xf + 4 * size_t(p0 + i), 16);
  moe_detail::cp_async_commit();
  moe_detail::cp_async_wait<0>();
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const uint32_t b0 = moe_detail::smem_u32(sm);

  float acc0 = 0.0f, acc1 = 0.0f;  // rows g, g+8 (block t of every pair)
  // All S pairs are decoded before the batch's first wgmma: ptxas serializes register-A wgmmas
  // whose inputs (or whose accumulators' readers) fall between an earlier wgmma and its wait, so
  // the decode of the next pairs cannot overlap the current ones (session 43 timed that variant
  // too: no faster, bench/results/2026-12-03-gemv-fp8-wgmma-h200-s43.md). One wait per S pairs.
  for (int i0 = 0; i0 < np; i0 += S) {
    uint32_t A[S][8];
    float d[S][4];
    uint32_t sc[S];
#pragma unroll
    for (int s = 0; s < S; ++s) {
      decode_pair(wv[s], A[s]);
      sc[s] = sv[s];
      if (i0 + S + s < np) {
        wv[s] = moe_detail::ld_stream_u4(wp + size_t(i0 + S + s) * 128);
        sv[s] = moe_detail::ld_stream_u16(sp + size_t(i0 + S + s) * 128);
      }
    }
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int s = 0; s < S; ++s) mma_pair(d[s], A[s], b0 + uint32_t(i0 + s) * 512);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int s = 0; s < S; ++s) apply_pair(acc0, acc1, d[s], sc[s], xs[4 * (i0 + s) + t]);
  }
  // Rows g, g+8 over the quad's four blocks, then over the cluster's k splits in rank order.
  quad_sum(acc0, acc1);
  if (t == 0) red[16 * warp + g] = acc0, red[16 * warp + g + 8] = acc1;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  if (split == 0 && tid < 64) {
    float sum = 0.0f;
    for (int r = 0; r < SPLIT; ++r) sum += cluster.map_shared_rank(red, r)[tid];
    a.y[size_t(grp) * 64 + tid] = moe_detail::f32_to_bf16_bits(sum * a.alpha);
  }
  cluster.sync();  // the other ranks' red stays alive until rank 0 has read it
#endif
}

template <int SPLIT, int S>
cudaError_t launch_f8(const F8GemvArgs& a, cudaStream_t stream) {
  const int np = a.pairs / SPLIT;
  const size_t smem = size_t(np) * 512 + size_t(np) * 16;
  auto kernel = f8_gemv<SPLIT, S>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  const KernelLaunch launch(dim3(unsigned(SPLIT), unsigned(a.n / 64)), dim3(128), stream, true, smem);
  return launch(kernel, a);
}

// Weight-streaming variant (the production o_proj kernel's scheme, ops/moe/w4a16_stream.cuh):
// one producer lane per block streams the block's pairs with 1-D bulk copies into a ring of
// stages (a stage: one pair per consumer warpgroup, 2 KB of words + 256 B of scales each) while
// the previous kernel still runs; the W consumer warpgroups take SB stages at a time (decode all,
// then the wgmmas: no ptxas serialization). The block's B tiles come in one bulk copy after the
// dependency wait. KS blocks of a cluster split k; rank 0 adds their rows in rank order.
constexpr int kPairWordBytes = 128 * 16, kPairScaleBytes = 128 * 2;

template <int KS, int W, int SB>
constexpr size_t f8_stream_smem(int stages, int np) {
  return size_t(stages) * W * (kPairWordBytes + kPairScaleBytes) + size_t(np) * 512 + 16 * (2 * stages + 1);
}

template <int KS, int W, int SB>
__global__ void __cluster_dims__(KS, 1, 1) __launch_bounds__((4 * W + 1) * 32, 1)
    f8_stream_gemv(const F8GemvArgs a, int stages) {
#ifndef TETRA_NO_WGMMA
  extern __shared__ __align__(128) uint8_t sm[];
  __shared__ float red[W][64];
  const int split = blockIdx.x, grp = blockIdx.y;
  const int np = a.pairs / KS, p0 = split * np, nst = np / W;  // pairs, first pair, stages of work
  uint8_t* ring_w = sm;                                                  // [stages][W][2048]
  uint8_t* ring_s = ring_w + size_t(stages) * W * kPairWordBytes;         // [stages][W][256]
  uint8_t* btile = ring_s + size_t(stages) * W * kPairScaleBytes;         // [np][512]
  uint64_t* full = reinterpret_cast<uint64_t*>(btile + size_t(np) * 512);  // [stages]
  uint64_t* empty = full + stages;                                        // [stages]
  uint64_t* bbar = empty + stages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) moe_detail::mbar_init(&full[i], 1), moe_detail::mbar_init(&empty[i], W * 128);
    moe_detail::mbar_init(bbar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;");
  const uint8_t* wsrc = reinterpret_cast<const uint8_t*>(a.w) + (size_t(grp) * a.pairs + p0) * kPairWordBytes;
  const uint8_t* ssrc = reinterpret_cast<const uint8_t*>(a.s) + (size_t(grp) * a.pairs + p0) * kPairScaleBytes;
  float acc0 = 0.0f, acc1 = 0.0f;
  const int c = warp / 4, tid = threadIdx.x % 128, g = (tid % 32) / 4, t = tid % 4, wq = (tid / 32);
  if (warp == 4 * W) {
    if (lane == 0) {
      const uint64_t policy = moe_detail::l2_evict_first_policy();
      for (int i = 0; i < nst; ++i) {
        const int st = i % stages;
        moe_detail::mbar_wait(&empty[st], ((i / stages) & 1) ^ 1);
        moe_detail::mbar_arrive_expect_tx(&full[st], W * (kPairWordBytes + kPairScaleBytes));
        moe_detail::bulk_copy_g2s(ring_w + size_t(st) * W * kPairWordBytes, wsrc + size_t(i) * W * kPairWordBytes,
                                  W * kPairWordBytes, &full[st], policy);
        moe_detail::bulk_copy_g2s(ring_s + size_t(st) * W * kPairScaleBytes, ssrc + size_t(i) * W * kPairScaleBytes,
                                  W * kPairScaleBytes, &full[st], policy);
      }
    }
  } else {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0) {
      moe_detail::mbar_arrive_expect_tx(bbar, uint32_t(np) * 512);
      moe_detail::bulk_copy_g2s(btile, a.b + size_t(p0) * 512, uint32_t(np) * 512, bbar,
                                moe_detail::l2_evict_normal_policy());
    }
    const float* xfb = a.xf + 4 * size_t(p0);
    moe_detail::mbar_wait(bbar, 0);
    const uint32_t b0 = moe_detail::smem_u32(btile);
    const uint32_t wl = moe_detail::smem_u32(ring_w) + uint32_t(c * kPairWordBytes + tid * 16);
    const uint32_t sl = moe_detail::smem_u32(ring_s) + uint32_t(c * kPairScaleBytes + tid * 2);
    for (int i0 = 0; i0 < nst; i0 += SB) {
      uint32_t AB[SB][8];
      float DB[SB][4];
      uint32_t scb[SB];
      float xfv[SB];
#pragma unroll
      for (int s = 0; s < SB; ++s) {
        const int i = i0 + s, st = i % stages;
        moe_detail::mbar_wait(&full[st], (i / stages) & 1);
        const uint4 w = moe_detail::lds_u4(wl + uint32_t(st) * W * kPairWordBytes);
        scb[s] = moe_detail::lds_u16(sl + uint32_t(st) * W * kPairScaleBytes);
        moe_detail::mbar_arrive(&empty[st]);
        decode_pair(w, AB[s]);
        xfv[s] = __ldg(xfb + 4 * (i * W + c) + t);
      }
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int s = 0; s < SB; ++s) mma_pair(DB[s], AB[s], b0 + uint32_t((i0 + s) * W + c) * 512);
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
      for (int s = 0; s < SB; ++s) apply_pair(acc0, acc1, DB[s], scb[s], xfv[s]);
    }
    quad_sum(acc0, acc1);
    if (t == 0) red[c][16 * wq + g] = acc0, red[c][16 * wq + g + 8] = acc1;
  }
  __syncthreads();
  if (threadIdx.x < 64) {
    float v = 0.0f;
    for (int w = 0; w < W; ++w) v += red[w][threadIdx.x];
    red[0][threadIdx.x] = v;
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  if (split == 0 && threadIdx.x < 64) {
    float sum = 0.0f;
    for (int r = 0; r < KS; ++r) sum += cluster.map_shared_rank(&red[0][0], r)[threadIdx.x];
    a.y[size_t(grp) * 64 + threadIdx.x] = moe_detail::f32_to_bf16_bits(sum * a.alpha);
  }
  cluster.sync();
#endif
}

template <int KS, int W, int SB, int STAGES>
cudaError_t launch_f8_stream(const F8GemvArgs& a, cudaStream_t stream) {
  const int np = a.pairs / KS;
  const int stages = std::min(STAGES, np / W);
  const size_t smem = f8_stream_smem<KS, W, SB>(stages, np);
  auto kernel = f8_stream_gemv<KS, W, SB>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  const KernelLaunch launch(dim3(unsigned(KS), unsigned(a.n / 64)), dim3(unsigned((4 * W + 1) * 32)), stream, true,
                            smem);
  return launch(kernel, a, stages);
}

// ---- the same weights on mma.sync (session 45) ----
// wgmma's warpgroup lockstep cost the variants above their gain; mma.sync m16n8k32 (E4M3 since
// sm_89) keeps the production stream kernel's independent warps and still multiplies E4M3
// natively. A warp's A fragment of one 32-k step is the wgmma one (rows g, g+8; k 4t..4t+3 and
// 16 + 4t..), so the stored word code is the same; only the memory order differs: one block
// streams one 16-row tile, so a tile's pairs are contiguous ([tile][pair][lane] x 16 bytes).
// B per pair (two k-steps, blocks 4p..4p+3): column 2q holds hi and 2q + 1 lo of block q, block q
// in k-step q / 2, so lane (g, t) has one live B register, (k-step g / 4, half (g % 4) / 2) =
// hi (g even) or lo (g odd) of block g / 2 at k 4t..4t+3: prep_x<true> writes a 512-byte image per
// pair, 16 bytes per lane. D then holds block t's (hi, lo) for rows g and g + 8, as above.
struct F8MmaArgs {
  const uint8_t* w;   // [n/16][pairs][32 lanes][16] stored words
  const uint8_t* s;   // [n/16][pairs][32 lanes][2] E4M3 scales (row g, row g+8) of block 4p + t
  const uint4* b;     // [pairs][32 lanes] B registers (see above)
  const float* xf;    // [k/16] 2^(6 - E) per block
  float alpha;
  uint16_t* y;        // [n] bf16
  int n, pairs;
};

// d (rows g, g+8 x columns 2t, 2t+1) = A * B (+ c).
__device__ __forceinline__ void mma_f8_16832(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1, const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%11,%12,%13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

// One pair: rows g, g+8 += the four blocks' scaled sums (block t per lane).
__device__ __forceinline__ void mma_pair_sync(float& acc0, float& acc1, const uint4& w, const uint4& bx,
                                              uint32_t sc, float xf) {
  uint32_t a[8];
  f8_word_decode(w.x, a[0], a[1]);
  f8_word_decode(w.y, a[2], a[3]);
  f8_word_decode(w.z, a[4], a[5]);
  f8_word_decode(w.w, a[6], a[7]);
  const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float d0[4], d[4];
  mma_f8_16832(d0, a[0], a[1], a[2], a[3], bx.x, bx.y, zero);
  mma_f8_16832(d, a[4], a[5], a[6], a[7], bx.z, bx.w, d0);
  apply_pair(acc0, acc1, d, sc, xf);
}

// The production stream kernel's scheme (ops/moe/w4a16_stream.cuh) with these weights: C consumer
// warps + 1 producer lane, a stage = C pairs of the block's tile, one per warp; two blocks per SM.
template <int C>
constexpr size_t f8_mma_smem(int stages) { return size_t(stages) * C * (512 + 64) + 16 * size_t(stages) * 2; }

template <int C, bool NO_MATH>
__global__ void __launch_bounds__((C + 1) * 32, 2) f8_mma_stream_gemv(const F8MmaArgs a, int stages) {
  extern __shared__ __align__(128) uint8_t sm[];
  __shared__ float red[C][16];
  uint8_t* ring_w = sm;                                           // [stages][C][512]
  uint8_t* ring_s = ring_w + size_t(stages) * C * 512;            // [stages][C][64]
  uint64_t* full = reinterpret_cast<uint64_t*>(ring_s + size_t(stages) * C * 64);
  uint64_t* empty = full + stages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) moe_detail::mbar_init(&full[i], 1), moe_detail::mbar_init(&empty[i], C * 32);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;");
  const int tiles = a.n / 16, nst = a.pairs / C;  // pairs % C == 0
  if (warp == C) {
    if (lane != 0) return;
    const uint64_t policy = moe_detail::l2_evict_first_policy();
    int i = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x)
      for (int j = 0; j < nst; ++j, ++i) {
        const int st = i % stages;
        const size_t p0 = size_t(tile) * a.pairs + size_t(j) * C;
        moe_detail::mbar_wait(&empty[st], ((i / stages) & 1) ^ 1);
        moe_detail::mbar_arrive_expect_tx(&full[st], C * (512 + 64));
        moe_detail::bulk_copy_g2s(ring_w + size_t(st) * C * 512, a.w + p0 * 512, C * 512, &full[st], policy);
        moe_detail::bulk_copy_g2s(ring_s + size_t(st) * C * 64, a.s + p0 * 64, C * 64, &full[st], policy);
      }
    return;
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const uint32_t wl = moe_detail::smem_u32(ring_w) + uint32_t(warp * 512 + lane * 16);
  const uint32_t sl = moe_detail::smem_u32(ring_s) + uint32_t(warp * 64 + lane * 2);
  int i = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    float acc0 = 0.0f, acc1 = 0.0f;
    const uint4* bx = a.b + size_t(warp) * 32 + lane;  // pair j * C + warp
    const float* xfp = a.xf + size_t(warp) * 4 + t;
    for (int j = 0; j < nst; ++j, ++i) {
      const int st = i % stages;
      const uint4 xb = moe_detail::ld_cached_u4(bx + size_t(j) * C * 32);
      const float xfv = __ldg(xfp + size_t(j) * C * 4);
      moe_detail::mbar_wait(&full[st], (i / stages) & 1);
      const uint4 w = moe_detail::lds_u4(wl + uint32_t(st) * C * 512);
      const uint32_t sc = moe_detail::lds_u16(sl + uint32_t(st) * C * 64);
      moe_detail::mbar_arrive(&empty[st]);
      if constexpr (NO_MATH)
        acc0 += __uint_as_float(w.x ^ w.y ^ w.z ^ w.w ^ sc ^ xb.x) * 0.0f * xfv;
      else
        mma_pair_sync(acc0, acc1, w, xb, sc, xfv);
    }
    quad_sum(acc0, acc1);
    if (t == 0) red[warp][g] = acc0, red[warp][g + 8] = acc1;
    asm volatile("bar.sync 1, %0;" ::"n"(C * 32) : "memory");
    if (threadIdx.x < 16) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < C; ++w) v += red[w][threadIdx.x];
      a.y[size_t(tile) * 16 + threadIdx.x] = moe_detail::f32_to_bf16_bits(v * a.alpha);
    }
    asm volatile("bar.sync 1, %0;" ::"n"(C * 32) : "memory");  // red is rewritten by the next tile
  }
}

template <int C, int STAGES, bool NO_MATH = false>
cudaError_t launch_f8_mma_stream(const F8MmaArgs& a, cudaStream_t stream) {
  if (a.pairs % C != 0) return cudaErrorInvalidValue;
  const size_t smem = f8_mma_smem<C>(STAGES);
  auto kernel = f8_mma_stream_gemv<C, NO_MATH>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  const int grid = std::min(a.n / 16, 2 * current_device_sm_count());
  const KernelLaunch launch(dim3(unsigned(grid)), dim3(unsigned((C + 1) * 32)), stream, true, smem);
  return launch(kernel, a, STAGES);
}

using MmaLaunchFn = cudaError_t (*)(const F8MmaArgs&, cudaStream_t);
struct MmaVariant {
  const char* name;
  MmaLaunchFn fn;
};
const MmaVariant kMmaVariants[] = {
    {"mma.sync stream 16 warps, 4 stages", launch_f8_mma_stream<16, 4>},
    {"mma.sync stream 16 warps, 8 stages", launch_f8_mma_stream<16, 8>},
    {"mma.sync stream 8 warps, 8 stages", launch_f8_mma_stream<8, 8>},
    {"mma.sync stream 16 warps, 4 stages, no math", launch_f8_mma_stream<16, 4, true>},
    {"mma.sync stream 16 warps, 8 stages, no math", launch_f8_mma_stream<16, 8, true>}};

using LaunchFn = cudaError_t (*)(const F8GemvArgs&, cudaStream_t);
struct Variant {
  const char* name;
  LaunchFn fn;
  int split, slots;  // pairs must be a multiple of split * slots
};
const Variant kVariants[] = {
    // register loads: split k over a cluster of `split` blocks, S pairs in flight per thread
    {"batch split 4 S 2", launch_f8<4, 2>, 4, 2}, {"batch split 8 S 2", launch_f8<8, 2>, 8, 2},
    {"batch split 4 S 4", launch_f8<4, 4>, 4, 4}, {"batch split 8 S 4", launch_f8<8, 4>, 8, 4},
    {"batch split 2 S 4", launch_f8<2, 4>, 2, 4},
    // stream: split KS, W consumer warpgroups, SB stages per batch, ring stages
    {"stream KS 2 W 4 SB 2 R 16", launch_f8_stream<2, 4, 2, 16>, 2, 8},
    {"stream KS 2 W 4 SB 1 R 16", launch_f8_stream<2, 4, 1, 16>, 2, 4},
    {"stream KS 4 W 2 SB 2 R 16", launch_f8_stream<4, 2, 2, 16>, 4, 4},
    {"stream KS 4 W 4 SB 2 R 8", launch_f8_stream<4, 4, 2, 8>, 4, 8},
    {"stream KS 4 W 2 SB 4 R 16", launch_f8_stream<4, 2, 4, 16>, 4, 8},
    {"stream KS 1 W 4 SB 2 R 12", launch_f8_stream<1, 4, 2, 12>, 1, 8},
    {"stream KS 2 W 2 SB 2 R 24", launch_f8_stream<2, 2, 2, 24>, 2, 4},
    {"stream KS 2 W 6 SB 2 R 8", launch_f8_stream<2, 6, 2, 8>, 2, 12},
    {"stream KS 2 W 6 SB 4 R 8", launch_f8_stream<2, 6, 4, 8>, 2, 24},
    {"stream KS 2 W 6 SB 2 R 10", launch_f8_stream<2, 6, 2, 10>, 2, 12}};

// Stands in for the decode attention in a step: waits for the previous kernel, lets the next
// one launch, then keeps 64 SMs busy for `cycles` without touching HBM (the attention at batch 1
// moves ~4 MB), so the GEMV's producer can fill its ring meanwhile.
__global__ void spin_kernel(long long cycles, int* sink) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const long long t0 = clock64();
  int v = 0;
  while (clock64() - t0 < cycles) ++v;
  if (v == -1) *sink = v;
}

cudaError_t launch_spin(long long cycles, int* sink, cudaStream_t s) {
  const KernelLaunch launch(dim3(64), dim3(128), s);
  return launch(spin_kernel, cycles, sink);
}

// wgmma m64n8k32 (E4M3, A in registers) alone: cycles per group of G wgmmas (fence, G wgmmas,
// commit, wait for all) in one warpgroup, with B from shared memory. out[block] = cycles / iter.
template <int G>
__global__ void __launch_bounds__(128) wgmma_rate(int iters, float* sink, long long* cycles) {
#ifndef TETRA_NO_WGMMA
  __shared__ __align__(128) uint8_t b[512];
  for (int i = threadIdx.x; i < 512; i += 128) b[i] = uint8_t(i * 7);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const uint32_t b0 = moe_detail::smem_u32(b);
  uint32_t A[8];
  for (int i = 0; i < 8; ++i) A[i] = (threadIdx.x * 0x01010101u + i) & kF8Live;
  float d[G][4] = {};
  float acc = 0.0f;
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int q = 0; q < G; ++q) wgmma_f8_k32(d[q], A[0], A[1], A[2], A[3], b_desc(b0 + (q % 2) * 256), 0);
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int q = 0; q < G; ++q) acc += d[q][0] + d[q][3];
  }
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = (t1 - t0) / iters;
  if (acc == 1234.5f) *sink = acc;
#endif
}

// ---- host data ----

// One thread's share of pair p for weight rows r0 and r0 + 8 and block 4p + t (the A fragment of
// wgmma m64n8k32 per warp, and of mma.sync m16n8k32): 4 stored words (word j: k-step j / 2, k
// half j % 2) and the two rows' scale bytes.
void pack_lane_pair(const HostMatrix& m, int r0, int p, int t, uint32_t* words, uint16_t& scales) {
  static const F8Encoder enc;
  const int r1 = r0 + 8;
  for (int j = 0; j < 4; ++j) {
    const int kb = 64 * p + 32 * (j / 2) + 16 * (j % 2) + 4 * t;
    uint32_t lo = 0, hi = 0;
    for (int i = 0; i < 4; ++i) {
      lo |= uint32_t(e2m1_as_e4m3(m.code(r0, kb + i))) << (8 * i);
      hi |= uint32_t(e2m1_as_e4m3(m.code(r1, kb + i))) << (8 * i);
    }
    words[j] = enc.encode(lo, hi);
  }
  const int blk = 4 * p + t;
  scales = uint16_t(m.scales[size_t(r0) * (m.k / 16) + blk] | (m.scales[size_t(r1) * (m.k / 16) + blk] << 8));
}

// One matrix packed for the f8 kernels: groups of group_rows weight rows (64: the wgmma kernels'
// warpgroup tiles, F8GemvArgs; 16: the mma.sync kernel's tiles, F8MmaArgs), each group's pairs in
// order, each pair's threads (4 warps, or 1) in order, 16 bytes each; scales the same way.
struct F8Weights {
  test::DeviceScratch w, s;
  int n, pairs;
  float alpha;
  explicit F8Weights(const HostMatrix& m, int group_rows = 64)
      : w(size_t(m.n) * m.k / 2), s(size_t(m.n) * m.k / 16), n(m.n), pairs(m.k / 64), alpha(m.scale_2) {
    const int warps = group_rows / 16;  // 16-row tiles per group
    std::vector<uint32_t> words(size_t(m.n) * m.k / 8);
    std::vector<uint16_t> sc(size_t(m.n / 16) * pairs * 32);
    for (int tile = 0; tile < m.n / 16; ++tile)
      for (int p = 0; p < pairs; ++p)
        for (int lane = 0; lane < 32; ++lane) {
          const size_t at = (size_t(tile / warps) * pairs + p) * (warps * 32) + (tile % warps) * 32 + lane;
          pack_lane_pair(m, 16 * tile + lane / 4, p, lane % 4, &words[at * 4], sc[at]);
        }
    TETRA_CUDA_CHECK(cudaMemcpy(w.p, words.data(), words.size() * 4, cudaMemcpyHostToDevice));
    TETRA_CUDA_CHECK(cudaMemcpy(s.p, sc.data(), sc.size() * 2, cudaMemcpyHostToDevice));
  }
};

// x on the device and in an f8 kernel's B operands (prep_x): the wgmma kernels' tiles, or with
// mma_image the mma.sync kernel's per-lane images. Zeros where no block lives, set once.
struct F8X {
  test::DeviceScratch x, b, xf;
  int k;
  bool mma_image;
  explicit F8X(const std::vector<uint16_t>& host, bool mma_image_ = false)
      : x(host.size() * 2), b(host.size() * 8), xf(host.size() / 4), k(int(host.size())), mma_image(mma_image_) {
    TETRA_CUDA_CHECK(cudaMemcpy(x.p, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    TETRA_CUDA_CHECK(cudaMemset(b.p, 0, host.size() * 8));
    prepare(nullptr);
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void prepare(cudaStream_t s) {
    const int blocks = k / 16;
    // A programmatic dependent (it waits before reading x), so a GEMV after it can start early.
    const KernelLaunch launch(dim3(unsigned((blocks + 127) / 128)), dim3(128), s);
    TETRA_CUDA_CHECK(launch(mma_image ? prep_x<true> : prep_x<false>, static_cast<const uint16_t*>(x.as<uint16_t>()),
                            k, b.as<uint32_t>(), xf.as<float>()));
  }
};

F8GemvArgs f8_args(const F8Weights& w, const F8X& x, uint16_t* y) {
  return {w.w.as<uint4>(), w.s.as<uint16_t>(), x.b.as<uint8_t>(), x.xf.as<float>(), w.alpha, y, w.n, w.pairs};
}

F8MmaArgs f8_mma_args(const F8Weights& w, const F8X& x, uint16_t* y) {
  return {w.w.as<uint8_t>(), w.s.as<uint8_t>(), x.b.as<uint4>(), x.xf.as<float>(), w.alpha, y, w.n, w.pairs};
}

bool runnable(const Variant& v, int pairs) { return pairs % (v.split * v.slots) == 0; }
bool is_diagnostic(const MmaVariant& v) { return std::string(v.name).find("no math") != std::string::npos; }

TEST(BenchGemvFp8Wgmma, EncoderRoundTrips) {
  const F8Encoder enc;
  std::mt19937 rng(3);
  for (int i = 0; i < 10000; ++i) {
    const uint32_t lo = rng() & kF8Live, hi = rng() & kF8Live;
    uint32_t dl, dh;
    f8_word_decode(enc.encode(lo, hi), dl, dh);
    ASSERT_EQ(dl, lo);
    ASSERT_EQ(dh, hi);
  }
}

TEST(BenchGemvFp8Wgmma, MatchesReferenceAndBf16Kernel) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    int n, k;
    float outlier;
  };
  const Case cases[] = {{14336, 4096, 0.0f}, {4096, 12288, 0.0f}, {64, 1024, 0.0f}, {4096, 4096, 1000.0f},
                        {128, 2048, 3.0e4f}};
  for (const Case& cs : cases) {
    const HostMatrix m = random_matrix(cs.n, cs.k, 11 + cs.n + cs.k);
    const auto d = upload(m);
    const F8Weights f8(m);
    const auto x = random_x(cs.k, 5 + cs.k, cs.outlier);
    const auto want = reference(m, x);
    const F8X dx(x);
    test::DeviceScratch dxb(x.size() * 2), dy(size_t(cs.n) * 2);
    TETRA_CUDA_CHECK(cudaMemcpy(dxb.p, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
    std::vector<uint16_t> y(cs.n);
    const oc::Nvfp4GemvOutput out{&d.view(), nullptr, dy.as<uint16_t>()};
    TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(&out, 1, dxb.as<uint16_t>(), 1, nullptr));
    TETRA_CUDA_CHECK(cudaMemcpy(y.data(), dy.p, y.size() * 2, cudaMemcpyDeviceToHost));
    const Errors eb = compare(y, want);
    // One variant's launch into dy, checked against the reference next to the production kernel.
    auto check = [&](const char* name, const std::function<cudaError_t()>& launch) {
      TETRA_CUDA_CHECK(cudaMemset(dy.p, 0xff, y.size() * 2));
      TETRA_CUDA_CHECK(launch());
      TETRA_CUDA_CHECK(cudaDeviceSynchronize());
      TETRA_CUDA_CHECK(cudaMemcpy(y.data(), dy.p, y.size() * 2, cudaMemcpyDeviceToHost));
      const Errors ef = compare(y, want);
      std::printf("n %5d k %5d outlier %7g | bf16 kernel nmse %.3g max %.3g | fp8 %s nmse %.3g max %.3g\n", cs.n,
                  cs.k, cs.outlier, eb.nmse, eb.max_rel, name, ef.nmse, ef.max_rel);
      // Both round y to bf16 (relative 2^-9): the NMSE floor is ~1e-6 from that alone.
      EXPECT_LT(ef.nmse, 1e-5) << name << " n " << cs.n << " k " << cs.k;
      EXPECT_LT(ef.nmse, 4.0 * eb.nmse + 1e-7) << name << " n " << cs.n << " k " << cs.k;
    };
    for (const Variant& v : kVariants)
      if (runnable(v, cs.k / 64)) check(v.name, [&] { return v.fn(f8_args(f8, dx, dy.as<uint16_t>()), nullptr); });
    const F8Weights fm(m, 16);
    const F8X mx(x, true);
    for (const MmaVariant& v : kMmaVariants)
      if (!is_diagnostic(v)) check(v.name, [&] { return v.fn(f8_mma_args(fm, mx, dy.as<uint16_t>()), nullptr); });
  }
}

TEST(BenchGemvFp8Wgmma, Timing) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("TETRA_BENCH_FULL") == nullptr) GTEST_SKIP() << "TETRA_BENCH_FULL=1 for the table";
  struct Case {
    const char* name;
    int n, k;
  };
  const Case cases[] = {{"qkv fused 14336x4096", 14336, 4096}, {"o_proj 4096x12288", 4096, 12288},
                        {"Air GEMM1, 9 experts 25344x4096", 25344, 4096}};
  std::printf("\n| matrix | kernel | us | GB/s |\n|---|---|---|---|\n");
  for (const Case& cs : cases) {
    const int n_copies = test::weight_copies();
    std::vector<HostMatrix> hm;
    for (int c = 0; c < n_copies; ++c) hm.push_back(random_matrix(cs.n, cs.k, 100 + c));
    std::vector<oc::Nvfp4LinearBuffer> copies;
    std::vector<std::unique_ptr<F8Weights>> f8;
    std::vector<std::unique_ptr<F8Weights>> fm;
    for (const auto& m : hm) copies.push_back(upload(m)), f8.push_back(std::make_unique<F8Weights>(m));
    for (const auto& m : hm) fm.push_back(std::make_unique<F8Weights>(m, 16));
    const double bytes = double(cs.n) * cs.k * (0.5 + 1.0 / 16);
    const auto x = random_x(cs.k, 3, 0.0f);
    F8X dx(x);
    F8X mx(x, true);
    test::DeviceScratch dy(size_t(cs.n) * 2);
    const double us_prep = test::graph_us_per_launch(32, [&](int, cudaStream_t s) { dx.prepare(s); });
    std::printf("| %s | prep_x alone (a model would fuse it into x's producer) | %.2f | - |\n", cs.name, us_prep);
    for (int round = 0; round < 2; ++round) {
      const double us_bf16 = test::graph_us_per_launch(32, [&](int i, cudaStream_t s) {
        const oc::Nvfp4GemvOutput out{&copies[size_t(i % n_copies)].view(), nullptr, dy.as<uint16_t>()};
        TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(&out, 1, dx.x.as<uint16_t>(), 1, s));
      });
      std::printf("| %s | production (auto) | %.2f | %.0f |\n", cs.name, us_bf16, bytes / us_bf16 / 1e3);
      for (const Variant& v : kVariants) {
        if (!runnable(v, cs.k / 64)) continue;
        const double us = test::graph_us_per_launch(32, [&](int i, cudaStream_t s) {
          TETRA_CUDA_CHECK(v.fn(f8_args(*f8[size_t(i % n_copies)], dx, dy.as<uint16_t>()), s));
        });
        std::printf("| %s | fp8 wgmma %s | %.2f | %.0f |\n", cs.name, v.name, us, bytes / us / 1e3);
        EXPECT_TRUE(std::isfinite(us) && us > 0.0);
      }
      for (const MmaVariant& v : kMmaVariants) {
        const double us = test::graph_us_per_launch(32, [&](int i, cudaStream_t s) {
          TETRA_CUDA_CHECK(v.fn(f8_mma_args(*fm[size_t(i % n_copies)], mx, dy.as<uint16_t>()), s));
        });
        std::printf("| %s | fp8 %s | %.2f | %.0f |\n", cs.name, v.name, us, bytes / us / 1e3);
        EXPECT_TRUE(std::isfinite(us) && us > 0.0);
      }
    }
  }
}

TEST(BenchGemvFp8Wgmma, StepEmulation) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("TETRA_BENCH_FULL") == nullptr) GTEST_SKIP() << "TETRA_BENCH_FULL=1 for the table";
  // o_proj of GLM-4.5-Air after a 10 us stand-in for the attention: what the GEMV adds to the
  // chain (its exposed time), with its weights streaming during the stand-in as in the step.
  const int n = 4096, k = 12288, n_copies = test::weight_copies();
  std::vector<HostMatrix> hm;
  for (int c = 0; c < n_copies; ++c) hm.push_back(random_matrix(n, k, 200 + c));
  std::vector<oc::Nvfp4LinearBuffer> copies;
  std::vector<std::unique_ptr<F8Weights>> f8;
  std::vector<std::unique_ptr<F8Weights>> fm;
  for (const auto& m : hm) copies.push_back(upload(m)), f8.push_back(std::make_unique<F8Weights>(m));
  for (const auto& m : hm) fm.push_back(std::make_unique<F8Weights>(m, 16));
  const auto x = random_x(k, 4, 0.0f);
  F8X dx(x), mx(x, true);
  test::DeviceScratch dy(size_t(n) * 2), sink(4);
  const long long cycles = 19800;  // ~10 us at 1.98 GHz
  const double spin = test::graph_us_per_launch(16, [&](int, cudaStream_t s) {
    TETRA_CUDA_CHECK(launch_spin(cycles, sink.as<int>(), s));
  });
  std::printf("\n| o_proj after a %.2f us stand-in attention | us per pair | exposed us |\n|---|---|---|\n", spin);
  for (int round = 0; round < 2; ++round) {
    const double prod = test::graph_us_per_launch(16, [&](int i, cudaStream_t s) {
      TETRA_CUDA_CHECK(launch_spin(cycles, sink.as<int>(), s));
      const oc::Nvfp4GemvOutput out{&copies[size_t(i % n_copies)].view(), nullptr, dy.as<uint16_t>()};
      TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(&out, 1, dx.x.as<uint16_t>(), 1, s));
    });
    std::printf("| production (auto) | %.2f | %.2f |\n", prod, prod - spin);
    // The production streaming kernel at other ring depths (16 consumer warps, 2 blocks per SM),
    // and its copy-only mode (8 warps x 2 chunks, no math: the bytes' own bound).
    struct Ring {
      const char* name;
      oc::Nvfp4GemvStreamConfig cfg;
    };
    const Ring rings[] = {{"stream 16 warps, 3 stages", {16, 3, 2, 1, 0}},
                          {"stream 16 warps, 6 stages", {16, 6, 2, 1, 0}},
                          {"stream 16 warps, 8 stages", {16, 8, 2, 1, 0}},
                          {"stream 16 warps, 10 stages", {16, 10, 2, 1, 0}},
                          {"stream 8 warps x 2 chunks, 4 stages", {8, 4, 2, 2, 0}},
                          {"stream 8 warps x 2 chunks, 8 stages", {8, 8, 2, 2, 0}},
                          {"stream 4 warps x 2 chunks, 8 stages", {4, 8, 2, 2, 0}},
                          {"stream no-x (math on constant x) 8 x 2, 8 stages", {8, 8, 2, 2, 2}},
                          {"stream copy-only 8 x 2, 4 stages", {8, 4, 2, 2, 1}},
                          {"stream copy-only 8 x 2, 8 stages", {8, 8, 2, 2, 1}}};
    for (const Ring& r : rings) {
      const double us = test::graph_us_per_launch(16, [&](int i, cudaStream_t s) {
        TETRA_CUDA_CHECK(launch_spin(cycles, sink.as<int>(), s));
        const oc::Nvfp4GemvOutput out{&copies[size_t(i % n_copies)].view(), nullptr, dy.as<uint16_t>()};
        TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(&out, 1, dx.x.as<uint16_t>(), 1, s, oc::Nvfp4GemvKernel::Stream, &r.cfg));
      });
      std::printf("| production %s | %.2f | %.2f |\n", r.name, us, us - spin);
    }
    // An f8 kernel after the stand-in, with and without x's preparation as its own launch
    // (prepare(s), then the kernel's launch for copy i).
    auto row = [&](const char* name, const std::function<void(cudaStream_t)>& prepare,
                   const std::function<cudaError_t(int, cudaStream_t)>& launch) {
      for (int with_prep = 0; with_prep < 2; ++with_prep) {
        const double us = test::graph_us_per_launch(16, [&](int i, cudaStream_t s) {
          TETRA_CUDA_CHECK(launch_spin(cycles, sink.as<int>(), s));
          if (with_prep) prepare(s);
          TETRA_CUDA_CHECK(launch(i, s));
        });
        std::printf("| fp8 %s%s | %.2f | %.2f |\n", name, with_prep ? " + prep_x launch" : "", us, us - spin);
        EXPECT_TRUE(std::isfinite(us) && us > 0.0);
      }
    };
    for (const Variant& v : kVariants)
      if (runnable(v, k / 64) && std::string(v.name).rfind("stream", 0) == 0)
        row(v.name, [&](cudaStream_t s) { dx.prepare(s); }, [&](int i, cudaStream_t s) {
          return v.fn(f8_args(*f8[size_t(i % n_copies)], dx, dy.as<uint16_t>()), s);
        });
    for (const MmaVariant& v : kMmaVariants)
      row(v.name, [&](cudaStream_t s) { mx.prepare(s); }, [&](int i, cudaStream_t s) {
        return v.fn(f8_mma_args(*fm[size_t(i % n_copies)], mx, dy.as<uint16_t>()), s);
      });
  }
}

TEST(BenchGemvFp8Wgmma, WgmmaRate) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("TETRA_BENCH_FULL") == nullptr) GTEST_SKIP() << "TETRA_BENCH_FULL=1 for the table";
  test::DeviceScratch sink(4), cyc(8 * 132 * 16 * 8);
  std::printf("\n| wgmmas per wait | warpgroups per SM | cycles per group (median block) |\n|---|---|---|\n");
  auto run = [&](auto kernel, int g, int per_sm) {
    const int blocks = 132 * per_sm;
    kernel<<<blocks, 128>>>(2000, sink.as<float>(), cyc.as<long long>());
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<long long> c(static_cast<size_t>(blocks), 0);
    TETRA_CUDA_CHECK(cudaMemcpy(c.data(), cyc.p, c.size() * 8, cudaMemcpyDeviceToHost));
    std::sort(c.begin(), c.end());
    std::printf("| %d | %d | %lld |\n", g, per_sm, c[c.size() / 2]);
    EXPECT_GT(c[c.size() / 2], 0);
  };
  for (int per_sm : {1, 4, 8}) {
    run(wgmma_rate<1>, 1, per_sm);
    run(wgmma_rate<2>, 2, per_sm);
    run(wgmma_rate<4>, 4, per_sm);
    run(wgmma_rate<8>, 8, per_sm);
  }
}

// One launch of each kernel on the o_proj shape, for Nsight Compute (TETRA_BENCH_PROFILE=1).
TEST(BenchGemvFp8Wgmma, Profile) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv("TETRA_BENCH_PROFILE") == nullptr) GTEST_SKIP() << "TETRA_BENCH_PROFILE=1";
  const HostMatrix m = random_matrix(4096, 12288, 7);
  const auto d = upload(m);
  const F8Weights f8(m);
  F8X dx(random_x(12288, 4, 0.0f));
  test::DeviceScratch dy(4096 * 2);
  for (int rep = 0; rep < 2; ++rep) {
    const oc::Nvfp4GemvOutput out{&d.view(), nullptr, dy.as<uint16_t>()};
    TETRA_CUDA_CHECK(oc::linear_nvfp4_gemv(&out, 1, dx.x.as<uint16_t>(), 1, nullptr));
    TETRA_CUDA_CHECK((launch_f8_stream<2, 4, 2, 16>(f8_args(f8, dx, dy.as<uint16_t>()), nullptr)));
    TETRA_CUDA_CHECK((launch_f8<8, 4>(f8_args(f8, dx, dy.as<uint16_t>()), nullptr)));
    TETRA_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

}  // namespace
}  // namespace tetra
