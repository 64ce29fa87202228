// Decode-size NVFP4 linears (M <= 8 rows; 9..64 go to nvfp4_small_m.cu) with several outputs in
// one launch (see linear_cuda.h, linear_nvfp4_gemv). One block per 16-row weight tile: its 8 warps
// split k, each issuing all the weight loads of a batch of up to 8 chunks (16 B + 2 scale bytes
// per lane per chunk) before the first MMA, then the warps' partial sums meet in shared memory and
// the epilogue applies alpha and the bias. Tiles of all outputs form one grid, so q/k/v cost one
// launch and the small k/v matrices ride in the same wave as q. Weights in the fragment order of
// moe/expert_weights.h, dequantized by the W4A16 helpers (ops/moe/w4a16_fragment.cuh).
// Second kernel, picked by Auto for few long tiles (o_proj): the persistent weight-streaming
// kernel of ops/moe/w4a16_stream.cuh (bulk copies into a shared-memory ring, one tile per block).
// Third, picked for more tiles than 3 blocks per SM (q/k/v): the persistent Rolling kernel, whose
// warps' 4-8 register slots roll from one tile into the block's next.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/kernel_launch.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/linear/linear_cuda.h"
#include "ops/linear/nvfp4_outputs_arg.h"
#include "ops/moe/w4a16_fragment.cuh"
#include "ops/moe/w4a16_stream.cuh"
#include "perf/block_stamps.cuh"

namespace tetra::ops::cuda {

namespace {

using moe_detail::kChunkK;
using moe_detail::kTileChunkBytes;
using moe_detail::kTileChunkScales;

constexpr int kWarps = 8;
constexpr int kBatch = 8;  // chunks whose loads a warp keeps in flight at once

struct GemvArgs : Nvfp4OutputsArg {
  int tile_end[kNvfp4GemvMaxOutputs];  // cumulative 16-row tile counts
  const uint16_t* x;                   // [M, k] bf16
  int m, k;
  unsigned long long* stamps = nullptr;  // perf/block_stamps.h (nullptr: none)
  int stamp_launch = 0;
  // The input's RMSNorm folded (moe/add_rms_norm_step.h NormFold; kernels built with kFold):
  // x is gx, each row's outputs are scaled by its inv_rms before the bf16 rounding.
  const float* fold_sums = nullptr;  // [m, fold_parts]
  int fold_parts = 0, fold_h = 0;
  float fold_eps = 0.0f;
};

// The fold's staging: thread i < m * fold_parts loads sums[i] once the kernel that writes them is
// complete (after griddepcontrol.wait) into fold_s[i] (shared memory, one value per thread).
__device__ __forceinline__ float load_fold_part(const GemvArgs& a) {
  return int(threadIdx.x) < a.m * a.fold_parts ? a.fold_sums[threadIdx.x] : 0.0f;
}
// Once per block, after every thread stored its staged sum: a barrier, then warp r < m adds row
// r's parts (lane j takes parts j, j + 32, ... in order, then a xor butterfly: the same bits in
// every lane and block; the host twin norm_fold_inv_rms) into inv_s[r], which the epilogue reads
// after its own barrier.
__device__ __forceinline__ void fold_inv_rms(const GemvArgs& a, const float* fold_s,
                                             float* inv_s) {
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < a.m) {
    float s = 0.0f;
    for (int p = lane; p < a.fold_parts; p += 32) s += fold_s[warp * a.fold_parts + p];
    for (int off = 16; off >= 1; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) inv_s[warp] = rsqrtf(s / float(a.fold_h) + a.fold_eps);
  }
}

// Tile u of the launch (all outputs' tiles in order) as output o's tile `tile`.
struct OutputTile {
  int o, tile;
};
__device__ __forceinline__ OutputTile output_tile(const GemvArgs& a, int u) {
  int o = 0;
  while (o + 1 < a.outputs && u >= a.tile_end[o]) ++o;
  return {o, u - (o > 0 ? a.tile_end[o - 1] : 0)};
}

// Output o's element (row, col) = y (bias included): stored as bf16, or with a residual
// residual <- bf16(bf16(y) + residual) (Nvfp4GemvOutput::residual). Returns the stored value.
__device__ __forceinline__ float store_output(const GemvArgs& a, int o, int row, int col, float y) {
  const size_t i = size_t(row) * a.n[o] + col;
  if (a.residual[o] == nullptr) {
    const uint16_t b = moe_detail::f32_to_bf16_bits(y);
    a.y[o][i] = b;
    return __bfloat162float(__ushort_as_bfloat16(b));
  }
  const float rounded = __bfloat162float(__float2bfloat16_rn(y));
  const float r = __bfloat162float(__ushort_as_bfloat16(a.residual[o][i]));
  const uint16_t b = moe_detail::f32_to_bf16_bits(rounded + r);
  a.residual[o][i] = b;
  return __bfloat162float(__ushort_as_bfloat16(b));
}


// One chunk: 4 k-steps of mma.m16n8k16 (16 weight rows x 8 activation rows).
__device__ __forceinline__ void chunk_mma(float (&acc)[4], const uint4& w, uint32_t sc,
                                          const uint16_t* xc) {
  const uint4 x0 = moe_detail::ld_cached_u4(xc);      // k 16t .. 16t+7
  const uint4 x1 = moe_detail::ld_cached_u4(xc + 8);  // k 16t+8 .. 16t+15
  uint32_t sg, sg8;
  moe_detail::scale_pair_to_bf16x2(sc, sg, sg8);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t A[4];
    moe_detail::dequant_word(moe_detail::word_of(w, j), sg, sg8, A);
    const uint4& xh = (j >> 1) ? x1 : x0;
    moe_detail::mma_bf16_16816(acc, A, (j & 1) ? xh.z : xh.x, (j & 1) ? xh.w : xh.y);
  }
}

// Batches of kBatch chunks, all loads of a batch issued before its first MMA. (Two register sets
// with the next half-batch in flight while one computes measured slower on the H200, even at
// o_proj's k = 12288: 15.5 vs 14.1 us at M = 1, bench/results/2026-11-30-decode-air-h200.md.)
__global__ void __launch_bounds__(kWarps * 32) nvfp4_gemv_kernel(const GemvArgs a) {
  __shared__ float red[kWarps][4][32];  // per-warp partial sums, lane fastest
  // The next kernel (RoPE + KV write, a norm) may be scheduled now; it waits for this grid.
  asm volatile("griddepcontrol.launch_dependents;");
  const auto [o, tile] = output_tile(a, int(blockIdx.x));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = a.k / kChunkK;
  const int c_begin = warp * chunks / kWarps, c_end = (warp + 1) * chunks / kWarps;
  const uint8_t* wp = a.w[o] + size_t(tile) * chunks * kTileChunkBytes + lane * 16;
  const uint8_t* sp = a.s[o] + size_t(tile) * chunks * kTileChunkScales + lane * 2;
  // This lane's activation row (MMA column g = lane / 4), at k = 16 * (lane % 4); rows past M
  // read row M - 1 and their results are dropped.
  const uint16_t* xp = a.x + size_t(min(lane / 4, a.m - 1)) * a.k + 16 * (lane % 4);
  // The epilogue's constants (alpha, this thread's bias element) are loaded now, so the epilogue
  // does not start with another memory round trip. Epilogue thread (r, l) writes column col.
  const int col = tile * 16 + lane / 4 + (warp % 4 >= 2 ? 8 : 0);
  const float alpha = a.alpha[o][0];
  const float bias = threadIdx.x < 128 && a.bias[o] != nullptr
                         ? __bfloat162float(__ushort_as_bfloat16(a.bias[o][col]))
                         : 0.0f;

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int c = c_begin; c < c_end; c += kBatch) {
    uint4 wv[kBatch];
    uint32_t sv[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (c + u < c_end) {
        wv[u] = moe_detail::ld_stream_u4(wp + size_t(c + u) * kTileChunkBytes);
        sv[u] = moe_detail::ld_stream_u16(sp + size_t(c + u) * kTileChunkScales);
      }
    // Launched as a programmatic dependent, the block starts while the kernel that writes x
    // still runs: the first weights are in flight when it waits for x (a no-op otherwise).
    if (c == c_begin) asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (c + u < c_end) chunk_mma(acc, wv[u], sv[u], xp + size_t(c + u) * kChunkK);
  }
  // Warps without chunks (k < 8 chunks) waited nowhere yet; y may still be read by the primary.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
  for (int r = 0; r < 4; ++r) red[warp][r][lane] = acc[r];
  __syncthreads();
  // Element (r, l): weight row 16 * tile + l/4 (+8 for r >= 2), activation row 2(l%4) + (r&1).
  if (threadIdx.x < 128) {
    const int r = threadIdx.x / 32, l = threadIdx.x % 32;
    const int row = 2 * (l % 4) + (r & 1);
    if (row < a.m) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red[w][r][l];
      // Rounded to bf16 before the bias, as the unfused linear + add_bias pair does.
      float y = __bfloat162float(__float2bfloat16_rn(sum * alpha));
      if (a.bias[o] != nullptr) y += bias;
      store_output(a, o, row, col, y);
    }
  }
}

// Persistent variant (Rolling): grid = 3 blocks per SM, block b takes tiles b, b + grid, ...; each
// warp's kBatch register slots roll from one batch to the next: right after chunk s of a batch is
// multiplied, slot s is reloaded with chunk s of the next batch (of this tile or the block's next
// tile), so a block's weight stream never stops at a tile boundary (the one-tile-per-block grid
// above runs its 2.3 waves of GLM-4.5-Air's q/k/v in lockstep, each wave paying a full memory
// latency at its start). S slots per warp, each warp's k range a whole number of S-chunk batches:
// nvfp4_gemv_rolling_shape(k) (S, and rolling_blocks_per_sm(S) blocks per SM).
// Blocks per SM of the Rolling grid with S register slots per warp: 4 slots fit 64 registers
// (4 blocks), 5..7 fit 80 (3 blocks). One rule for the kernel's register bound and the grid.
constexpr int rolling_blocks_per_sm(int slots) { return slots == 4 ? 4 : 3; }

template <int S, bool kFold>
__global__ void __launch_bounds__(kWarps * 32, rolling_blocks_per_sm(S))
    nvfp4_gemv_rolling_kernel(const GemvArgs a, int tiles) {
  // Per-warp partial sums, lane fastest, in two buffers used by alternate tiles: a warp writes
  // buffer b again two tiles later, after the barrier of the tile between, which the reducing
  // threads pass only once they have read b. So a tile costs one block barrier, not two (the
  // others' warps no longer wait for the reducing warps before rolling on).
  __shared__ float red[2][kWarps][4][32];
  __shared__ float fold_s[kFold ? kWarps * 32 : 1];  // the fold's staged sums
  __shared__ float inv_s[kFold ? kWarps : 1];        // and each row's inv_rms
  const uint64_t t_start = perf::stamp_time();
  asm volatile("griddepcontrol.launch_dependents;");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = a.k / kChunkK, cpw = chunks / kWarps, nb = cpw / S;
  int buf = 0;
  const uint16_t* xp = a.x + size_t(min(lane / 4, a.m - 1)) * a.k + 16 * (lane % 4) +
                       size_t(warp) * cpw * kChunkK;
  // This lane's weight and scale pointers at chunk 0 of its k range in tile u.
  auto tile_ptrs = [&](int u, const uint8_t*& wp, const uint8_t*& sp) {
    const auto [o, tile] = output_tile(a, u);
    const size_t c0 = size_t(tile) * chunks + size_t(warp) * cpw;
    wp = a.w[o] + c0 * kTileChunkBytes + lane * 16;
    sp = a.s[o] + c0 * kTileChunkScales + lane * 2;
  };
  uint4 wv[S];
  uint32_t sv[S];
  int u = blockIdx.x, b = 0;  // the batch in the slots: batch b of tile u
  const uint8_t *wp, *sp;
  tile_ptrs(u, wp, sp);
#pragma unroll
  for (int s = 0; s < S; ++s) {
    wv[s] = moe_detail::ld_stream_u4(wp + size_t(s) * kTileChunkBytes);
    sv[s] = moe_detail::ld_stream_u16(sp + size_t(s) * kTileChunkScales);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const uint64_t t_waited = perf::stamp_time();
  float fold_part = kFold ? load_fold_part(a) : 0.0f;  // staged with the first tile's sums
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  while (u < tiles) {
    // The next batch: of this tile, or batch 0 of the block's next tile (none past the end).
    int nu = u, nbi = b + 1;
    const uint8_t *nwp = wp, *nsp = sp;
    if (nbi == nb) {
      nu += gridDim.x, nbi = 0;
      if (nu < tiles) tile_ptrs(nu, nwp, nsp);
    }
    const bool more = nu < tiles;
    const size_t nc = size_t(nbi) * S;
    const uint16_t* xc = xp + size_t(b) * S * kChunkK;
#pragma unroll
    for (int s = 0; s < S; ++s) {
      chunk_mma(acc, wv[s], sv[s], xc + s * kChunkK);
      if (more) {
        wv[s] = moe_detail::ld_stream_u4(nwp + (nc + s) * kTileChunkBytes);
        sv[s] = moe_detail::ld_stream_u16(nsp + (nc + s) * kTileChunkScales);
      }
    }
    if (nbi == 0) {  // tile u is complete: reduce over the warps and store
#pragma unroll
      for (int r = 0; r < 4; ++r) red[buf][warp][r][lane] = acc[r], acc[r] = 0.0f;
      if (kFold && u == int(blockIdx.x)) {  // the block's first tile (uniform in the block)
        fold_s[threadIdx.x] = fold_part;
        fold_inv_rms(a, fold_s, inv_s);
      }
      __syncthreads();
      if (threadIdx.x < 128) {
        const auto [o, tile] = output_tile(a, u);
        const int r = threadIdx.x / 32, l = threadIdx.x % 32;
        const int row = 2 * (l % 4) + (r & 1);
        const int col = tile * 16 + l / 4 + (r >= 2 ? 8 : 0);
        if (row < a.m) {
          float sum = 0.0f;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) sum += red[buf][w][r][l];
          const float scale = kFold ? a.alpha[o][0] * inv_s[row] : a.alpha[o][0];
          float y = __bfloat162float(__float2bfloat16_rn(sum * scale));
          if (a.bias[o] != nullptr) y += __bfloat162float(__ushort_as_bfloat16(a.bias[o][col]));
          store_output(a, o, row, col, y);
        }
      }
      buf ^= 1;
    }
    u = nu, b = nbi, wp = nwp, sp = nsp;
  }
  // Stamps: start, wait returned, end.
  if (threadIdx.x == 0)
    perf::block_stamp(a.stamps, perf::kStampQkvGemv, a.stamp_launch, t_start, t_waited,
                      perf::stamp_time());
}

// The router fold's h: the 16 values of this block's tile of the new residual row, as stored,
// and g * h.
__shared__ float g_fold_h[moe::kRouterFoldTile];
__shared__ __align__(16) float g_fold_gh[moe::kRouterFoldTile];

// The streaming kernel's view of the same outputs: a unit is one 16-row tile of one output.
struct DenseStreamWork {
  static constexpr int kTilesPerUnit = 1;
  GemvArgs a;
  int total_units, chunks;
  const uint16_t* x;  // [M, k] bf16 (= a.x)

  // perf/block_stamps.h: the launch's stamp buffer (nullptr: none) and number.
  __device__ unsigned long long* stamps() const { return a.stamps; }
  __device__ int stamp_launch() const { return a.stamp_launch; }

  struct Unit {
    const uint8_t* w;
    const uint8_t* s;
    int rows;  // M
    int o, tile;
    float alpha;  // loaded with the unit, so the store at its end waits for no load
  };
  __device__ Unit unit(int u) const {
    const auto [o, tile] = output_tile(a, u);
    return {a.w[o] + size_t(tile) * chunks * kTileChunkBytes,
            a.s[o] + size_t(tile) * chunks * kTileChunkScales, a.m, o, tile, a.alpha[o][0]};
  }

  __device__ const uint16_t* x_row(const Unit&, int row) const { return x + size_t(row) * a.k; }
  // Stores the element and returns it as stored.
  __device__ float stored(const Unit& un, int row, int col, const float (&v)[1]) const {
    const int n = un.tile * 16 + col;
    // Rounded to bf16 before the bias, as the unfused linear + add_bias pair does.
    float y = __bfloat162float(__float2bfloat16_rn(v[0] * un.alpha));
    if (a.bias[un.o] != nullptr) y += __bfloat162float(__ushort_as_bfloat16(a.bias[un.o][n]));
    return store_output(a, un.o, row, n, y);
  }
  __device__ void store(const Unit& un, int row, int col, const float (&v)[1]) const {
    stored(un, row, col, v);
  }
};

// The same over gx with the input norm folded (NormFold): every element scaled by its row's
// inv_rms. Auto gives this kernel few tiles (tiny q/k/v, whose H and part counts are small), so
// the element's store adds its row's sums from global memory itself, in part order (after the
// unit's multiplies, which waited for the kernel that wrote them). Its own kernel instance.
struct DenseNormFoldStreamWork : DenseStreamWork {
  __device__ void store(const Unit& un, int row, int col, const float (&v)[1]) const {
    float s = 0.0f;
    for (int p = 0; p < a.fold_parts; ++p) s += a.fold_sums[row * a.fold_parts + p];
    const float scaled[1] = {v[0] * rsqrtf(s / float(a.fold_h) + a.fold_eps)};
    stored(un, row, col, scaled);
  }
};

// The same with the router fold (moe/router_fold.h) as the unit epilogue: one output, one row,
// one tile per block. Its own kernel instance, so the plain o_proj keeps its register count.
struct DenseFoldStreamWork : DenseStreamWork {
  moe::RouterFold fold;

  __device__ void store(const Unit& un, int row, int col, const float (&v)[1]) const {
    g_fold_h[col] = stored(un, row, col, v);
  }
  // The unit epilogue of w4a16_stream.cuh: the tile's part of fold.tiles, staged in shared memory
  // while the weights stream (unit u is tile u: one output). Read through the L2 instead, the
  // step was 0.4% slower (bench/results/2026-12-04-session50-h200.md).
  __host__ __device__ int fold_bytes() const { return int(moe::router_fold_tile_bytes(fold.E)); }
  __device__ const void* fold_src(int u) const {
    return fold.tiles + size_t(u) * moe::router_fold_tile_bytes(fold.E);
  }
  __device__ void fold_unit(const Unit& un, const void* staged, int tid) const;
};

// Thread tid of 128: gx for row tid < 16, the tile's sum of squares (tid 16), and the logit
// partials of experts tid, tid + 128, into copy blockIdx.x % copies of the sums
// (moe/router_fold.h; the host twin router_fold_sums).
__device__ void DenseFoldStreamWork::fold_unit(const Unit& un, const void* staged,
                                               int tid) const {
  constexpr int kT = moe::kRouterFoldTile;
  const uint16_t* g = static_cast<const uint16_t*>(staged);  // [16]
  const uint4* w = reinterpret_cast<const uint4*>(g + kT);   // [E][16] bf16: 2 x 16 B per expert
  double* sums = fold.sums + size_t(blockIdx.x % fold.copies) * (fold.E + 1);
  if (tid < kT) {
    const float gh = __bfloat162float(__ushort_as_bfloat16(g[tid])) * g_fold_h[tid];
    g_fold_gh[tid] = gh;
    fold.gx[un.tile * kT + tid] = moe_detail::f32_to_bf16_bits(gh);
  } else if (tid == kT) {
    float ss = 0.0f;
    for (int j = 0; j < kT; ++j) ss = fmaf(g_fold_h[j], g_fold_h[j], ss);
    atomicAdd(sums + fold.E, double(ss));
  }
  asm volatile("bar.sync 2, 128;" ::: "memory");  // g_fold_gh
  const float4* gh4 = reinterpret_cast<const float4*>(g_fold_gh);
  for (int e = tid; e < fold.E; e += 128) {
    float p = 0.0f;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const uint4 wq = w[2 * e + q];
      const float4 a = gh4[2 * q], b = gh4[2 * q + 1];
      p = fmaf(__uint_as_float(wq.x << 16), a.x, p);
      p = fmaf(__uint_as_float(wq.x & 0xffff0000u), a.y, p);
      p = fmaf(__uint_as_float(wq.y << 16), a.z, p);
      p = fmaf(__uint_as_float(wq.y & 0xffff0000u), a.w, p);
      p = fmaf(__uint_as_float(wq.z << 16), b.x, p);
      p = fmaf(__uint_as_float(wq.z & 0xffff0000u), b.y, p);
      p = fmaf(__uint_as_float(wq.w << 16), b.z, p);
      p = fmaf(__uint_as_float(wq.w & 0xffff0000u), b.w, p);
    }
    atomicAdd(sums + e, double(p));
  }
}

// C consumer warps, J chunks per warp per stage, MODE a benchmark diagnostic (w4a16_stream.cuh).
template <int C, int J, int MODE = moe_detail::kStreamFull>
cudaError_t launch_dense_stream(const DenseStreamWork& w, const Nvfp4GemvStreamConfig& c,
                                cudaStream_t stream) {
  return moe_detail::launch_stream_work<DenseStreamWork, C, J, MODE>(w, c.stages, c.blocks_per_sm,
                                                                     true, stream);
}

}  // namespace

Nvfp4GemvRollingShape nvfp4_gemv_rolling_shape(int k) {
  if (k <= 0 || k % (kChunkK * kWarps) != 0) return {};
  const int per_warp = k / (kChunkK * kWarps);
  if (per_warp % 4 == 0) return {4, rolling_blocks_per_sm(4)};
  for (int s = 7; s >= 5; --s)
    if (per_warp % s == 0) return {s, rolling_blocks_per_sm(s)};
  return {};
}

std::string nvfp4_gemv_unsupported_reason(const Nvfp4GemvOutput* outs, int n_outs, int M) {
  for (int i = 0; i < n_outs; ++i)
    if (outs[i].residual != nullptr && M > kNvfp4GemvKernelRows)
      return str("output ", i, ": a residual add at M=", M, " (the GEMV kernels take it up to ",
                 kNvfp4GemvKernelRows, " rows)");
  if (M > kNvfp4GemvKernelRows && M <= kNvfp4GemvMaxRows) {
    if (n_outs >= 1 && outs[0].w != nullptr && outs[0].w->k > kNvfp4SmallMGemvMaxK)
      return str("k ", outs[0].w->k, " at M=", M, " (the small-M kernel takes k <= ",
                 kNvfp4SmallMGemvMaxK, " here; slower than linear_nvfp4 beyond)");
    return nvfp4_small_m_unsupported_reason(outs, n_outs, M);
  }
  if (M < 1 || M > kNvfp4GemvMaxRows)
    return str("M=", M, " (the NVFP4 GEMV takes 1..", kNvfp4GemvMaxRows, " rows)");
  return outputs_shape_reason(outs, n_outs);
}

std::string nvfp4_gemv_router_fold_unsupported_reason(const Nvfp4GemvOutput& out, int M,
                                                      const moe::RouterFold& f) {
  if (M != 1) return str("M=", M, " (one row only)");
  if (out.residual == nullptr) return "no residual add (h is the residual row)";
  const std::string why = nvfp4_gemv_unsupported_reason(&out, 1, M);
  if (!why.empty()) return why;
  const Nvfp4GemvStreamConfig c{};
  if (out.w->n / 16 > c.blocks_per_sm * current_device_sm_count())
    return str(out.w->n / 16, " tiles: more than one per block of the streaming kernel");
  if (f.E < 1 || f.E > moe::kRouterFoldMaxExperts)
    return str("E=", f.E, " (1..", moe::kRouterFoldMaxExperts, ")");
  if (f.tiles == nullptr || f.gx == nullptr || f.sums == nullptr) return "fold buffers missing";
  if (f.copies < 1 || f.copies > moe::kRouterFoldMaxCopies) return str(f.copies, " copies");
  if (reinterpret_cast<uintptr_t>(f.tiles) % 16 != 0) return "fold tiles not 16-byte aligned";
  return "";
}

cudaError_t linear_nvfp4_gemv_router_fold(const Nvfp4GemvOutput& out, const uint16_t* x,
                                          const moe::RouterFold& f, cudaStream_t stream) {
  const std::string why = nvfp4_gemv_router_fold_unsupported_reason(out, 1, f);
  if (!why.empty()) TETRA_FAIL("NVFP4 GEMV with the router fold: ", why);
  GemvArgs a{};
  static_cast<Nvfp4OutputsArg&>(a) = outputs_arg(&out, 1, "NVFP4 GEMV");
  a.tile_end[0] = a.n[0] / 16;
  a.x = x;
  a.m = 1;
  a.k = out.w->k;
  a.stamps = perf::block_stamp_buffer();
  if (a.stamps) a.stamp_launch = perf::next_block_stamp_launch();
  TETRA_CHECK(reinterpret_cast<uintptr_t>(a.w[0]) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(a.s[0]) % 16 == 0,
              "NVFP4 GEMV: weights or scales not 16-byte aligned");
  const DenseFoldStreamWork work{{a, a.tile_end[0], a.k / kChunkK, x}, f};
  const Nvfp4GemvStreamConfig c{};
  return moe_detail::launch_stream_work<DenseFoldStreamWork, 16, 1, moe_detail::kStreamFull>(
      work, c.stages, c.blocks_per_sm, true, stream);
}

namespace {

template <bool kFold>
cudaError_t launch_rolling(const KernelLaunch& launch, const GemvArgs& a, int tiles, int slots) {
  switch (slots) {
    case 4: return launch(nvfp4_gemv_rolling_kernel<4, kFold>, a, tiles);
    case 5: return launch(nvfp4_gemv_rolling_kernel<5, kFold>, a, tiles);
    case 6: return launch(nvfp4_gemv_rolling_kernel<6, kFold>, a, tiles);
    case 7: return launch(nvfp4_gemv_rolling_kernel<7, kFold>, a, tiles);
    default: return cudaErrorInvalidValue;
  }
}

// Auto's kernel for `tiles` 16-row tiles of k. The streaming kernel (two blocks of 16 consumer
// warps per SM) when every block of its grid gets at most one tile, i.e. few long tiles (Air
// o_proj: 256 tiles of k = 12288, 11.5 vs 14.1 us at M = 1, 12.2 vs 16.0 at M = 8, H200
// graph-timed); with several tiles per block it lost (Air q/k/v, 896 tiles: 16.5 vs 13.5 us).
// bench/results/2026-11-30-stream-gemv-h200.md. Otherwise the Rolling kernel where its grid is
// too small for one tile per block (so blocks roll into further tiles) and k allows: batch 1
// decode GLM-4.5-Air (896 tiles, then 8 slots at 3 blocks per SM) -2.2..-3.3% per step
// (bench/results/2026-12-01-session16-h200.md), -1% more at 4 slots and 4 blocks per SM (session
// 21), GLM-4.7 (896 tiles, 5 slots) -2.6%; with fewer tiles than its grid (Qwen3-30B-A3B, 320)
// it was +2.5% against Batched (bench/results/2026-12-01-session17-h200.md). Else Batched.
Nvfp4GemvKernel auto_gemv_kernel(int tiles, int k) {
  const Nvfp4GemvRollingShape rolling = nvfp4_gemv_rolling_shape(k);
  const int sms = current_device_sm_count();
  if (tiles <= Nvfp4GemvStreamConfig{}.blocks_per_sm * sms) return Nvfp4GemvKernel::Stream;
  if (rolling.slots > 0 && tiles > rolling.blocks_per_sm * sms) return Nvfp4GemvKernel::Rolling;
  return Nvfp4GemvKernel::Batched;
}

int total_tiles(const Nvfp4GemvOutput* outs, int n_outs) {
  int tiles = 0;
  for (int i = 0; i < n_outs; ++i) tiles += outs[i].w->n / 16;
  return tiles;
}

// linear_nvfp4_gemv up to kNvfp4GemvKernelRows rows; with `fold` (checked by the caller) the
// input norm folded, on the Rolling or the streaming kernel (the Batched kernel's register budget
// had no room for it).
cudaError_t run_gemv(const Nvfp4GemvOutput* outs, int n_outs, const uint16_t* x, int M,
                     cudaStream_t stream, Nvfp4GemvKernel kernel,
                     const Nvfp4GemvStreamConfig* stream_cfg, const moe::NormFold* fold) {
  GemvArgs a{};
  static_cast<Nvfp4OutputsArg&>(a) = outputs_arg(outs, n_outs, "NVFP4 GEMV");
  int tiles = 0;
  for (int i = 0; i < n_outs; ++i) {
    tiles += a.n[i] / 16;
    a.tile_end[i] = tiles;
  }
  a.x = x;
  a.m = M;
  a.k = outs[0].w->k;
  a.stamps = perf::block_stamp_buffer();
  if (a.stamps) a.stamp_launch = perf::next_block_stamp_launch();
  if (fold) {
    a.fold_sums = fold->sums;
    a.fold_parts = fold->parts;
    a.fold_h = fold->H;
    a.fold_eps = fold->eps;
  }
  const Nvfp4GemvRollingShape rolling = nvfp4_gemv_rolling_shape(a.k);
  const int sms = current_device_sm_count();
  if (kernel == Nvfp4GemvKernel::Auto) kernel = auto_gemv_kernel(tiles, a.k);
  if (fold && (kernel == Nvfp4GemvKernel::Batched ||
               (kernel == Nvfp4GemvKernel::Rolling && rolling.slots == 0)))
    TETRA_FAIL("NVFP4 GEMV: the folded input norm runs on the Rolling and streaming kernels");
  if (kernel == Nvfp4GemvKernel::Rolling) {
    const int grid = std::min(tiles, rolling.blocks_per_sm * sms);
    const KernelLaunch launch(dim3(unsigned(grid)), dim3(kWarps * 32), stream);
    return fold ? launch_rolling<true>(launch, a, tiles, rolling.slots)
                : launch_rolling<false>(launch, a, tiles, rolling.slots);
  }
  if (kernel == Nvfp4GemvKernel::Stream) {
    for (int i = 0; i < n_outs; ++i)
      TETRA_CHECK(reinterpret_cast<uintptr_t>(a.w[i]) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.s[i]) % 16 == 0,
                  "NVFP4 GEMV output ", i, ": weights or scales not 16-byte aligned");
    const Nvfp4GemvStreamConfig c = stream_cfg ? *stream_cfg : Nvfp4GemvStreamConfig{};
    const DenseStreamWork work{a, tiles, a.k / kChunkK, x};
    if (fold)
      return moe_detail::launch_stream_work<DenseNormFoldStreamWork, 16, 1, moe_detail::kStreamFull>(
          DenseNormFoldStreamWork{work}, c.stages, c.blocks_per_sm, true, stream);
    switch (c.consumer_warps * 100 + c.chunks_per_warp * 10 + c.mode) {
      case 420: return launch_dense_stream<4, 2>(work, c, stream);
      case 820: return launch_dense_stream<8, 2>(work, c, stream);
      case 1610: return launch_dense_stream<16, 1>(work, c, stream);
      case 821: return launch_dense_stream<8, 2, moe_detail::kStreamCopyOnly>(work, c, stream);
      case 822: return launch_dense_stream<8, 2, moe_detail::kStreamNoX>(work, c, stream);
      default: break;
    }
    return cudaErrorInvalidValue;
  }
  // Programmatic dependent launch: this grid may begin before the previous kernel in the stream
  // ends (the kernel waits for it before reading x), overlapping the weight stream with its tail.
  const KernelLaunch launch(dim3(unsigned(tiles)), dim3(kWarps * 32), stream);
  return launch(nvfp4_gemv_kernel, a);
}

}  // namespace

cudaError_t linear_nvfp4_gemv(const Nvfp4GemvOutput* outs, int n_outs, const uint16_t* x, int M,
                              cudaStream_t stream, Nvfp4GemvKernel kernel,
                              const Nvfp4GemvStreamConfig* stream_cfg) {
  const std::string why = nvfp4_gemv_unsupported_reason(outs, n_outs, M);
  if (!why.empty()) TETRA_FAIL("NVFP4 GEMV: ", why);
  // 9..64 rows: x staged in shared memory once per block and reused by its weight tiles
  // (nvfp4_small_m.cu); the kernels below read x per tile, which pays off only up to 8 rows.
  if (M > kNvfp4GemvKernelRows) return linear_nvfp4_small_m(outs, n_outs, x, M, stream, nullptr);
  return run_gemv(outs, n_outs, x, M, stream, kernel, stream_cfg, nullptr);
}

std::string nvfp4_gemv_norm_folded_unsupported_reason(const Nvfp4GemvOutput* outs, int n_outs,
                                                      int M, const moe::NormFold& f) {
  if (M < 1 || M > kNvfp4GemvKernelRows)
    return str("M=", M, " (the folded norm takes 1..", kNvfp4GemvKernelRows, " rows)");
  const std::string why = nvfp4_gemv_unsupported_reason(outs, n_outs, M);
  if (!why.empty()) return why;
  for (int i = 0; i < n_outs; ++i)
    if (outs[i].residual != nullptr) return str("output ", i, ": a residual add");
  if (f.sums == nullptr) return "no sums";
  static_assert(moe::kNormFoldMaxSums == kWarps * 32, "one staged sum per thread");
  if (f.parts < 1 || M * f.parts > moe::kNormFoldMaxSums)
    return str(f.parts, " parts at M=", M);
  if (f.H != outs[0].w->k) return str("H ", f.H, " != k ", outs[0].w->k);
  const int tiles = total_tiles(outs, n_outs);
  if (auto_gemv_kernel(tiles, f.H) == Nvfp4GemvKernel::Batched)
    return str(tiles, " tiles of k ", f.H,
               ": the Batched kernel's (it has no fold)");
  return "";
}

cudaError_t linear_nvfp4_gemv_norm_folded(const Nvfp4GemvOutput* outs, int n_outs,
                                          const uint16_t* gx, int M, const moe::NormFold& f,
                                          cudaStream_t stream, Nvfp4GemvKernel kernel) {
  const std::string why = nvfp4_gemv_norm_folded_unsupported_reason(outs, n_outs, M, f);
  if (!why.empty()) TETRA_FAIL("NVFP4 GEMV with the folded norm: ", why);
  return run_gemv(outs, n_outs, gx, M, stream, kernel, nullptr, &f);
}

}  // namespace tetra::ops::cuda
