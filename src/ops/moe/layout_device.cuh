// Device pieces of the layout builders (a stable counting sort of the (token, k) pairs by
// expert), shared by layout.cu and the small-T token path (token_path.cu). See layout.cu.
#pragma once
#include <cstdint>

#include "moe/token_layout.h"
#include "ops/moe/moe_kernel_smem.h"

namespace tetra::moe::cuda::detail {

constexpr int kChunk = 1024;  // pairs per chunk = threads per block (32 warps)
constexpr int kWarps = kChunk / 32;
constexpr int64_t kFusedMaxPairs = 16384;
constexpr unsigned kFullMask = 0xffffffffu;

// The output of either layout, as the kernels see it.
struct LayoutOut {
  int E = 0, top_k = 0;            // E local experts
  int begin = 0, E_global = 0;     // the block [begin, begin + E) of [0, E_global)
  int max_m = 0;                   // > 0: masked layout
  int32_t* offsets = nullptr;      // contiguous [E + 1]
  int32_t* masked_m = nullptr;     // masked [E]
  int32_t* row_token = nullptr;    // [rows] token of each row
  int32_t* slot_of = nullptr;      // [T*top_k]
  RowRange* expert_rows = nullptr; // [E] optional
  int32_t* dropped = nullptr;      // [1] optional
};

// Shared memory of one block: counters, row bases, per-warp tallies (<= 32, so bytes).
struct Smem {
  int32_t* count;  // [E] pairs per expert, then the running rank cursor
  int32_t* base;   // [E] first row of expert e in the output
  uint8_t* tally;  // [kWarps, E] pairs of expert e in warp w of the current chunk
  int32_t* scan;   // [kWarps] warp sums for the block scan
};
inline __device__ Smem carve(char* raw, int E) {
  Smem s;
  s.count = reinterpret_cast<int32_t*>(raw);
  s.base = s.count + E;
  s.scan = s.base + E;
  s.tally = reinterpret_cast<uint8_t*>(s.scan + kWarps);
  return s;
}
static_assert(moe_smem::layout(1) == 8 + kWarps * 4 + kWarps, "carve's bytes for E experts");

// Local expert of a global id, or -1 when another rank holds it (or the id is bad).
__device__ __forceinline__ int local_expert(int32_t id, const LayoutOut& o) {
  const int32_t e = id - o.begin;
  return e >= 0 && e < o.E ? e : -1;
}
// Ids outside [0, E_global) are counted as dropped; another rank's ids are not.
__device__ __forceinline__ bool bad_id(int32_t id, const LayoutOut& o) {
  return id < 0 || id >= o.E_global;
}

// Inclusive prefix sum of one int per lane over the warp.
inline __device__ int warp_inclusive_scan(int v) {
  const int lane = threadIdx.x % 32;
  for (int off = 1; off < 32; off *= 2) {
    const int n = __shfl_up_sync(kFullMask, v, off);
    if (lane >= off) v += n;
  }
  return v;
}

// Exclusive prefix sum of one int per thread over a block of kBlockWarps warps, each thread
// adding up the warps' totals itself (small blocks); total to `total`. scan [kBlockWarps] may be
// reused after the next barrier.
template <int kBlockWarps>
inline __device__ int block_scan_small(int v, int32_t* scan, int& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int incl = warp_inclusive_scan(v);
  if (lane == 31) scan[warp] = incl;
  __syncthreads();
  int before = 0;
  total = 0;
  for (int w = 0; w < kBlockWarps; ++w) {
    const int s = scan[w];
    if (w < warp) before += s;
    total += s;
  }
  return before + incl - v;
}

// Exclusive prefix sum over the block (kChunk threads, one value each); total to `total`.
inline __device__ int block_exclusive_scan(int v, int32_t* scan, int& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int incl = warp_inclusive_scan(v);
  if (lane == 31) scan[warp] = incl;
  __syncthreads();
  if (warp == 0) scan[lane] = warp_inclusive_scan(scan[lane]);
  __syncthreads();
  total = scan[kWarps - 1];
  const int before = warp == 0 ? 0 : scan[warp - 1];
  __syncthreads();  // scan[] is reused by the next call
  return before + incl - v;
}

// From s.count (pairs per expert, E <= kChunk): offsets / masked_m, expert_rows, s.base.
inline __device__ void write_expert_info(const Smem& s, const LayoutOut& o) {
  const int e = threadIdx.x;
  const int cnt = e < o.E ? s.count[e] : 0;
  if (o.max_m > 0) {
    if (e < o.E) {
      const int used = min(cnt, o.max_m);
      o.masked_m[e] = used;
      s.base[e] = e * o.max_m;
      if (o.expert_rows) o.expert_rows[e] = RowRange{e * o.max_m, used};
    }
  } else {
    int total = 0;
    const int start = block_exclusive_scan(cnt, s.scan, total);
    if (e < o.E) {
      o.offsets[e] = start;
      s.base[e] = start;
      if (o.expert_rows) o.expert_rows[e] = RowRange{start, cnt};
    }
    if (e == 0) o.offsets[o.E] = total;
  }
}

// Places pairs [begin, begin + kChunk) of S. s.count holds each expert's rank cursor on entry
// and is advanced past this chunk; s.tally must be zero on entry and is zero again on exit.
inline __device__ void place_chunk(const int32_t* ids, int64_t S, int64_t begin, const Smem& s,
                            const LayoutOut& o) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t p = begin + threadIdx.x;
  const bool in = p < S;
  const int32_t raw = in ? ids[p] : -1;
  const int key = in ? local_expert(raw, o) : -1;
  const bool valid = key >= 0;
  const unsigned peers = __match_any_sync(kFullMask, key);
  const int lane_rank = __popc(peers & ((1u << lane) - 1u));
  const bool last_peer = lane == 31 - __clz(peers);
  if (valid && lane_rank == 0) s.tally[warp * o.E + key] = uint8_t(__popc(peers));
  __syncthreads();
  int rank = 0;
  if (valid) {
    rank = s.count[key] + lane_rank;
    for (int w = 0; w < warp; ++w) rank += s.tally[w * o.E + key];
  }
  __syncthreads();  // every read of count/tally is done before they change
  if (valid) {
    if (lane_rank == 0) s.tally[warp * o.E + key] = 0;
    if (last_peer) atomicMax(&s.count[key], rank + 1);  // the chunk's last pair of `key` wins
  }
  if (in) {
    int row = -1;
    if (valid) {
      if (o.max_m == 0) {
        row = s.base[key] + rank;
      } else if (rank < o.max_m) {
        row = s.base[key] + rank;
      }
    }
    o.slot_of[p] = row;
    if (row >= 0) {
      o.row_token[row] = int32_t(p / o.top_k);
    } else if (o.dropped && (valid || bad_id(raw, o))) {  // over max_m, or a bad id
      atomicAdd(o.dropped, 1);
    }
  }
  __syncthreads();
}

inline __device__ void zero_tally(const Smem& s, int E) {
  for (int i = threadIdx.x; i < kWarps * E; i += kChunk) s.tally[i] = 0;
}

// Counts, scans and places all S pairs in one block of kChunk threads (S small). s in dynamic
// shared memory of moe_smem::layout(E). row_token / dropped are pre-set by the caller.
inline __device__ void layout_one_block(const int32_t* __restrict__ ids, int64_t S, const Smem& s,
                                        const LayoutOut& o) {
  for (int e = threadIdx.x; e < o.E; e += kChunk) s.count[e] = 0;
  zero_tally(s, o.E);
  __syncthreads();
  for (int64_t p = threadIdx.x; p < S; p += kChunk) {
    const int e = local_expert(ids[p], o);
    if (e >= 0) atomicAdd(&s.count[e], 1);
  }
  __syncthreads();
  write_expert_info(s, o);
  __syncthreads();
  for (int e = threadIdx.x; e < o.E; e += kChunk) s.count[e] = 0;  // now the rank cursor
  __syncthreads();
  for (int64_t begin = 0; begin < S; begin += kChunk) place_chunk(ids, S, begin, s, o);
}

}  // namespace tetra::moe::cuda::detail
