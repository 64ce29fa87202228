// NVFP4 linears at 9..64 activation rows (decode batches 16..64), several outputs over the same x
// in one launch (linear_cuda.h: linear_nvfp4_small_m; linear_nvfp4_gemv dispatches here for
// M > kNvfp4GemvKernelRows and k <= kNvfp4SmallMGemvMaxK).
//
// Why not the M <= 8 GEMV or the one-expert decode kernel: at 64 rows x is 512 KB (q/k/v), more
// than L1, and a kernel whose warps each re-read x from L2 for every weight tile moves ~15x the
// weight bytes through L2. Here x is read from L2 once per block and reused from shared memory by
// every weight tile of the block.
//
// Shape: a "group" is 8 warps x TW 16-row weight tiles of one output (TW = 1 or 2: 128 or 256
// rows). A thread-block cluster of S blocks (S = 1, 2, 4, 8) shares one group and splits its
// K/64 chunks: rank r takes chunks [r*C/S, (r+1)*C/S). Each block
//   1. issues its first batch of weight loads (8 x 16 B per lane, straight into registers) and
//      asks the copy engine to pull the rest of its weight range into L2, all before
//      griddepcontrol.wait (weights do not depend on the previous kernel; under PDL this overlaps
//      its tail),
//   2. stages x[0..8T)[its k range] (rows >= M zero-filled) in shared memory with cp.async,
//   3. per chunk: each warp takes its TW weight words (16 B per lane) from registers, dequantizes
//      each k-step once and runs it against the T n8 token tiles read from shared memory
//      (mma.m16n8k16, fp32 accumulators [TW][T][4] per lane),
//   4. writes its fp32 partial [rows][8T] to its own shared memory; after cluster.sync rank r sums
//      rows [r*rows/S, (r+1)*rows/S) over the S partials in rank order 0..S-1 (distributed shared
//      memory; deterministic, no atomics) and applies y = bf16(bf16(acc * alpha) + bias).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/kernel_smem_attr.h"
#include "ops/linear/linear_cuda.h"
#include "ops/linear/nvfp4_outputs_arg.h"
#include "ops/moe/w4a16_fragment.cuh"

namespace tetra::ops::cuda {

namespace {

namespace cg = cooperative_groups;
using moe_detail::kChunkK;
using moe_detail::kTileChunkBytes;
using moe_detail::kTileChunkScales;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Chunks per tile whose register loads a warp issues together (one batch = 8 x 16 B per lane).
template <int TW>
constexpr int kBatchOf = 8 / TW;
constexpr int kMaxSplit = 8;    // portable cluster size
constexpr int kSmemLimit = 227 * 1024;  // sm_90 opt-in shared memory per block

struct SmallMArgs : Nvfp4OutputsArg {
  int group_end[kNvfp4GemvMaxOutputs];  // cumulative group counts
  const uint16_t* x;                    // [M, k] bf16
  int m, k;
  int split;  // S, the cluster size along k
};

// Shared-memory row stride of the x slice, in bf16: 16 bytes of padding put the 8 rows a
// quarter-warp reads (lane/4) on different banks for its 16-byte loads (row bytes % 128 == 16).
__host__ __device__ constexpr int x_stride(int chunks) { return chunks * kChunkK + 8; }
// fp32 partial [rows][8T + 1]: the +1 spreads the reduction's row-fastest reads over the banks.
__host__ __device__ constexpr int part_stride(int token_tiles) { return token_tiles * 8 + 1; }

int smem_bytes(int token_tiles, int tiles_per_warp, int max_chunks) {
  const int xs = token_tiles * 8 * x_stride(max_chunks) * 2;
  const int part = kWarps * tiles_per_warp * 16 * part_stride(token_tiles) * 4;
  return std::max(xs, part);
}


// T n8 token tiles (8T >= M), TW 16-row weight tiles per warp.
template <int T, int TW>
__global__ void __launch_bounds__(kThreads, TW == 1 ? 2 : 1) nvfp4_small_m_kernel(const SmallMArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  // The next kernel may be scheduled now; it waits for this grid before reading y.
  asm volatile("griddepcontrol.launch_dependents;");
  cg::cluster_group cluster = cg::this_cluster();
  constexpr int kRows = kWarps * TW * 16;  // weight rows per group
  const int S = a.split;
  const int rank = int(cluster.block_rank());
  const int group = int(blockIdx.x) / S;
  int o = 0;
  while (o + 1 < a.outputs && group >= a.group_end[o]) ++o;
  const int group_in_o = group - (o > 0 ? a.group_end[o - 1] : 0);
  const int chunks = a.k / kChunkK;
  const int c0 = rank * chunks / S, nc = (rank + 1) * chunks / S - c0;  // this block's chunks
  const int stride = x_stride(nc);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tiles_o = a.n[o] / 16;

  // This warp's tiles; tiles past n (the last group of an output) read the last real tile and
  // their results are dropped in the epilogue.
  constexpr int kB = kBatchOf<TW>;
  const uint8_t* wp[TW];
  const uint8_t* sp[TW];
#pragma unroll
  for (int tw = 0; tw < TW; ++tw) {
    const int tile = min(group_in_o * kWarps * TW + warp * TW + tw, tiles_o - 1);
    const size_t first = size_t(tile) * chunks + c0;
    wp[tw] = a.w[o] + first * kTileChunkBytes;
    sp[tw] = a.s[o] + first * kTileChunkScales;
    // Chunks past the first batch: the copy engine pulls them into L2 now (no registers), so
    // the later batches' register loads hit L2 instead of paying an HBM round trip each.
    if (nc > kB && lane == 0)
      moe_detail::prefetch_l2_bulk(wp[tw] + kB * kTileChunkBytes, uint32_t(nc - kB) * kTileChunkBytes);
    if (nc > kB && lane == 1)
      moe_detail::prefetch_l2_bulk(sp[tw] + kB * kTileChunkScales, uint32_t(nc - kB) * kTileChunkScales);
    wp[tw] += lane * 16;
    sp[tw] += lane * 2;
  }
  uint4 wv[TW][kB];      // one batch of weight words, [tile][chunk]
  uint32_t sv[TW][kB];   // its scale pairs
  auto load = [&](int c) {
#pragma unroll
    for (int u = 0; u < kB; ++u)
#pragma unroll
      for (int tw = 0; tw < TW; ++tw)
        if (c + u < nc) {
          wv[tw][u] = moe_detail::ld_stream_u4(wp[tw] + size_t(c + u) * kTileChunkBytes);
          sv[tw][u] = moe_detail::ld_stream_u16(sp[tw] + size_t(c + u) * kTileChunkScales);
        }
  };
  // The first batch is in flight before the wait: weights do not depend on the previous kernel.
  load(0);

  // x is written by the previous kernel in the stream.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem);  // [8T][stride] bf16, rows >= M zero
  {
    const int per_row = nc * (kChunkK / 8);  // 16-byte vectors per row
    for (int i = threadIdx.x; i < T * 8 * per_row; i += kThreads) {
      const int row = i / per_row, v = i % per_row;
      const bool live = row < a.m;
      const uint16_t* src = a.x + size_t(live ? row : 0) * a.k + size_t(c0) * kChunkK + v * 8;
      moe_detail::cp_async_16(xs + row * stride + v * 8, src, live ? 16 : 0);
    }
    moe_detail::cp_async_commit();
    moe_detail::cp_async_wait<0>();
  }
  __syncthreads();

  float acc[TW][T][4];
#pragma unroll
  for (int tw = 0; tw < TW; ++tw)
#pragma unroll
    for (int tt = 0; tt < T; ++tt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[tw][tt][r] = 0.0f;

  // This lane's B fragments: token row g = lane / 4 of each token tile, k = 16 * (lane % 4).
  const uint16_t* xl = xs + (lane / 4) * stride + 16 * (lane % 4);
  for (int c = 0; c < nc; c += kB) {
    if (c > 0) load(c);
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      if (c + u >= nc) break;
      uint32_t A[TW][4][4];  // [tile][k-step][mma A registers]
#pragma unroll
      for (int tw = 0; tw < TW; ++tw) {
        uint32_t sg, sg8;
        moe_detail::scale_pair_to_bf16x2(sv[tw][u], sg, sg8);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          moe_detail::dequant_word(moe_detail::word_of(wv[tw][u], j), sg, sg8, A[tw][j]);
      }
      const uint16_t* xc = xl + (c + u) * kChunkK;
#pragma unroll
      for (int tt = 0; tt < T; ++tt) {
        const uint4 x0 = *reinterpret_cast<const uint4*>(xc + tt * 8 * stride);      // k 16t..+7
        const uint4 x1 = *reinterpret_cast<const uint4*>(xc + tt * 8 * stride + 8);  // +8..+15
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint4& xh = (j >> 1) ? x1 : x0;
          const uint32_t b0 = (j & 1) ? xh.z : xh.x, b1 = (j & 1) ? xh.w : xh.y;
#pragma unroll
          for (int tw = 0; tw < TW; ++tw) moe_detail::mma_bf16_16816(acc[tw][tt], A[tw][j], b0, b1);
        }
      }
    }
  }

  // Partials over the x slice (every warp is done reading it).
  __syncthreads();
  float* part = reinterpret_cast<float*>(smem);  // [kRows][part_stride(T)] fp32
  constexpr int ps = part_stride(T);
#pragma unroll
  for (int tw = 0; tw < TW; ++tw)
#pragma unroll
    for (int tt = 0; tt < T; ++tt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        // C fragment: weight row lane/4 (+8 for r >= 2), token 2 * (lane % 4) + (r & 1).
        const int row = (warp * TW + tw) * 16 + lane / 4 + (r >= 2 ? 8 : 0);
        part[row * ps + tt * 8 + 2 * (lane % 4) + (r & 1)] = acc[tw][tt][r];
      }
  cluster.sync();  // every rank's partial is written and visible to the cluster
  const int share = kRows / S;
  const float alpha = a.alpha[o][0];
  const uint16_t* bias = a.bias[o];
  for (int i = threadIdx.x; i < share * a.m; i += kThreads) {
    const int row = rank * share + i % share, token = i / share;
    const int col = group_in_o * kRows + row;
    if (col >= a.n[o]) continue;
    // All S remote loads issued before the first add (unrolled), summed in rank order.
    float v[kMaxSplit];
#pragma unroll
    for (int r = 0; r < kMaxSplit; ++r)
      v[r] = r < S ? cluster.map_shared_rank(part, r)[row * ps + token] : 0.0f;
    float sum = v[0];
#pragma unroll
    for (int r = 1; r < kMaxSplit; ++r)
      if (r < S) sum += v[r];
    // Rounded to bf16 before the bias, as the unfused linear + add_bias pair does.
    float y = __bfloat162float(__float2bfloat16_rn(sum * alpha));
    if (bias != nullptr) y += __bfloat162float(__ushort_as_bfloat16(bias[col]));
    a.y[o][size_t(token) * a.n[o] + col] = moe_detail::f32_to_bf16_bits(y);
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
}

template <int T, int TW>
cudaError_t launch_small_m(const SmallMArgs& a, int groups, int smem, cudaStream_t stream) {
  constexpr auto kernel = nvfp4_small_m_kernel<T, TW>;
  cudaError_t err = ensure_max_dynamic_smem<kernel>(kSmemLimit);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr[2] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(a.split);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  // Programmatic dependent launch: the weight prefetch overlaps the previous kernel's tail.
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(groups * a.split));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, kernel, a);
}

template <int TW>
cudaError_t launch_tw(const SmallMArgs& a, int token_tiles, int groups, int smem, cudaStream_t s) {
  switch (token_tiles) {
    case 1: return launch_small_m<1, TW>(a, groups, smem, s);
    case 2: return launch_small_m<2, TW>(a, groups, smem, s);
    case 3: return launch_small_m<3, TW>(a, groups, smem, s);
    case 4: return launch_small_m<4, TW>(a, groups, smem, s);
    case 5: return launch_small_m<5, TW>(a, groups, smem, s);
    case 6: return launch_small_m<6, TW>(a, groups, smem, s);
    case 7: return launch_small_m<7, TW>(a, groups, smem, s);
    case 8: return launch_small_m<8, TW>(a, groups, smem, s);
    default: return cudaErrorInvalidValue;
  }
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The configuration a call runs with: explicit fields of cfg win, 0 = chosen here.
struct Plan {
  int tiles_per_warp = 2, split = 1, groups = 0, smem = 0;
  std::string why_not;  // non-empty: cannot run
};

Plan plan_for(const Nvfp4GemvOutput* outs, int n_outs, int M, const Nvfp4SmallMConfig& cfg) {
  Plan p;
  const int chunks = outs[0].w->k / kChunkK, T = ceil_div(M, 8);
  // Auto, measured on the H200 for GLM-4.5-Air q/k/v (bench/results/2026-11-30-small-m-linear-
  // h200.md): 128 rows per block up to 16 rows of x, 256 above (x staged half as often).
  p.tiles_per_warp = cfg.tiles_per_warp != 0 ? cfg.tiles_per_warp : (M <= 16 ? 1 : 2);
  if (p.tiles_per_warp != 1 && p.tiles_per_warp != 2) {
    p.why_not = str("tiles_per_warp ", p.tiles_per_warp, " (1 or 2)");
    return p;
  }
  const int rows = kWarps * p.tiles_per_warp * 16;
  for (int i = 0; i < n_outs; ++i) p.groups += ceil_div(outs[i].w->n, rows);
  auto fits = [&](int s) { return smem_bytes(T, p.tiles_per_warp, ceil_div(chunks, s)) <= kSmemLimit; };
  if (cfg.split != 0) {
    p.split = cfg.split;
    if (p.split != 1 && p.split != 2 && p.split != 4 && p.split != 8)
      p.why_not = str("split ", p.split, " (1, 2, 4 or 8)");
    else if (!fits(p.split))
      p.why_not = str("split ", p.split, ": the x slice of ", M, " rows does not fit shared memory");
  } else {
    // The smallest split from 2 whose x slice fits: q/k/v (k 4096) measured 19.0 / 30.7 / 79.8 us
    // at 16 / 32 / 64 rows with splits 2 / 2 / 4, against 33.6 / 52.2 / 102.8 at split 8 (more
    // blocks, each with less to stream, did worse than fewer, longer ones).
    p.split = chunks >= 2 ? 2 : 1;
    while (p.split < kMaxSplit && !fits(p.split)) p.split *= 2;
    if (!fits(p.split))
      p.why_not = str("k ", chunks * kChunkK, " at ", M, " rows: the x slice does not fit shared memory");
  }
  p.smem = smem_bytes(T, p.tiles_per_warp, ceil_div(chunks, p.split));
  return p;
}

// Shapes alone (no device): the split that the auto plan would reach at most.
std::string shape_reason(const Nvfp4GemvOutput* outs, int n_outs, int M) {
  const int chunks = outs[0].w->k / kChunkK, T = ceil_div(M, 8);
  if (smem_bytes(T, 1, ceil_div(chunks, kMaxSplit)) > kSmemLimit)
    return str("k ", chunks * kChunkK, " at ", M, " rows: the x slice does not fit shared memory");
  return "";
}

}  // namespace

std::string nvfp4_small_m_unsupported_reason(const Nvfp4GemvOutput* outs, int n_outs, int M) {
  if (M < 1 || M > kNvfp4GemvMaxRows)
    return str("M=", M, " (the small-M NVFP4 kernel takes 1..", kNvfp4GemvMaxRows, " rows)");
  for (int i = 0; i < n_outs; ++i)
    if (outs[i].residual != nullptr)
      return str("output ", i, ": a residual add (the GEMV kernels only)");
  const std::string why = outputs_shape_reason(outs, n_outs);
  return why.empty() ? shape_reason(outs, n_outs, M) : why;
}

cudaError_t linear_nvfp4_small_m(const Nvfp4GemvOutput* outs, int n_outs, const uint16_t* x, int M,
                                 cudaStream_t stream, const Nvfp4SmallMConfig* config) {
  const std::string why = nvfp4_small_m_unsupported_reason(outs, n_outs, M);
  if (!why.empty()) TETRA_FAIL("NVFP4 small-M linear: ", why);
  const Nvfp4SmallMConfig cfg = config ? *config : Nvfp4SmallMConfig{};
  const Plan p = plan_for(outs, n_outs, M, cfg);
  if (!p.why_not.empty()) TETRA_FAIL("NVFP4 small-M linear: ", p.why_not);
  SmallMArgs a{};
  static_cast<Nvfp4OutputsArg&>(a) = outputs_arg(outs, n_outs, "NVFP4 small-M");
  const int rows = kWarps * p.tiles_per_warp * 16;
  int groups = 0;
  for (int i = 0; i < n_outs; ++i) {
    TETRA_CHECK(reinterpret_cast<uintptr_t>(a.w[i]) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(a.s[i]) % 16 == 0,
                "NVFP4 small-M output ", i, ": weights or scales not 16-byte aligned");
    groups += ceil_div(a.n[i], rows);
    a.group_end[i] = groups;
  }
  TETRA_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "NVFP4 small-M: x not 16-byte aligned");
  a.x = x;
  a.m = M;
  a.k = outs[0].w->k;
  a.split = p.split;
  const int T = ceil_div(M, 8);
  return p.tiles_per_warp == 1 ? launch_tw<1>(a, T, groups, p.smem, stream)
                               : launch_tw<2>(a, T, groups, p.smem, stream);
}

}  // namespace tetra::ops::cuda
