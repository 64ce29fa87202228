// Decode W4A16 MoE GEMM with the work cut evenly over every warp of a full grid (stream-K).
//
// Why: the per-tile-pair decode kernel (w4a16_decode.cu) gives each block two 16-row tiles and
// splits k over its 4 warps, so its grid follows the problem: GLM-4.5-Air's GEMM1 at 1 token is
// 704 blocks for 1056 resident slots (21 of 32 warps per SM stream weights, ~2.2 TB/s) and its
// GEMM2 is 1152 blocks, one wave and a 9% second wave. The decode GEMMs are bound by the bytes
// each SM keeps in flight, so idle warp slots cost bandwidth one for one.
//
// Here the grid is what fits on the GPU (8 blocks of 4 warps per SM under a 64-register cap) and
// the work is one line of W = items * pairs * chunks chunk-steps (item: up to 8 rows of one
// expert; pair: a gate/up tile pair for GEMM1, 32 output rows for GEMM2; chunk: 64 of k). Warp i
// of Nw takes steps [i W / Nw, (i + 1) W / Nw): every warp streams the same bytes, +-1 chunk.
// A warp's range crosses pair boundaries; a pair it covers whole is finished in registers, a pair
// it shares (at most its first and its last) gets its partial sums written to the workspace, and
// the warp whose arrival completes the pair's chunk count (an atomic per pair) adds the partials
// in warp order and runs the epilogue, then zeroes the counter for the next launch. The sum order
// depends only on the partition, so two runs give the same bits.
// Inner loop as the late decode kernel: 2 chunks of weights per load batch, activations read from
// L1 right before their MMA, weights on the MMA's M side and the item's <= 8 rows on its N side.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/kernel_launch.h"
#include "ops/moe/w4a16_fragment.cuh"
#include "ops/moe/w4a16_launch.h"

namespace tetra::moe_detail {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlocksPerSm = kSplitKWarpsPerSm / kWarps;
constexpr int kBatch = 2;        // chunks of weights per load batch
constexpr int kSlotsPerThread = (kSplitKMaxSlots + kThreads - 1) / kThreads;

// One item: rows [start, start + count) of expert e, count in 1..8.
struct Item {
  int e, start, count;
};

// Builds the block's item list in shared memory from the row mapping: slot order, an expert of
// c rows giving ceil(c / 8) items. Returns the item count (every thread).
__device__ int build_items(const GroupedGemmArgs& a, Item* items, int* scan) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  int e[kSlotsPerThread], cnt[kSlotsPerThread], start[kSlotsPerThread];
  int mine = 0;
#pragma unroll
  for (int i = 0; i < kSlotsPerThread; ++i) {
    const int slot = tid * kSlotsPerThread + i;
    e[i] = -1, cnt[i] = 0, start[i] = 0;
    if (slot < a.num_slots) e[i] = a.rows.expert_ids ? a.rows.expert_ids[slot] : slot;
  }
#pragma unroll
  for (int i = 0; i < kSlotsPerThread; ++i) {
    if (e[i] >= 0) {
      cnt[i] = a.rows.row_count[e[i]];
      start[i] = a.rows.row_start[e[i]];
    }
    mine += cnt[i] > 0 ? (cnt[i] + 7) / 8 : 0;
  }
  // Exclusive prefix of `mine` over the block.
  int incl = mine;
  for (int off = 1; off < 32; off *= 2) {
    const int v = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += v;
  }
  if (lane == 31) scan[warp] = incl;
  __syncthreads();
  int before = incl - mine, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += scan[w];
    total += scan[w];
  }
#pragma unroll
  for (int i = 0; i < kSlotsPerThread; ++i)
    for (int r = 0; r < cnt[i]; r += 8) {
      if (before < kSplitKMaxItems) items[before] = Item{e[i], start[i] + r, min(8, cnt[i] - r)};
      ++before;
    }
  __syncthreads();
  return min(total, kSplitKMaxItems);  // the host keeps the real count below the cap
}

// Partition of W steps over nw warps: warp i owns [first_step(i), first_step(i + 1)). W fits an
// int (the host bounds items, pairs and chunks); the products do not.
__device__ __forceinline__ int first_step(int i, int W, int nw) { return int(int64_t(i) * W / nw); }
// The warp whose range holds step x (0 <= x < W).
__device__ __forceinline__ int warp_of_step(int x, int W, int nw) {
  return int((int64_t(x + 1) * nw - 1) / W);
}

// Element (mt, rr) of lane l's accumulators: weight row l/4 (+8 for rr >= 2) of tile mt, item
// row 2 (l % 4) + (rr & 1).
__device__ __forceinline__ int acc_item_row(int lane, int rr) { return 2 * (lane % 4) + (rr & 1); }

// The finished sums of pair pt of item it, written as the GEMM's output.
template <bool GATED, bool OUT_F32>
__device__ __forceinline__ void store_pair(const GroupedGemmArgs& a, const Item& it, int pt,
                                           const float (&acc)[2][4], int lane) {
#pragma unroll
  for (int rr = 0; rr < 4; ++rr) {
    const int row = acc_item_row(lane, rr);
    if (row >= it.count) continue;
    const int col = lane / 4 + (rr >= 2 ? 8 : 0);
    const size_t out_row = size_t(it.start + row);
    if constexpr (GATED) {
      const float g = acc[0][rr] * a.alpha0[it.e], u = acc[1][rr] * a.alpha1[it.e];
      static_cast<uint16_t*>(a.out)[out_row * (a.n / 2) + pt * 16 + col] = f32_to_bf16_bits(silu(g) * u);
    } else {
      const float ad = a.alpha0[it.e];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const size_t o = out_row * a.n + pt * 32 + mt * 16 + col;
        if constexpr (OUT_F32)
          static_cast<float*>(a.out)[o] = acc[mt][rr] * ad;
        else
          static_cast<uint16_t*>(a.out)[o] = f32_to_bf16_bits(acc[mt][rr] * ad);
      }
    }
  }
}

// Warp gw's partial of the pair that is its first (seg 0) or last (seg 1): [2][4][32] floats.
__device__ __forceinline__ float* partial_of(const GroupedGemmArgs& a, int gw, int seg) {
  return a.splitk.partials + (size_t(gw) * 2 + seg) * kSplitKPartialFloats;
}

template <bool GATED, bool OUT_F32>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) moe_splitk_kernel(const GroupedGemmArgs a) {
  __shared__ Item items[kSplitKMaxItems];
  __shared__ int scan[kWarps];
  // GEMM2 may be scheduled as soon as SMs free up; it waits for this grid before reading act.
  asm volatile("griddepcontrol.launch_dependents;");
  const int n_items = build_items(a, items, scan);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = a.k / kChunkK;  // C: chunk-steps per pair
  const int pairs = a.n / 32;        // P: pairs per item
  const int W = n_items * pairs * chunks;
  const int nw = int(gridDim.x) * kWarps;
  const int gw = int(blockIdx.x) * kWarps + warp;
  const int x0 = first_step(gw, W, nw), x1 = first_step(gw + 1, W, nw);
  const size_t tiles = size_t(a.n) / 16;
  bool waited = false;
  // The (at most two) pairs this warp shares with others: published after its whole range, so
  // the fence and the atomics never stall its stream of loads. -1: none.
  int shared_q[2] = {-1, -1}, shared_n[2] = {0, 0};

  for (int x = x0; x < x1;) {
    const int q = x / chunks;  // pair index in the whole problem
    const int c_lo = x - q * chunks, c_hi = min(chunks, x1 - q * chunks);
    const Item it = items[q / pairs];
    const int pt = q % pairs;
    // [2 tiles] this lane's 16 weight bytes / 2 scale bytes of chunk 0
    const uint8_t* wp0 = a.w + (size_t(it.e) * tiles + 2 * size_t(pt)) * chunks * kTileChunkBytes + lane * 16;
    const uint8_t* wp1 = wp0 + size_t(chunks) * kTileChunkBytes;
    const uint8_t* sp0 = a.s + (size_t(it.e) * tiles + 2 * size_t(pt)) * chunks * kTileChunkScales + lane * 2;
    const uint8_t* sp1 = sp0 + size_t(chunks) * kTileChunkScales;
    const int r = it.start + min(lane / 4, it.count - 1);  // past the count: a valid row, dropped
    const uint16_t* xp = a.x + size_t(a.rows.gather ? a.rows.gather[r] : r) * a.k + 16 * (lane % 4);

    float acc[2][4] = {};  // [tile][c fragment]
    for (int c = c_lo; c < c_hi; c += kBatch) {
      uint4 wv[kBatch][2];
      uint32_t sv[kBatch][2];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (c + u < c_hi) {
          const size_t cc = size_t(c + u);
          wv[u][0] = ld_stream_u4(wp0 + cc * kTileChunkBytes);
          wv[u][1] = ld_stream_u4(wp1 + cc * kTileChunkBytes);
          sv[u][0] = ld_stream_u16(sp0 + cc * kTileChunkScales);
          sv[u][1] = ld_stream_u16(sp1 + cc * kTileChunkScales);
        }
      }
      // Launched as a programmatic dependent (GEMM2), the first weights are on their way before
      // this waits for the previous grid; activations, partials and counters come after.
      if (!waited) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        waited = true;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (c + u < c_hi) {
          const uint4 x_lo = ld_cached_u4(xp + size_t(c + u) * kChunkK);
          const uint4 x_hi = ld_cached_u4(xp + size_t(c + u) * kChunkK + 8);
          uint32_t sg[2], sg8[2];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) scale_pair_to_bf16x2(sv[u][mt], sg[mt], sg8[mt]);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint4& xh = j < 2 ? x_lo : x_hi;  // k 16t + 8 (j / 2) .. + 7
            const uint32_t b0 = (j & 1) ? xh.z : xh.x;
            const uint32_t b1 = (j & 1) ? xh.w : xh.y;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              uint32_t A[4];
              dequant_word(word_of(wv[u][mt], j), sg[mt], sg8[mt], A);
              mma_bf16_16816(acc[mt], A, b0, b1);
            }
          }
        }
      }
    }

    if (c_lo == 0 && c_hi == chunks) {
      store_pair<GATED, OUT_F32>(a, it, pt, acc, lane);  // the whole pair is this warp's
    } else {
      const int seg = x0 >= q * chunks ? 0 : 1;  // the pair is this warp's first or its last
      float* part = partial_of(a, gw, seg);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int rr = 0; rr < 4; ++rr)
          if (acc_item_row(lane, rr) < it.count) part[(mt * 4 + rr) * 32 + lane] = acc[mt][rr];
      shared_q[seg] = q;
      shared_n[seg] = c_hi - c_lo;
    }
    x = q * chunks + c_hi;
  }
  if (shared_q[0] < 0 && shared_q[1] < 0) return;

  // Publish: every lane's partial stores before lane 0's arrivals; the warp whose arrival
  // completes a pair's chunk count sums the pair's partials in warp order.
  __threadfence();
  __syncwarp();
  unsigned done[2] = {0, 0};
  if (lane == 0)
#pragma unroll
    for (int seg = 0; seg < 2; ++seg)
      if (shared_q[seg] >= 0)
        done[seg] = atomicAdd(a.splitk.counters + shared_q[seg], unsigned(shared_n[seg])) + shared_n[seg];
#pragma unroll
  for (int seg = 0; seg < 2; ++seg) {
    const int q = shared_q[seg];
    if (q < 0 || __shfl_sync(0xffffffffu, done[seg], 0) != unsigned(chunks)) continue;
    __threadfence();
    const Item it = items[q / pairs];
    const int w_first = warp_of_step(q * chunks, W, nw), w_last = warp_of_step((q + 1) * chunks - 1, W, nw);
    float sum[2][4] = {};
    for (int w = w_first; w <= w_last; ++w) {
      const int w_begin = first_step(w, W, nw);
      if (w_begin == first_step(w + 1, W, nw)) continue;  // an empty range wrote nothing
      const float* p = partial_of(a, w, w_begin >= q * chunks ? 0 : 1);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int rr = 0; rr < 4; ++rr)
          if (acc_item_row(lane, rr) < it.count) sum[mt][rr] += __ldcg(p + (mt * 4 + rr) * 32 + lane);
    }
    store_pair<GATED, OUT_F32>(a, it, q % pairs, sum, lane);
    if (lane == 0) a.splitk.counters[q] = 0;  // every arrival is in: ready for the next launch
  }
}

template <bool GATED, bool OUT_F32>
cudaError_t launch_kernel(const GroupedGemmArgs& a, cudaStream_t stream) {
  auto kernel = moe_splitk_kernel<GATED, OUT_F32>;
  int per_sm = 0;
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  if (err != cudaSuccess) return err;
  const int blocks = std::min(std::max(per_sm, 1) * current_device_sm_count(),
                              a.splitk.max_warps / kWarps);
  const KernelLaunch launch(dim3(unsigned(blocks)), dim3(kThreads), stream, a.pdl);
  return launch(kernel, a);
}

}  // namespace

std::string splitk_unusable_reason(const GroupedGemmArgs& a) {
  if (a.splitk.partials == nullptr || a.splitk.counters == nullptr) return "no split-k workspace";
  if (a.splitk.max_warps < kWarps) return "split-k workspace holds no warp";
  if (a.num_slots > kSplitKMaxSlots) return str("more than ", kSplitKMaxSlots, " slots");
  const int64_t items = splitk_max_items(a.num_slots, a.total_rows);
  if (items > kSplitKMaxItems) return str("up to ", items, " items; the kernel holds ", kSplitKMaxItems);
  const int64_t pairs = items * (a.n / 32);
  if (pairs > a.splitk.max_pairs)
    return str("up to ", pairs, " pairs; the workspace counts ", a.splitk.max_pairs);
  if (pairs * (a.k / kChunkK) > INT32_MAX) return "more chunk-steps than an int counts";
  return "";
}

cudaError_t launch_splitk(const GroupedGemmArgs& a, cudaStream_t stream) {
  if (!splitk_unusable_reason(a).empty()) return cudaErrorInvalidValue;
  if (a.num_slots <= 0 || a.n <= 0) return cudaSuccess;
  if (a.gated) return launch_kernel<true, false>(a, stream);
  if (a.out_f32) return launch_kernel<false, true>(a, stream);
  return launch_kernel<false, false>(a, stream);
}

}  // namespace tetra::moe_detail
