// Weight-streaming W4A16 GEMV for decode (at most 8 activation rows per pass), used by the dense
// decode linears with few long tiles (o_proj; ops/linear/nvfp4_gemv.cu). A MoE variant over
// (slot, tile pair) units lost to the register-streaming decode kernel at every measured shape
// and was removed (bench/results/2026-11-30-stream-gemv-h200.md has its figures).
//
// Why: a block that loads its weights, waits, multiplies and exits leaves HBM idle between its
// bursts and at the wave tails. Here a persistent grid (about one block per SM) takes a
// contiguous range of work units (one 16-row tile, or one gate/up tile pair, of one matrix). In
// the fragment layout of moe/expert_weights.h a tile's K range is contiguous, so one producer
// thread streams it as 1-D bulk copies (L2 evict-first) of up to kSeg chunks (kSeg * 512 B of
// weights + kSeg * 64 B of scales) into a ring of shared-memory stages that complete on
// mbarriers; the copy engine keeps many KB in flight per SM without registers, across unit
// boundaries. The consumer warps split each stage's chunks, dequantize from shared memory
// (w4a16_fragment.cuh helpers) and run mma.sync m16n8k16 with the weights on the M side and up
// to 8 activation rows on the N side, accumulating in registers until the unit's tiles end; then
// their partial sums meet in shared memory and the Work's epilogue stores them. Every sum is
// taken in a fixed order (no atomics): two runs give bit-identical results.
//
// A Work (trivially copyable, passed by value) describes the units:
//   static constexpr int kTilesPerUnit;  // 1 plain, 2 gate/up pair (tiles 2p, 2p+1 adjacent)
//   int total_units, chunks;             // units in the grid, K / 64
//   const uint16_t* x;                   // activations (read only after griddepcontrol.wait)
//   struct Unit { const uint8_t* w; const uint8_t* s; int rows; ... };  // rows <= 0: skip
//   __device__ Unit unit(int u) const;   // w, s at the unit's first tile, chunk 0
//   __device__ const uint16_t* x_row(const Unit&, int row) const;        // 0 <= row < rows
//   __device__ void store(const Unit&, int row, int col, const float (&v)[kTilesPerUnit]) const;
// where col is the weight row inside the tile (0..15) and v the finished sums (gate, up).
// Optional: __device__ unsigned long long* stamps() const; int stamp_launch() const; (per-block
// stamps, perf/block_stamps.h).
// Optional, a unit epilogue after the stores (the router fold, moe/router_fold.h; one unit per
// block and one row): __device__ const void* fold_src(int u) const and __host__ __device__ int
// fold_bytes() const (16-byte aligned, a multiple of 16, not 0: the epilogue's constants, which
// the producer stages in shared memory at the kernel's start), __device__ void
// fold_unit(const Unit&, const void* staged, int tid) const, run by threads 0..127 once every
// store of the block is done.
// Units with more than 8 rows are run in passes of 8, each pass streaming the unit again.
//
// Measured (H200, bench/results/2026-11-30-stream-gemv-h200.md): the ring alone (copy-only mode)
// streams at 3.9 TB/s; with the dequant + MMA the consumers bind (about 100 instructions per
// 576-byte chunk), so the kernel needs ~32 consumer warps per SM (two blocks of 16) and wins only
// where each block owns one long tile (o_proj). Where blocks own several short units (q/k/v, the
// MoE GEMMs) the register-streaming kernels with more warps stay faster.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/kernel_launch.h"
#include "ops/moe/mbarrier.cuh"
#include "ops/moe/w4a16_fragment.cuh"
#include "perf/block_stamps.cuh"

namespace tetra::moe_detail {

// Chunks per stage for C consumer warps taking J chunks each (J independent MMA chains).
template <int C, int J>
constexpr int stream_seg_chunks() { return C * J; }
// Dynamic shared memory of a ring: weights, scales, then full/empty mbarriers.
// (+ fold_bytes: an mbarrier and the Work's staged epilogue data after them.)
template <int C, int J>
constexpr int stream_smem_bytes(int stages, int fold_bytes = 0) {
  return stages * stream_seg_chunks<C, J>() * (kTileChunkBytes + kTileChunkScales) + stages * 16 +
         (fold_bytes > 0 ? 16 + fold_bytes : 0);
}
template <class Work>
__host__ __device__ int stream_fold_bytes(const Work& w) {
  if constexpr (requires { w.fold_bytes(); })
    return w.fold_bytes();
  else
    return 0;
}
// Ring reads at 32-bit shared addresses (after the stage's full barrier was waited on).
__device__ __forceinline__ uint4 lds_u4(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t lds_u16(uint32_t a) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a) : "memory");
  return v;
}

// Diagnostic modes for the benchmark: 0 = the GEMV; 1 = stream only (no activation loads, no
// math: the ring's own rate); 2 = no activation loads (math on constant activations).
enum StreamMode { kStreamFull = 0, kStreamCopyOnly = 1, kStreamNoX = 2 };

// C consumer warps + 1 producer warp, J chunks per consumer warp per stage. stages: ring depth
// (dynamic shared memory sized by stream_smem_bytes<C, J>(stages)). 16 consumer warps are meant
// to run two blocks per SM (32 warps): registers capped for that.
template <class Work, int C, int J, int MODE>
__global__ void __launch_bounds__((C + 1) * 32, C >= 16 ? 2 : 1) stream_gemv_kernel(const Work work, int stages) {
  constexpr int TPU = Work::kTilesPerUnit;
  constexpr int S = stream_seg_chunks<C, J>();
  extern __shared__ __align__(128) unsigned char smem[];
  uint8_t* ring_w = smem;                                        // [stages][S][512]
  uint8_t* ring_s = smem + size_t(stages) * S * kTileChunkBytes;  // [stages][S][64]
  uint64_t* full = reinterpret_cast<uint64_t*>(ring_s + size_t(stages) * S * kTileChunkScales);
  uint64_t* empty = full + stages;                               // [stages] each
  uint64_t* fold_full = empty + stages;                          // [1] + pad (with fold_bytes)
  uint8_t* fold_s = reinterpret_cast<uint8_t*>(fold_full + 2);   // [fold_bytes]
  const int fold_bytes = stream_fold_bytes(work);
  __shared__ float red[2][C][TPU][4][32];  // [buffer][warp][tile][acc reg][lane] partial sums

  const uint64_t t_start = perf::stamp_time();
  uint64_t t_first = 0;  // consumer 0's first full stage
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], C * 32);  // every consumer thread releases its own ring reads
    }
    if (fold_bytes > 0) mbar_init(fold_full, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // The next kernel may be scheduled now; it waits for this grid before reading its output.
  asm volatile("griddepcontrol.launch_dependents;");

  const int chunks = work.chunks;
  const int u_begin = int(int64_t(blockIdx.x) * work.total_units / gridDim.x);
  const int u_end = int(int64_t(blockIdx.x + 1) * work.total_units / gridDim.x);

  if (warp == C) {
    // Producer: weights need no wait for a previous kernel, so they stream at once (with
    // programmatic dependent launch, while the kernel that writes x still runs).
    if (lane != 0) return;
    const uint64_t policy = l2_evict_first_policy();  // weights are read once
    if constexpr (requires { work.fold_src(0); }) {
      if (u_begin < u_end) {
        mbar_arrive_expect_tx(fold_full, uint32_t(fold_bytes));
        bulk_copy_g2s(fold_s, work.fold_src(u_begin), uint32_t(fold_bytes), fold_full, policy);
      }
    }
    int st = 0;         // ring slot of the next stage
    uint32_t ph = 0;    // how many times the ring wrapped, mod 2
    for (int u = u_begin; u < u_end; ++u) {
      const typename Work::Unit un = work.unit(u);
      if (un.rows <= 0) continue;
      const int passes = (un.rows + 7) / 8;
      for (int p = 0; p < passes; ++p)
        for (int t = 0; t < TPU; ++t)
          for (int c0 = 0; c0 < chunks; c0 += S) {
            const int n = min(S, chunks - c0);
            mbar_wait(&empty[st], ph ^ 1);
            mbar_arrive_expect_tx(&full[st], uint32_t(n) * (kTileChunkBytes + kTileChunkScales));
            const size_t c = size_t(t) * chunks + c0;
            bulk_copy_g2s(ring_w + size_t(st) * S * kTileChunkBytes, un.w + c * kTileChunkBytes,
                          uint32_t(n) * kTileChunkBytes, &full[st], policy);
            bulk_copy_g2s(ring_s + size_t(st) * S * kTileChunkScales, un.s + c * kTileChunkScales,
                          uint32_t(n) * kTileChunkScales, &full[st], policy);
            if (++st == stages) {
              st = 0;
              ph ^= 1;
            }
          }
    }
    return;
  }

  // Consumers. x (and the outputs) may belong to the previous kernel until it completes.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const uint64_t t_waited = perf::stamp_time();
  int st = 0, buf = 0;  // ring slot, partial-sum buffer
  uint32_t ph = 0;      // ring wraps mod 2 (the full barrier's phase parity)
  // This warp's chunk j of a stage sits at ring offset (warp + j * C) * 512 (+ 64 for scales);
  // shared addresses are 32-bit, and everything that does not change per stage is set here
  // (the consumers issue ~60 instructions of dequant + MMA per chunk, so per-stage address
  // arithmetic costs throughput).
  const uint32_t w_lane = smem_u32(ring_w) + uint32_t(warp * kTileChunkBytes + lane * kLaneBytes);
  const uint32_t s_lane = smem_u32(ring_s) + uint32_t(warp * kTileChunkScales + lane * 2);
  const bool whole_stages = chunks % S == 0;  // no short last stage: every warp has its chunks
  for (int u = u_begin; u < u_end; ++u) {
    const typename Work::Unit un = work.unit(u);
    if (un.rows <= 0) continue;
    for (int p = 0; p * 8 < un.rows; ++p) {
      // This lane's activation row (MMA column lane / 4) at k = 16 * (lane % 4) of this warp's
      // first chunk; rows past the count read the last row and their sums are dropped.
      const uint16_t* x_warp =
          work.x_row(un, min(p * 8 + lane / 4, un.rows - 1)) + 16 * (lane % 4) + warp * kChunkK;
      float acc[TPU][J][4];
#pragma unroll
      for (int t = 0; t < TPU; ++t)
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[t][j][r] = 0.0f;
#pragma unroll
      for (int t = 0; t < TPU; ++t) {
        const uint16_t* xc = x_warp;  // chunk c0 + warp of this stage
        for (int c0 = 0; c0 < chunks; c0 += S, xc += S * kChunkK) {
          const int n = whole_stages ? S : min(S, chunks - c0);
          mbar_wait(&full[st], ph);
#ifdef TETRA_BLOCK_STAMPS
          if (t_first == 0) t_first = perf::stamp_time();
#endif
          const uint32_t sw = w_lane + uint32_t(st) * (S * kTileChunkBytes);
          const uint32_t ss = s_lane + uint32_t(st) * (S * kTileChunkScales);
          uint4 wv[J];
          uint32_t sv[J];
#pragma unroll
          for (int j = 0; j < J; ++j) {
            if (warp + j * C < n) {
              wv[j] = lds_u4(sw + uint32_t(j * C * kTileChunkBytes));
              sv[j] = lds_u16(ss + uint32_t(j * C * kTileChunkScales));
            }
          }
          // The stage's bytes are in registers: hand it back to the producer before the math.
          // Every lane arrives (an arrive releases only its own thread's reads; one lane after a
          // __syncwarp left compute-sanitizer racecheck reporting the bulk copies' rewrites).
          mbar_arrive(&empty[st]);
          if (++st == stages) {
            st = 0;
            ph ^= 1;
          }
#pragma unroll
          for (int j = 0; j < J; ++j) {
            if (warp + j * C >= n) continue;
            uint4 x0, x1;
            if constexpr (MODE == kStreamFull) {
              x0 = ld_cached_u4(xc + j * C * kChunkK);
              x1 = ld_cached_u4(xc + j * C * kChunkK + 8);
            } else {
              x0 = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);
              x1 = x0;
            }
            if (MODE == kStreamCopyOnly) {  // keep the loads alive, skip the math
              acc[t][j][0] += __uint_as_float(wv[j].x ^ wv[j].y ^ wv[j].z ^ wv[j].w ^ sv[j] ^
                                              x0.x ^ x1.x) * 0.0f;
            } else {
              uint32_t sg, sg8;
              scale_pair_to_bf16x2(sv[j], sg, sg8);
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                uint32_t A[4];
                dequant_word(word_of(wv[j], q), sg, sg8, A);
                const uint4& xh = (q >> 1) ? x1 : x0;
                mma_bf16_16816(acc[t][j], A, (q & 1) ? xh.z : xh.x, (q & 1) ? xh.w : xh.y);
              }
            }
          }
        }
      }
#pragma unroll
      for (int t = 0; t < TPU; ++t)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          float v = acc[t][0][r];
#pragma unroll
          for (int j = 1; j < J; ++j) v += acc[t][j][r];
          red[buf][warp][t][r][lane] = v;
        }
      // Consumers only (the producer warp runs ahead). Two buffers: a warp writes buffer b again
      // only after the next barrier, which every reader of b passed after reading it.
      asm volatile("bar.sync 1, %0;" ::"n"(C * 32) : "memory");
      if (threadIdx.x < 128) {
        // Element (r, l): weight row l/4 (+8 for r >= 2), activation row 2(l%4) + (r&1).
        const int r = threadIdx.x / 32, l = threadIdx.x % 32;
        const int row = p * 8 + 2 * (l % 4) + (r & 1);
        if (row < un.rows) {
          float v[TPU];
#pragma unroll
          for (int t = 0; t < TPU; ++t) {
            v[t] = 0.0f;
#pragma unroll
            for (int w = 0; w < C; ++w) v[t] += red[buf][w][t][r][l];
          }
          work.store(un, row, l / 4 + (r >= 2 ? 8 : 0), v);
        }
      }
      buf ^= 1;
    }
  }
  // The unit epilogue (one unit per block: its stores are the last ones).
  if constexpr (requires { work.fold_unit(work.unit(0), fold_s, 0); }) {
    if (u_begin < u_end && threadIdx.x < 128) {
      asm volatile("bar.sync 2, 128;" ::: "memory");  // the unit's stores are done
      mbar_wait(fold_full, 0);
      work.fold_unit(work.unit(u_begin), fold_s, int(threadIdx.x));
    }
  }
  // Stamps (Works that carry them): start, wait returned, first stage full, end.
  if constexpr (requires { work.stamps(); })
    if (threadIdx.x == 0)
      perf::block_stamp(work.stamps(), perf::kStampStreamGemv, work.stamp_launch(), t_start,
                        t_waited, t_first, perf::stamp_time());
}

// Host side: one persistent grid of min(units, SMs * blocks_per_sm) blocks. pdl: launch as a
// programmatic dependent (the consumers wait before reading x or writing outputs).
template <class Work, int C, int J = 2, int MODE = kStreamFull>
cudaError_t launch_stream_work(const Work& work, int stages, int blocks_per_sm, bool pdl,
                               cudaStream_t stream) {
  if (work.total_units <= 0) return cudaSuccess;
  if (stages < 2 || stages > 64 || blocks_per_sm < 1 || blocks_per_sm > 4)
    return cudaErrorInvalidValue;
  const int sms = current_device_sm_count();
  const int smem = stream_smem_bytes<C, J>(stages, stream_fold_bytes(work));
  void (*kernel)(Work, int) = stream_gemv_kernel<Work, C, J, MODE>;
  // Above 48 KB a block needs the opt-in; set on every launch (per device, host-side only).
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const int grid = std::min(work.total_units, sms * blocks_per_sm);
  const KernelLaunch launch(dim3(unsigned(grid)), dim3((C + 1) * 32), stream, pdl, size_t(smem));
  return launch(kernel, work, stages);
}

}  // namespace tetra::moe_detail
