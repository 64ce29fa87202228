// W4A16 MoE kernel on Hopper's warpgroup MMA (wgmma, sm_90a) for more than 8 rows per expert: a
// block computes 256 weight rows x a token tile of one expert (128 tokens; 32 in the narrow shape,
// two blocks per SM, for experts with few rows; 64 for one matrix of 33..64 rows). Each of its 16
// warps dequantizes its own 16-row weight tile into registers (the wgmma A operand, in the
// mma.m16n8k16 fragment layout the packed weights already have), and each warpgroup multiplies its
// 64 rows by the token tile that the tensor cores read straight from shared memory (the B operand:
// one m64nNk16 per warpgroup and k-step), so no warp spends instructions on B fragments, and 256
// rows per token tile halve the activation bytes per FLOP of the mma.sync tiled kernel
// (w4a16_tiled.cu), whose L2 traffic bounds it. N is the token tile's width rounded up to
// 16/32/64/128: an expert's last tile is often short.
//
// Activations (x of GEMM1, act of GEMM2) are in wgmma order (moe/wgmma_order.h): 16-byte group g of
// each 64-column chunk holds the columns wgmma reads as k group g, so a chunk of a token row is
// 8 plain 16-byte copies. Shared memory holds kStages stages of two 64-k chunks, each stage with a
// full and an empty mbarrier; a chunk is the 16 tiles' weight and scale bytes and the tokens x 64
// activations in wgmma's K-major layout without swizzle, "core matrices" of 8 tokens x 16 bytes:
// group g of token r at g * kGroupStride + 16 r (the 16-byte pad in the stride puts the 8 groups
// on different banks). GEMM1 writes act in wgmma order for GEMM2.
// Several matrices over the same x (OutSegments: q, k and v) run as one, each tile's weights read
// from its own matrix and written to its own output.
// Split k (WgmmaConfig::k_split = S > 1): the grid's z is a thread-block cluster of S blocks over
// the same tile, block z multiplying its share of the 64-k chunks; rank 0 adds the others'
// partial sums in rank order over distributed shared memory (the same bits on every run) and
// writes the tile. For the dense linears of 16..255 rows, whose one matrix gives the kernel too
// few column blocks to fill the GPU. (Spreading the sums and stores over the ranks measured
// slower on the H200 and spilled the 128-token tile's registers: session 25.)
// Measured on the H200 (GLM-5, 4096 tokens, GEMM1 + GEMM2): 6.1-6.4 ms vs 9.9 ms for the tiled
// kernel; bench/results/2026-11-30-moe-wgmma-h200.md and -moe-small-batch-h200.md have the steps.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_check.h"
#include "core/kernel_smem_attr.h"
#include "moe/wgmma_order.h"
#include "ops/moe/mbarrier.cuh"
#include "ops/moe/moe_kernel_smem.h"
#include "ops/moe/w4a16_fragment.cuh"
#include "ops/moe/w4a16_grid_rows.cuh"
#include "ops/moe/w4a16_launch.h"

// wgmma exists on sm_90a only: other targets (a build for 90a;100a;120a) get an empty kernel, and
// the host picks this one only on SM 9.0 (moe_wgmma_available()).
#if defined(__CUDA_ARCH__) && !(__CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define TETRA_NO_WGMMA 1
#endif

namespace tetra::moe_detail {
namespace {

constexpr int kStages = 4;       // pipeline stages; loads run kStages - 1 stages ahead
constexpr int kStageChunks = 2;  // 64-k chunks per stage
constexpr int kGroups = kChunkK / 8;                 // k groups of 8 per chunk
constexpr int kMaxKSplit = 8;    // the portable cluster size

constexpr int kThreads = 512;    // four warpgroups; warp w owns weight tile w of the block
constexpr int kTilesM = 16;      // 16-row weight tiles per block (256 rows)
constexpr int kWBytes = kTilesM * kTileChunkBytes;   // 8192 per chunk
constexpr int kSBytes = kTilesM * kTileChunkScales;  // 1024 per chunk
static_assert(kThreads == kTilesM * 32, "one weight cp.async per thread per stage");
static_assert(kTilesM * kTileChunkScales <= kThreads * 16, "scales: one 16-byte copy per thread");

// The block's token tile: kRowsN tokens (the largest wgmma N it runs). The wide shape (128)
// runs one block per SM; the narrow one (32: experts with few rows) has a quarter of the
// activation bytes per stage and fits two blocks per SM, twice the warpgroups to hide the
// dequantize -> wgmma -> wait chain that bounds a small N. The 64-token one runs one block per
// SM with registers to spare for a second A set, so a stage's two chunks overlap (main_loop).
template <int kRowsN_>
struct TokenTile {
  static constexpr int kRowsN = kRowsN_;
  static constexpr int kGroupStride = kRowsN * 16 + 16;  // bytes from one k group to the next
  static constexpr int kXBytes = ((kGroups - 1) * kGroupStride + kRowsN * 16 + 127) / 128 * 128;
  static constexpr int kChunkBytes = kWBytes + kSBytes + kXBytes;
  static constexpr int kStageBytes = kStageChunks * kChunkBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kSmemBytes == moe_smem::wgmma(kRowsN), "moe_kernel_smem.h quotes this layout");
  static constexpr int kBlocksPerSm = kRowsN <= 32 ? 2 : 1;
  static constexpr int kAcc = kRowsN / 2;  // accumulator floats per thread at N = kRowsN
  static_assert((kWBytes + kSBytes) % 16 == 0 && kChunkBytes % 16 == 0, "16-byte aligned regions");
  static_assert(kRowsN * kGroups % kThreads == 0 || kRowsN * kGroups < kThreads, "x copies");
  static_assert(kBlocksPerSm * kSmemBytes <= 227 * 1024, "blocks per SM fit shared memory");
  static_assert(kAcc * kThreads * 4 <= kSmemBytes, "split k: a block's partial sums fit");
};

#ifndef TETRA_NO_WGMMA
// K-major B descriptor without swizzle: start address, then the byte distance between core
// matrices along K (leading) and along N (stride), each >> 4.
template <int kGroupStride>
__device__ __forceinline__ uint64_t b_descriptor(uint32_t smem_addr) {
  return uint64_t((smem_addr & 0x3FFFFu) >> 4) | (uint64_t(kGroupStride >> 4) << 16) |
         (uint64_t(128 >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// d [N / 2] += A (this warp's 16 x 16 of the warpgroup's 64 x 16, registers) * B (16 x N, shared).
// N: the token tile width actually computed (a block's last token tile of an expert is often short).
template <int N>
__device__ __forceinline__ void wgmma_m64nNk16(float (&d)[64], const uint32_t (&a)[4], uint64_t b);

template <>
__device__ __forceinline__ void wgmma_m64nNk16<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_m64nNk16<64>(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_m64nNk16<32>(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_m64nNk16<16>(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

#endif  // TETRA_NO_WGMMA

// The segment holding weight row n (a tile's rows never straddle two) and its first row.
__device__ __forceinline__ int segment_of_row(const OutSegments& segments, int n, int& n0) {
  int si = 0;
  n0 = 0;
  while (si + 1 < segments.count && n >= segments.seg[si].n_end) n0 = segments.seg[si++].n_end;
  return si;
}

template <int kRowsN, bool GATED, bool OUT_F32>
__global__ void __launch_bounds__(kThreads, TokenTile<kRowsN>::kBlocksPerSm)
    moe_wgmma_kernel(const GroupedGemmArgs a, const OutSegments segments) {
#ifdef TETRA_NO_WGMMA
  __trap();
#else
  using TT = TokenTile<kRowsN>;
  constexpr int kGroupStride = TT::kGroupStride, kChunkBytes = TT::kChunkBytes;
  constexpr int kStageBytes = TT::kStageBytes, kAcc = TT::kAcc;
  extern __shared__ __align__(128) uint8_t smem[];  // [kStages][W | S | X]
  using Tile = GridRowTile<kThreads>;
  __shared__ typename Tile::Shared tile_s;
  __shared__ int s_src[kRowsN];  // [token] source row of x, -1 past the expert's rows

  const int tid = threadIdx.x;
  Tile::find<kRowsN>(a, int(blockIdx.y), tile_s);
  const int e = tile_s.expert;
  if (e < 0) return;
  const int tok0 = tile_s.tok0;
  const int cnt = a.rows.row_count[e];
  const int start = a.rows.row_start[e];
  if (tid < kRowsN) {
    const int token = tok0 + tid;
    s_src[tid] = token < cnt ? (a.rows.gather ? a.rows.gather[start + token] : start + token) : -1;
  }

  const int all_chunks = a.k / kChunkK;
  const int tiles_total = a.n / 16;
  const int tile0 = int(blockIdx.x) * kTilesM;
  const uint8_t* wbase = a.w + size_t(e) * tiles_total * all_chunks * kTileChunkBytes;
  const uint8_t* sbase = a.s + size_t(e) * tiles_total * all_chunks * kTileChunkScales;
  const int warp = tid / 32, lane = tid % 32;
  // This block's chunks [c_begin, c_begin + chunks) of the k split (split = gridDim.z).
  const int split = int(gridDim.z), rank = int(blockIdx.z);
  const int c_begin = rank * all_chunks / split;
  const int chunks = (rank + 1) * all_chunks / split - c_begin;

  // ---- this thread's copy sources and targets
  // Tile t's weights and scales: expert e's, or (several matrices) those of t's segment.
  auto tile_base = [&](int t, bool scales) {
    const size_t per_tile = size_t(all_chunks) * (scales ? kTileChunkScales : kTileChunkBytes);
    if (segments.count == 0) return (scales ? sbase : wbase) + size_t(t) * per_tile;
    int n0;
    const OutSegment& sg = segments.seg[segment_of_row(segments, t * 16, n0)];
    return (scales ? sg.s : sg.w) + size_t(t - n0 / 16) * per_tile;
  };
  const int my_tile = tile0 + warp;  // weight copy: lane piece of tile `warp`
  const bool w_ok = my_tile < tiles_total;
  const uint8_t* wsrc = tile_base(w_ok ? my_tile : 0, false) + size_t(c_begin) * kTileChunkBytes +
                        lane * 16;
  const int s_tile = tile0 + tid / 4;  // scale copy (tid < 4 * kTilesM): 16 B of one tile's 64
  const bool s_ok = tid < 4 * kTilesM && s_tile < tiles_total;
  const uint8_t* ssrc = tile_base(s_ok ? s_tile : 0, true) + size_t(c_begin) * kTileChunkScales +
                        (tid % 4) * 16;
  const uint16_t* xsrc = a.x + size_t(c_begin) * kChunkK;  // this block's k range of x rows
  __syncthreads();  // s_src

  // One chunk's copies into its place (sub-chunk h of stage `stage`).
  auto load_chunk = [&](int stage, int h, int c) {
    uint8_t* ch = smem + stage * kStageBytes + h * kChunkBytes;
    if (w_ok) cp_async_16(ch + tid * 16, wsrc + size_t(c) * kTileChunkBytes, 16);
    if (s_ok) cp_async_16(ch + kWBytes + tid * 16, ssrc + size_t(c) * kTileChunkScales, 16);
#pragma unroll
    for (int q = 0; q < (kRowsN * kGroups + kThreads - 1) / kThreads; ++q) {
      // group tid % 8 of token tid / 8 + 64 q
      const int token = tid / 8 + (kThreads / 8) * q, group = tid % 8;
      if (kRowsN * kGroups < kThreads && token >= kRowsN) break;
      const int src = s_src[token];
      cp_async_16(ch + kWBytes + kSBytes + group * kGroupStride + token * 16,
                  xsrc + size_t(src < 0 ? 0 : src) * a.k + c * kChunkK + 8 * group, src < 0 ? 0 : 16);
    }
  };
  const int stages = (chunks + kStageChunks - 1) / kStageChunks;
  auto load_stage = [&](int s) {
#pragma unroll
    for (int h = 0; h < kStageChunks; ++h)
      if (s * kStageChunks + h < chunks) load_chunk(s % kStages, h, s * kStageChunks + h);
  };

  float acc[64];  // the first kAcc are used (N = kRowsN)
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

  // Stage barriers instead of a block barrier per stage: full[b] completes when every thread's
  // copies into buffer b have landed (cp.async arrive), empty[b] when every thread has finished
  // the wgmmas that read it. A warp waits only for the stage it needs and, before refilling a
  // buffer, for the slowest warp to leave it, so warps may drift apart by a stage (the four
  // warpgroups' wgmmas queue on the tensor cores, and a barrier per stage made every warp wait
  // for the last one: ncu's top stall).
  __shared__ __align__(8) uint64_t full_bar[kStages], empty_bar[kStages];
  if (tid == 0) {
    for (int b = 0; b < kStages; ++b) {
      mbar_init(&full_bar[b], kThreads);
      mbar_init(&empty_bar[b], kThreads);
    }
  }
  __syncthreads();
  auto produce = [&](int s) {  // stage s into buffer s % kStages (round s / kStages)
    const int b = s % kStages;
    if (s >= kStages) mbar_wait(&empty_bar[b], ((s / kStages) - 1) & 1);
    load_stage(s);
    cp_async_arrive_noinc(&full_bar[b]);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < stages) produce(s);
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // One chunk (sub-chunk h of a stage, at byte offset off of the stage memory): this warp's
  // weights dequantized into the A fragments of its 16-row tile, then the warpgroup's 4 k-steps
  // issued against the chunk's tokens (B, shared memory) as one wgmma group.
  auto dequant_chunk = [&](uint32_t off, uint32_t (&A)[4][4]) {
    const uint8_t* ch = smem + off;
    const uint4 wa = *reinterpret_cast<const uint4*>(ch + warp * kTileChunkBytes + lane * 16);
    const uint32_t sv =
        *reinterpret_cast<const uint16_t*>(ch + kWBytes + warp * kTileChunkScales + lane * 2);
    uint32_t sg, sg8;
    scale_pair_to_bf16x2(sv, sg, sg8);
#pragma unroll
    for (int j = 0; j < 4; ++j) dequant_word(word_of(wa, j), sg, sg8, A[j]);
  };
  auto issue_chunk = [&]<int N>(uint32_t off, const uint32_t (&A)[4][4]) {
    const uint32_t xs = smem_base + off + uint32_t(kWBytes + kSBytes);
    uint64_t desc[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) desc[j] = b_descriptor<kGroupStride>(xs + 2 * j * kGroupStride);
    wgmma_fence();  // A was just written by ordinary instructions
#pragma unroll
    for (int j = 0; j < 4; ++j) wgmma_m64nNk16<N>(acc, A[j], desc[j]);
    wgmma_commit();
  };
  // The main loop for a token tile computed N wide (N >= the tile's tokens; the rest of the
  // 128-token tile is zeros that need no MMA).
  auto main_loop = [&]<int N>() {
    // In the 64-token tile a stage's two chunks overlap: the second chunk's dequantize runs
    // while the first chunk's wgmmas do, in its own registers, and the warpgroup waits once per
    // stage. (The 128-token tile's accumulators leave no room for a second A set, the 32-token
    // tile's two blocks per SM neither.)
    constexpr bool kOverlap = kRowsN == 64;
    static_assert(!kOverlap || kStageChunks == 2, "the overlap pairs a stage's two chunks");
    for (int s = 0; s < stages; ++s) {
      const int b = s % kStages;
      mbar_wait(&full_bar[b], (s / kStages) & 1);
      // The copies are generic-proxy writes; wgmma reads shared memory through the async proxy.
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      const uint32_t off0 = uint32_t(b * kStageBytes);
      if constexpr (kOverlap) {
        uint32_t A0[4][4], A1[4][4];
        dequant_chunk(off0, A0);
        issue_chunk.template operator()<N>(off0, A0);
        if (s * kStageChunks + 1 < chunks) {
          dequant_chunk(off0 + kChunkBytes, A1);
          issue_chunk.template operator()<N>(off0 + kChunkBytes, A1);
        }
        wgmma_wait<0>();
      } else {
#pragma unroll
        for (int h = 0; h < kStageChunks; ++h) {
          if (s * kStageChunks + h >= chunks) break;
          uint32_t A[4][4];
          dequant_chunk(off0 + uint32_t(h * kChunkBytes), A);
          issue_chunk.template operator()<N>(off0 + uint32_t(h * kChunkBytes), A);
          // The wgmmas read A from registers, which the next chunk's dequant rewrites (wgmma
          // with A in registers cannot overlap a write to them; the other warpgroups keep the
          // tensor cores busy meanwhile).
          wgmma_wait<0>();
        }
      }
      mbar_arrive(&empty_bar[b]);
      // Refill the buffer stage s - 1 used, once every thread has left it.
      if (s + kStages - 1 < stages) produce(s + kStages - 1);
    }
  };
  const int tokens = min(kRowsN, cnt - tok0);
  if (kRowsN > 64 && tokens > 64)
    main_loop.template operator()<kRowsN>();  // 128 (the wide tile only)
  else if (kRowsN > 32 && tokens > 32)
    main_loop.template operator()<(kRowsN > 64 ? 64 : kRowsN)>();
  else if (tokens > 16)
    main_loop.template operator()<32>();
  else
    main_loop.template operator()<16>();
  cp_async_wait<0>();

  // Split k: every rank stores its partial sums in its own shared memory (the pipeline's, idle
  // now); rank 0 adds ranks 1..S-1 to its registers in that order (the same bits on every run)
  // and alone writes the tile.
  if (split > 1) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    float* part = reinterpret_cast<float*>(smem);  // [kAcc][kThreads]
    __syncthreads();  // every warp is past its last read of the pipeline stages
    if (rank != 0) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) part[i * kThreads + tid] = acc[i];
    }
    cluster.sync();  // the partials are written and visible to the cluster
    if (rank == 0) {
      for (int r = 1; r < split; ++r) {
        const float* src = cluster.map_shared_rank(part, r);
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] += src[i * kThreads + tid];
      }
    }
    cluster.sync();  // no block leaves while rank 0 still reads its shared memory
    if (rank != 0) return;
  }

  // ---- epilogue. acc[4 j + r]: weight row 16 * warp + g (+8 for r >= 2) of the block, token
  // tok0 + 8 j + 2 t + (r & 1).
  const int g = lane / 4, t = lane % 4;
  if constexpr (GATED) {
    // Tiles alternate gate / up: warp 2p holds gate rows of output pair p, warp 2p + 1 its up
    // rows; the up warps hand their sums over through shared memory.
    __syncthreads();  // every warp is past its last read of the pipeline stages
    float* xchg = reinterpret_cast<float*>(smem);  // [kTilesM / 2][kAcc][32]
    if (warp % 2 == 1) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i)
        xchg[((warp / 2) * kAcc + i) * 32 + lane] = acc[i];
    }
    __syncthreads();
    if (warp % 2 == 1 || !w_ok) return;
    const float ag = a.alpha0[e], au = a.alpha1[e];
    const int out_ld = a.n / 2;
    uint16_t* out = static_cast<uint16_t*>(a.out);
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int token = tok0 + 8 * (i / 4) + 2 * t + (i & 1);
      if (token < cnt) {
        const int n = (my_tile / 2) * 16 + g + ((i & 3) >= 2 ? 8 : 0);
        const float up = xchg[((warp / 2) * kAcc + i) * 32 + lane];
        // act is GEMM2's activation: stored in wgmma order.
        out[size_t(start + token) * out_ld + wgmma_order_column(n)] =
            f32_to_bf16_bits(silu(acc[i] * ag) * (up * au));
      }
    }
  } else if (!OUT_F32 && segments.count > 0) {
    // Several matrices: this warp's 16-row tile lies in one segment.
    if (!w_ok) return;
    int n0;
    const OutSegment sg = segments.seg[segment_of_row(segments, my_tile * 16, n0)];
    const float ad = *sg.alpha;
    const int ld = sg.n_end - n0;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int token = tok0 + 8 * (i / 4) + 2 * t + (i & 1);
      if (token < cnt) {
        const int n = my_tile * 16 + g + ((i & 3) >= 2 ? 8 : 0) - n0;
        uint16_t v = f32_to_bf16_bits(acc[i] * ad);
        if (sg.bias)
          v = f32_to_bf16_bits(__bfloat162float(__ushort_as_bfloat16(v)) +
                               __bfloat162float(__ushort_as_bfloat16(sg.bias[n])));
        sg.out[size_t(start + token) * ld + n] = v;
      }
    }
  } else {
    if (!w_ok) return;
    const float ad = a.alpha0[e];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const int token = tok0 + 8 * (i / 4) + 2 * t + (i & 1);
      if (token < cnt) {
        const int n = my_tile * 16 + g + ((i & 3) >= 2 ? 8 : 0);
        const size_t o = size_t(start + token) * a.n + n;
        if constexpr (OUT_F32)
          static_cast<float*>(a.out)[o] = acc[i] * ad;
        else
          static_cast<uint16_t*>(a.out)[o] = f32_to_bf16_bits(acc[i] * ad);
      }
    }
  }
#endif
}

// Blocks of the grid that may have work: sum over slots of ceil(rows / kRowsN) is at most
// ceil(total_rows / kRowsN) + slots - 1 (and the grid's own bound, total_rows / kRowsN + slots).
template <int kRowsN>
long row_blocks_with_work(const GroupedGemmArgs& a) {
  return std::min<long>(long(a.total_rows) / kRowsN + a.num_slots,
                        (long(a.total_rows) + kRowsN - 1) / kRowsN + a.num_slots - 1);
}

template <int kRowsN, bool GATED, bool OUT_F32>
cudaError_t launch_wgmma_t(const GroupedGemmArgs& a, cudaStream_t stream, int k_split,
                           const OutSegments& segments) {
  constexpr int kSmem = TokenTile<kRowsN>::kSmemBytes;
  const cudaError_t attr = ensure_max_dynamic_smem<moe_wgmma_kernel<kRowsN, GATED, OUT_F32>>(kSmem);
  if (attr != cudaSuccess) return attr;
  const int col_blocks = (a.n + kTilesM * 16 - 1) / (kTilesM * 16);
  const int row_blocks = (a.total_rows + kRowsN - 1) / kRowsN + a.num_slots;  // upper bound
  if (k_split == 0)
    k_split = wgmma_k_split(long(col_blocks) * row_blocks_with_work<kRowsN>(a),
                            TokenTile<kRowsN>::kBlocksPerSm, current_device_sm_count(),
                            a.k / kChunkK);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(col_blocks), unsigned(row_blocks), unsigned(k_split));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cfg.stream = stream;
  cudaLaunchAttribute cluster[1] = {};
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = 1;
  cluster[0].val.clusterDim.y = 1;
  cluster[0].val.clusterDim.z = unsigned(k_split);
  cfg.attrs = k_split > 1 ? cluster : nullptr;
  cfg.numAttrs = k_split > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, moe_wgmma_kernel<kRowsN, GATED, OUT_F32>, a, segments);
}

template <int kRowsN>
cudaError_t launch_wgmma_n(const GroupedGemmArgs& a, cudaStream_t stream, int k_split,
                           const OutSegments& segments) {
  if (a.gated) return launch_wgmma_t<kRowsN, true, false>(a, stream, k_split, segments);
  if (a.out_f32) return launch_wgmma_t<kRowsN, false, true>(a, stream, k_split, segments);
  return launch_wgmma_t<kRowsN, false, false>(a, stream, k_split, segments);
}

// grid (rows, ceil(k / 64 / 8)), block 256: warp w takes chunk 8 blockIdx.y + w of the row, lane u
// its 4-byte unit u (columns 2u, 2u + 1).
__global__ void __launch_bounds__(256) to_wgmma_order_kernel(const uint32_t* __restrict__ x, int k,
                                                             uint32_t* __restrict__ out) {
  const int chunk = int(blockIdx.y) * 8 + int(threadIdx.x) / 32, u = int(threadIdx.x) % 32;
  if (chunk * kChunkK >= k) return;
  const size_t base = (size_t(blockIdx.x) * k + size_t(chunk) * kChunkK) / 2;  // in units
  out[base + wgmma_order_column(2 * u) / 2] = x[base + u];
}

}  // namespace

int wgmma_k_split(long blocks, int blocks_per_sm, int sms, int chunks) {
  const int max_split = blocks_per_sm >= 2 ? kMaxKSplit : kMaxKSplit / 2;
  int split = 1;
  while (split < max_split && blocks * split * 2 <= long(sms) &&
         chunks / (split * 2) >= kWgmmaMinSplitChunks)
    split *= 2;
  return split;
}

cudaError_t launch_wgmma(const GroupedGemmArgs& a, cudaStream_t stream, WgmmaConfig cfg,
                         const OutSegments& segments) {
  if (cfg.k_split < 0 || cfg.k_split > kMaxKSplit || (cfg.k_split & (cfg.k_split - 1)) != 0 ||
      (cfg.token_tile != 0 && cfg.token_tile != 32 && cfg.token_tile != 64 &&
       cfg.token_tile != 128))
    return cudaErrorInvalidValue;
  if (segments.count > 0 && (a.gated || a.out_f32 || a.num_slots != 1 ||
                             segments.count > kMaxOutSegments ||
                             segments.seg[segments.count - 1].n_end != a.n))
    return cudaErrorInvalidValue;
  if (a.num_slots <= 0 || a.n <= 0 || a.total_rows <= 0) return cudaSuccess;
  // Up to 32 rows per expert (on average over the slots) the narrow token tile: H200, GLM-5 layer
  // at 9 / 16 rows per expert 2931 -> 2270 / 3103 -> 2513 us, a tie at 32 rows (GLM-5 +1.5%,
  // Air -3%), and 26% slower at 64 (bench/results/2026-11-30-moe-small-batch-h200.md). One
  // matrix (a dense linear) of 33..64 rows takes the 64-token tile, whose stages overlap two
  // chunks: GLM-4.5-Air q/k/v at 64 rows 36.7 -> 33.3 us, decode batch 64 -0.6% (session 27).
  // Not for several experts: their row counts vary about the mean, and one expert past 64 rows
  // needs a second block over its weights (GLM-5 at 2048 tokens +6%, Air at 1024 +4%).
  const int tile = cfg.token_tile != 0                      ? cfg.token_tile
                   : a.total_rows <= 32 * long(a.num_slots) ? 32
                   : a.num_slots == 1 && a.total_rows <= 64 ? 64
                                                            : 128;
  if (tile == 32) return launch_wgmma_n<32>(a, stream, cfg.k_split, segments);
  if (tile == 64) return launch_wgmma_n<64>(a, stream, cfg.k_split, segments);
  return launch_wgmma_n<128>(a, stream, cfg.k_split, segments);
}

}  // namespace tetra::moe_detail

namespace tetra {

cudaError_t moe_w4a16_to_wgmma_order(const uint16_t* x, int rows, int k, uint16_t* out,
                                     cudaStream_t stream) {
  if (rows < 0 || k <= 0 || k % kWgmmaOrderChunk != 0 || x == out) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const unsigned chunk_groups = unsigned((k / kWgmmaOrderChunk + 7) / 8);
  moe_detail::to_wgmma_order_kernel<<<dim3(unsigned(rows), chunk_groups), 256, 0, stream>>>(
      reinterpret_cast<const uint32_t*>(x), k, reinterpret_cast<uint32_t*>(out));
  return cudaGetLastError();
}

}  // namespace tetra
