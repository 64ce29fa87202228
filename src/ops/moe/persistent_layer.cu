// See persistent_layer.h.
#include "ops/moe/persistent_layer.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/atomics.cuh"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/global_timer.cuh"
#include "core/kernel_launch.h"
#include "ops/moe/bf16_device.cuh"
#include "ops/moe/layout_device.cuh"
#include "ops/moe/router_dot.cuh"
#include "ops/moe/routing_device.cuh"
#include "ops/moe/w4a16_fragment.cuh"

namespace tetra::moe::cuda {
namespace {

using moe_detail::kChunkK;
using moe_detail::kTileChunkBytes;
using moe_detail::kTileChunkScales;
using detail::route_token_regs;
using detail::router_dot;
using detail::block_scan_small;

constexpr int kWarpsP = 4;  // warps splitting an item's k: the decode GEMMs' split, the same sums
constexpr int kThreadsP = kWarpsP * 32;
constexpr int kBatch = 2;      // chunks per warp load batch (as the decode GEMMs)
constexpr int kMinBlocks = 8;  // blocks per SM the registers must allow (see the kernel)
constexpr int kMaxPairs = 128;  // T * top_k; every block keeps the slots' rows in shared memory
static_assert(kMaxPairs >= kPersistentMaxTokens * 8);

// Counters, each on its own 128-byte line (pollers of one counter do not slow the L2 slice that
// serves another): [0] logits blocks done, [1 .. kRouteCopies] the routing flag (one copy per
// group of pollers), then blocks out, items handed out past the first round, GEMM1 tiles done per
// slot, GEMM2 arrivals per 32-row output tile.
constexpr int kLine = 32;  // words per counter
constexpr int kRouteCopies = 16;
constexpr int kLogitsDone = 0, kRouted = 1, kBlocksOut = kRouted + kRouteCopies,
              kClaimed = kBlocksOut + 1, kSlotDone0 = kClaimed + 1;
__device__ __forceinline__ uint32_t* counter(uint32_t* sync, int i) { return sync + i * kLine; }

// The launch's geometry (host-computed). Item list: GEMM1 tiles slot by slot (the shared slot
// first: it needs no routing), then GEMM2 tiles the same way.
struct Plan {
  PersistentLayer a;
  int max_routed = 0;    // routed slots min(E, T * top_k); the shared slot is max_routed
  int slots = 0;         // max_routed + has_shared
  int p1 = 0, p2 = 0;    // items per slot: GEMM1 gate/up tile pairs (I / 16), GEMM2 tiles (H / 32)
  int g1_items = 0, items = 0;
  int logit_block0 = 0, logit_blocks = 0;  // blocks computing router logits (one warp per expert)
  int sync_words = 0;
};

struct alignas(16) Smem {
  union {
    float red[kWarpsP][2][4][32];  // per-warp partial sums of an item, lane fastest
    struct {
      float sel[kWarpsP][kPersistentMaxExperts];  // routing: each warp's selection keys
      int32_t ids[kMaxPairs];
      float wts[kMaxPairs];
      int16_t slot_of[kPersistentMaxExperts];  // local expert -> slot, -1 inactive
      uint8_t active[kPersistentMaxExperts];
      int32_t scan[kWarpsP];
    } route;
  };
  // The routing as every block reads it once (block_routing): slot -> local expert, and
  // (slot, token) -> output row (-1: the token is not routed to the slot).
  int16_t slot_expert[kMaxPairs];
  int16_t slot_row[kMaxPairs][kPersistentMaxTokens];
  float bias[kPersistentMaxExperts];  // logits blocks: the correction bias, read before the wait
  uint32_t bcast;
  int next_item;
};

// A block's items after its first are handed out in list order by a counter, asked for as the
// block is about to come free (right after an item's MMAs, so the round trip overlaps its
// epilogue): a block that finishes early takes the next item. (Measured against round robin:
// 2-3% faster at 1 token, 6-10% at 8, where the block placement leaves SMs unevenly loaded.)
struct NextItem {
  uint32_t ticket = 0;
  bool asked = false;
  __device__ __forceinline__ void ask(uint32_t* counter) {
    if (!asked && threadIdx.x == 0) ticket = atomicAdd(counter, 1u);
    asked = true;
  }
};


// Profiling (PersistentLayer::stamps): globaltimer at a phase point, the earliest or latest
// over the blocks that reach it (thread 0).
__device__ __forceinline__ void stamp(unsigned long long* stamps, int i) {
  if (stamps && threadIdx.x == 0) {
    if (i == kStampKernelStart || i == kStampGemm1First || i == kStampGemm2First)
      atomicMin(stamps + i, static_cast<unsigned long long>(global_timer_ns()));
    else
      atomicMax(stamps + i, static_cast<unsigned long long>(global_timer_ns()));
  }
}

// Synchronisation between blocks (core/atomics.cuh). Waits poll with relaxed loads (served by
// L2) and acquire once, when the count is reached; arrivals are release reductions.
// The block continues once *p >= target; what the arrivals published before is then visible
// (read it through L2: __ldcg).
__device__ __forceinline__ void block_wait_geq(const uint32_t* p, uint32_t target) {
  if (threadIdx.x == 0) {
    for (unsigned sleep = 32; ld_relaxed_gpu(p) < target; sleep = min(2 * sleep, 256u)) __nanosleep(sleep);
    fence_acq_rel_gpu();
  }
  __syncthreads();
}

// Publishes every thread's stores so far (the barrier orders them before thread 0's release, as
// in a cooperative-groups grid sync), then counts this block at *p; every thread gets the count
// before it (the block with count - 1 is the last arrival and sees all the others' stores).
__device__ __forceinline__ uint32_t block_arrive(uint32_t* p, Smem& sm) {
  __syncthreads();
  if (threadIdx.x == 0) sm.bcast = atomic_add_acq_rel_gpu(p, 1u);
  __syncthreads();
  return sm.bcast;
}
// The same publication without waiting for the count (a fire-and-forget reduction).
__device__ __forceinline__ void block_release(uint32_t* p) {
  __syncthreads();
  if (threadIdx.x == 0) red_add_release_gpu(p, 1u);
}

// A coherent load cached in L1: for rows other blocks wrote in this launch, read only after the
// acquire that published them (no earlier copy can be in this SM's L1), and reused from L1 by the
// block's other warps.
__device__ __forceinline__ uint4 ld_ca_u4(const void* p) {
  uint4 v;
  asm volatile("ld.global.ca.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void pdl_wait(bool& waited) {
  if (!waited) asm volatile("griddepcontrol.wait;" ::: "memory");
  waited = true;
}

// The last logits block: routes every token (one warp per token, route_token_regs), lists the
// active local experts ascending as slots, maps every pair to its slot, then publishes.
template <bool kSoftmax>
__device__ __forceinline__ void route_and_publish(const Plan& g, Smem& sm) {
  const PersistentLayer& a = g.a;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int Eg = a.router.num_experts, K = a.router.top_k, S = a.T * K;
  for (int e = threadIdx.x; e < kPersistentMaxExperts; e += kThreadsP) sm.route.active[e] = 0;
  for (int i = threadIdx.x; i < g.max_routed * a.T; i += kThreadsP) a.slot_pair[i] = -1;
  for (int t = warp; t < a.T; t += kWarpsP) {
    route_token_regs<kSoftmax, kPersistentMaxExperts / 32>(
        a.logits + size_t(t) * Eg, a.bias ? sm.bias : nullptr, a.router, sm.route.sel[warp],
        sm.route.ids + t * K, sm.route.wts + t * K, lane);
    __syncwarp();  // sel is reused by the warp's next token
  }
  __syncthreads();
  int bad = 0;
  for (int p = threadIdx.x; p < S; p += kThreadsP) {
    const int32_t id = sm.route.ids[p], e = id - a.expert_begin;
    if (e >= 0 && e < a.E) sm.route.active[e] = 1;
    bad += id < 0 || id >= Eg;
    a.ids[p] = id;
    a.weights[p] = sm.route.wts[p];
  }
  __syncthreads();
  // Thread i owns local experts 2i and 2i + 1 (E <= 256).
  const int e0 = 2 * threadIdx.x;
  const int c0 = e0 < a.E && sm.route.active[e0], c1 = e0 + 1 < a.E && sm.route.active[e0 + 1];
  int total = 0;
  const int base = block_scan_small<kWarpsP>(c0 + c1, sm.route.scan, total);
  sm.route.slot_of[e0] = int16_t(c0 ? base : -1);
  sm.route.slot_of[e0 + 1] = int16_t(c1 ? base + c0 : -1);
  if (c0) a.slot_expert[base] = e0;
  if (c1) a.slot_expert[base + c0] = e0 + 1;
  __syncthreads();
  for (int p = threadIdx.x; p < S; p += kThreadsP) {
    const int32_t e = sm.route.ids[p] - a.expert_begin;
    const int slot = e >= 0 && e < a.E ? sm.route.slot_of[e] : -1;
    a.pair_slot[p] = slot;
    if (slot >= 0) a.slot_pair[slot * a.T + p / K] = p;  // a token's experts are distinct
  }
  bad = __syncthreads_count(bad);
  if (threadIdx.x == 0) {
    *a.num_routed = total;
    *a.dropped = bad;
  }
  __syncthreads();
  if (threadIdx.x < kRouteCopies) red_add_release_gpu(counter(a.sync, kRouted + threadIdx.x), 1u);
}

// The first time a block needs the routing: waits for it, then copies the slots' experts and
// rows to shared memory (one round of loads; items read them from there).
__device__ __forceinline__ void block_routing(const Plan& g, Smem& sm, bool& waited, bool& have) {
  if (have) return;
  const PersistentLayer& a = g.a;
  pdl_wait(waited);
  block_wait_geq(counter(a.sync, kRouted + blockIdx.x % kRouteCopies), 1);
  const int n = __ldcg(a.num_routed);
  for (int s = threadIdx.x; s < g.max_routed; s += kThreadsP)
    sm.slot_expert[s] = int16_t(s < n ? __ldcg(a.slot_expert + s) : -1);
  for (int i = threadIdx.x; i < g.max_routed * a.T; i += kThreadsP)
    sm.slot_row[i / a.T][i % a.T] = int16_t(__ldcg(a.slot_pair + i));
  __syncthreads();
  have = true;
}

// Local expert of a slot: the shared one, or the slot's active expert, -1 for a slot past the
// active ones.
__device__ __forceinline__ int expert_of_slot(const Plan& g, int slot, Smem& sm, bool& waited,
                                              bool& have) {
  if (slot == g.max_routed) return g.a.E;
  block_routing(g, sm, waited, have);
  return sm.slot_expert[slot];
}

// Output row of token t in a slot: its pair's row, the shared expert's own row, or -1 when t is
// not routed to the slot (routed slots: after block_routing).
__device__ __forceinline__ int row_of(const Plan& g, const Smem& sm, int slot, int t) {
  const PersistentLayer& a = g.a;
  if (slot == g.max_routed) return a.T * a.router.top_k + t;
  return sm.slot_row[slot][t];
}

// One item's MMAs for this warp: chunks [c_begin, c_end) of two 16-row weight tiles (w / s at the
// lane's bytes of chunk 0 of the first tile; the second tile is `chunks` chunks further) times 8
// token rows (xp: this lane's row at k = 16 * (lane % 4)). after_first() runs once per block,
// after the first weight batch is issued (waits that should not hold the weights back).
// kInLaunch: activations written earlier in this launch (coherent loads, not the read-only path).
template <bool kInLaunch, typename AfterFirst>
__device__ __forceinline__ void tile_pair_mma(const uint8_t* w, const uint8_t* s, int chunks,
                                              const uint16_t* xp, float (&acc)[2][4],
                                              AfterFirst after_first) {
  const int warp = threadIdx.x / 32;
  const int c_begin = warp * chunks / kWarpsP, c_end = (warp + 1) * chunks / kWarpsP;
  const uint8_t* w1 = w + size_t(chunks) * kTileChunkBytes;
  const uint8_t* s1 = s + size_t(chunks) * kTileChunkScales;
  uint4 wv[kBatch][2];   // [batch][tile] this lane's weight words
  uint32_t sv[kBatch][2];  // [batch][tile] its scale pairs
  auto load_w = [&](int c) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (c + u < c_end) {
        const size_t cc = size_t(c + u);
        wv[u][0] = moe_detail::ld_stream_u4(w + cc * kTileChunkBytes);
        wv[u][1] = moe_detail::ld_stream_u4(w1 + cc * kTileChunkBytes);
        sv[u][0] = moe_detail::ld_stream_u16(s + cc * kTileChunkScales);
        sv[u][1] = moe_detail::ld_stream_u16(s1 + cc * kTileChunkScales);
      }
    }
  };
  load_w(c_begin);
  after_first();
  for (int c = c_begin; c < c_end; c += kBatch) {
    if (c != c_begin) load_w(c);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (c + u < c_end) {
        uint4 xv[2];  // k 16t .. 16t+7 and +8 .. +15 of this lane's token, chunk c + u
        const uint16_t* px = xp + size_t(c + u) * kChunkK;
        if constexpr (kInLaunch) {
          xv[0] = ld_ca_u4(px);
          xv[1] = ld_ca_u4(px + 8);
        } else {
          xv[0] = moe_detail::ld_cached_u4(px);
          xv[1] = moe_detail::ld_cached_u4(px + 8);
        }
        uint32_t sg[2], sg8[2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) moe_detail::scale_pair_to_bf16x2(sv[u][mt], sg[mt], sg8[mt]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            uint32_t A[4];
            moe_detail::dequant_word(moe_detail::word_of(wv[u][mt], j), sg[mt], sg8[mt], A);
            const uint4& xh = xv[j >> 1];
            moe_detail::mma_bf16_16816(acc[mt], A, (j & 1) ? xh.z : xh.x, (j & 1) ? xh.w : xh.y);
          }
        }
      }
    }
  }
}

__device__ __forceinline__ void stash_partials(const float (&acc)[2][4], Smem& sm) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int r = 0; r < 4; ++r) sm.red[warp][mt][r][lane] = acc[mt][r];
  __syncthreads();
}

// GEMM1 tile pair p of a slot: act[row of (slot, t), 16p .. 16p + 15] = silu(gate) * up for every
// token t routed to the slot (all T are computed: one n8 MMA tile; the others are not stored).
__device__ __forceinline__ void gemm1_item(const Plan& g, int slot, int p, Smem& sm, bool& waited,
                                           bool& have, NextItem& next,
                                           unsigned long long* stamps) {
  const PersistentLayer& a = g.a;
  const int e = expert_of_slot(g, slot, sm, waited, have);
  if (e < 0) return;
  const int lane = threadIdx.x % 32;
  const float ag = a.w.alpha_gate[e], au = a.w.alpha_up[e];
  const int chunks = a.H / kChunkK;
  const size_t tile0 = size_t(e) * (2 * a.I / 16) + 2 * size_t(p);
  const uint16_t* xp = a.x + size_t(min(lane / 4, a.T - 1)) * a.H + 16 * (lane % 4);
  float acc[2][4] = {};
  tile_pair_mma<false>(a.w.w13 + tile0 * chunks * kTileChunkBytes + lane * 16,
                       a.w.s13 + tile0 * chunks * kTileChunkScales + lane * 2, chunks, xp, acc,
                       [&] {
                         pdl_wait(waited);
                         if (slot != g.max_routed) stamp(stamps, kStampGemm1First);
                         stamp(stamps, kStampGemm1LastStart);
                       });
  next.ask(counter(a.sync, kClaimed));
  stash_partials(acc, sm);
  {  // element (r, l): row l / 4 (+8 for r >= 2) of the tile pair, token 2 (l % 4) + (r & 1)
    const int r = threadIdx.x / 32, l = lane;
    float gs = 0.0f, us = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarpsP; ++w) {
      gs += sm.red[w][0][r][l];
      us += sm.red[w][1][r][l];
    }
    const int t = 2 * (l % 4) + (r & 1);
    const int row = t < a.T ? row_of(g, sm, slot, t) : -1;
    if (row >= 0) {
      const int n = p * 16 + l / 4 + (r >= 2 ? 8 : 0);
      a.act[size_t(row) * a.I + n] =
          moe_detail::f32_to_bf16_bits(moe_detail::silu(gs * ag) * (us * au));
    }
  }
  block_release(counter(a.sync, kSlotDone0 + slot));
  stamp(stamps, kStampGemm1Done);
}

// out[t, 32q .. 32q + 31] from every slot's GEMM2 rows, in the combine kernel's order. Every
// load of a batch of pairs is issued before its FMAs (one round trip per 8 pairs, not per pair).
__device__ __forceinline__ void combine_tile(const Plan& g, int q) {
  const PersistentLayer& a = g.a;
  const int K = a.router.top_k;
  const size_t shared_row = size_t(K) * a.T;
  for (int idx = threadIdx.x; idx < 32 * a.T; idx += kThreadsP) {
    const int t = idx / 32, n = q * 32 + idx % 32;
    const float sh = a.has_shared ? __ldcg(a.part + (shared_row + t) * a.H + n) : 0.0f;
    const float res = a.residual ? bf16_to_f32(a.residual[size_t(t) * a.H + n]) : 0.0f;
    float acc = 0.0f;
    for (int j0 = 0; j0 < K; j0 += 8) {
      int slot[8];
      float w[8], y[8];  // y of another rank's pair is a row nobody wrote: loaded, never used
#pragma unroll
      for (int b = 0; b < 8; ++b) {
        const int p = t * K + min(j0 + b, K - 1);
        slot[b] = __ldcg(a.pair_slot + p);
        w[b] = __ldcg(a.weights + p);
        y[b] = __ldcg(a.part + size_t(p) * a.H + n);
      }
#pragma unroll
      for (int b = 0; b < 8; ++b)
        if (j0 + b < K && slot[b] >= 0) acc = fmaf(w[b], y[b], acc);
    }
    if (a.has_shared) acc = acc + bf16_to_f32(f32_to_bf16(sh));  // a bf16 shared output's numerics
    if (a.residual) acc = acc + res;
    a.out[size_t(t) * a.H + n] = f32_to_bf16(acc);
  }
}

// GEMM2 tile q (32 output rows) of a slot into the part rows of its tokens; the last of the
// tile's slots combines.
__device__ __forceinline__ void gemm2_item(const Plan& g, int order, int slot, int q, Smem& sm,
                                           bool& waited, bool& have, NextItem& next,
                                           unsigned long long* stamps) {
  const PersistentLayer& a = g.a;
  const int e = expert_of_slot(g, slot, sm, waited, have);
  if (e >= 0) {
    const int lane = threadIdx.x % 32;
    const float ad = a.w.alpha_down[e];
    const int chunks = a.I / kChunkK;
    const size_t tile0 = size_t(e) * (a.H / 16) + 2 * size_t(q);
    // A token not routed to the slot reads any row; its column is never stored.
    const int row = max(row_of(g, sm, slot, min(lane / 4, a.T - 1)), 0);
    const uint16_t* xp = a.act + size_t(row) * a.I + 16 * (lane % 4);
    float acc[2][4] = {};
    tile_pair_mma<true>(a.w.w2 + tile0 * chunks * kTileChunkBytes + lane * 16,
                        a.w.s2 + tile0 * chunks * kTileChunkScales + lane * 2, chunks, xp, acc,
                        [&] {
                          pdl_wait(waited);
                          block_wait_geq(counter(a.sync, kSlotDone0 + slot), uint32_t(g.p1));
                          if (slot != g.max_routed) stamp(stamps, kStampGemm2First);
                          stamp(stamps, kStampGemm2LastStart);
                        });
    next.ask(counter(a.sync, kClaimed));
    stash_partials(acc, sm);
    for (int idx = threadIdx.x; idx < 2 * 4 * 32; idx += kThreadsP) {
      const int mt = idx / 128, r = (idx / 32) % 4, l = idx % 32;
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarpsP; ++w) s += sm.red[w][mt][r][l];
      const int t = 2 * (l % 4) + (r & 1);
      const int row = t < a.T ? row_of(g, sm, slot, t) : -1;
      if (row >= 0) a.part[size_t(row) * a.H + q * 32 + mt * 16 + l / 4 + (r >= 2 ? 8 : 0)] = s * ad;
    }
  }
  stamp(stamps, kStampGemm2Done);
  // The tile's last slot in item order combines once the others are in; they only release.
  uint32_t* tile_count = counter(a.sync, kSlotDone0 + g.slots + q);
  if (order < g.slots - 1) {
    block_release(tile_count);
  } else {
    block_wait_geq(tile_count, uint32_t(g.slots - 1));
    combine_tile(g, q);
    stamp(stamps, kStampCombineDone);
  }
}

// kMinBlocks = 8: the decode GEMMs' 64-register cap, 32 warps per SM (measured: 6 blocks of 80
// registers, without spills, were slower on GLM-5). kStamps: the profiled instantiation.
template <bool kSoftmax, bool kStamps>
__global__ void __launch_bounds__(kThreadsP, kMinBlocks) persistent_layer_kernel(const Plan g) {
  __shared__ Smem sm;
  const PersistentLayer& a = g.a;
  unsigned long long* const stamps = kStamps ? a.stamps : nullptr;  // profiled instantiation only
  bool waited = !a.pdl;
  bool have_routing = false;  // block_routing done
  // The next kernel may be scheduled once every block has started (so it cannot take the place
  // of a block this grid still waits for).
  asm volatile("griddepcontrol.launch_dependents;");
  stamp(stamps, kStampKernelStart);
  if (kStamps && a.block_sm && threadIdx.x == 0) {
    uint32_t smid;
    asm volatile("mov.u32 %0, %smid;" : "=r"(smid));
    a.block_sm[blockIdx.x] = smid;
  }

  const int lb = int(blockIdx.x) - g.logit_block0;
  if (lb >= 0 && lb < g.logit_blocks) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int Eg = a.router.num_experts, e = lb * kWarpsP + warp;
    const uint16_t* ge = a.gate + size_t(e) * a.H;
    if (e < Eg && lane == 0) moe_detail::prefetch_l2_bulk(ge, uint32_t(a.H) * 2);
    // Whichever logits block comes last routes: each keeps the bias (a model parameter) at hand,
    // so routing does not wait on another trip to memory.
    if (a.bias)
      for (int i = threadIdx.x; i < Eg; i += kThreadsP) sm.bias[i] = a.bias[i];
    pdl_wait(waited);
    if (e < Eg)
      for (int t = 0; t < a.T; ++t) {
        const float v = router_dot<uint16_t, true>(a.x + size_t(t) * a.H, ge, a.H, lane);
        if (lane == 0) a.logits[size_t(t) * Eg + e] = v;
      }
    if (block_arrive(counter(a.sync, kLogitsDone), sm) == uint32_t(g.logit_blocks - 1)) {
      stamp(stamps, kStampLogitsDone);
      route_and_publish<kSoftmax>(g, sm);
      stamp(stamps, kStampRouted);
    }
  }

  for (int i = blockIdx.x; i < g.items;) {
    NextItem next;
    const bool first_gemm = i < g.g1_items;
    const int j = first_gemm ? i : i - g.g1_items;
    const int per_slot = first_gemm ? g.p1 : g.p2;
    const int order = j / per_slot, tile = j % per_slot;
    // Order 0 is the shared slot when there is one.
    const int slot = !a.has_shared ? order : order == 0 ? g.max_routed : order - 1;
    if (first_gemm)
      gemm1_item(g, slot, tile, sm, waited, have_routing, next, stamps);
    else
      gemm2_item(g, order, slot, tile, sm, waited, have_routing, next, stamps);
    pdl_wait(waited);
    next.ask(counter(a.sync, kClaimed));  // an empty slot's item asks only now
    if (threadIdx.x == 0) sm.next_item = int(gridDim.x + next.ticket);
    __syncthreads();
    i = sm.next_item;
  }

  pdl_wait(waited);  // counters below may still be read by the previous launch otherwise
  stamp(stamps, kStampExit);
  if (block_arrive(counter(a.sync, kBlocksOut), sm) == gridDim.x - 1)
    for (int i = threadIdx.x; i < g.sync_words / kLine; i += kThreadsP) *counter(a.sync, i) = 0;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

using KernelFn = void (*)(Plan);
KernelFn kernel_for(bool softmax, bool stamps) {
  if (stamps) return softmax ? persistent_layer_kernel<true, true> : persistent_layer_kernel<false, true>;
  return softmax ? persistent_layer_kernel<true, false> : persistent_layer_kernel<false, false>;
}

// Blocks of a kernel resident per SM, per device (queried once per kernel and device).
int resident_per_sm(KernelFn k) {
  static std::mutex mu;
  static std::vector<std::pair<std::pair<KernelFn, int>, int>> cache;
  int dev = 0;
  TETRA_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [key, n] : cache)
    if (key.first == k && key.second == dev) return n;
  int n = 0;
  TETRA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kThreadsP, 0));
  cache.push_back({{k, dev}, n});
  return n;
}

}  // namespace

size_t persistent_sync_words(int T_max, int top_k, int E, int H) {
  const int max_routed = std::min(E, T_max * top_k);
  return (size_t(kSlotDone0) + size_t(max_routed) + 1 + size_t(H / 32)) * kLine;
}

std::string persistent_layer_unsupported_reason(const PersistentLayer& a) {
  const int Eg = a.router.num_experts, K = a.router.top_k;
  if (a.T < 1 || a.T > kPersistentMaxTokens)
    return str("takes 1..", kPersistentMaxTokens, " tokens, not ", a.T);
  if (Eg < 1 || Eg > kPersistentMaxExperts || a.E < 1 || a.E > Eg)
    return str("routes up to ", kPersistentMaxExperts, " experts (", Eg, " global, ", a.E,
               " local)");
  if (int64_t(a.T) * K > kMaxPairs) return str("takes up to ", kMaxPairs, " token-expert pairs");
  if (a.H % kChunkK != 0 || a.I % kChunkK != 0)
    return str("hidden ", a.H, " and intermediate ", a.I, " must be multiples of ", kChunkK);
  if (!aligned16(a.x) || !aligned16(a.gate)) return "x and the router weight must be 16-byte aligned";
  if (!a.out || !a.w.w13 || !a.logits || !a.ids || !a.weights || !a.pair_slot ||
      !a.slot_expert || !a.slot_pair || !a.num_routed || !a.dropped || !a.act || !a.part || !a.sync)
    return "a buffer is missing";
  return "";
}

cudaError_t persistent_layer(const PersistentLayer& a, cudaStream_t stream) {
  const std::string why = persistent_layer_unsupported_reason(a);
  if (!why.empty()) TETRA_FAIL("cuda persistent MoE layer: ", why);
  const bool softmax = a.router.scoring == Scoring::Softmax;
  Plan g;
  g.a = a;
  g.max_routed = std::min(a.E, a.T * a.router.top_k);
  g.slots = g.max_routed + (a.has_shared ? 1 : 0);
  g.p1 = a.I / 16;
  g.p2 = a.H / 32;
  g.g1_items = g.slots * g.p1;
  g.items = g.g1_items + g.slots * g.p2;
  g.sync_words = int(persistent_sync_words(a.T, a.router.top_k, a.E, a.H));
  const KernelFn kernel = kernel_for(softmax, a.stamps != nullptr);
  const int resident = resident_per_sm(kernel) * current_device_sm_count();
  const int grid = std::min(g.items, resident);
  g.logit_blocks = (a.router.num_experts + kWarpsP - 1) / kWarpsP;
  if (g.logit_blocks > grid)
    TETRA_FAIL("cuda persistent MoE layer: ", g.logit_blocks, " router blocks do not fit the ",
               grid, "-block grid");
  // The routed GEMM1 tiles' blocks compute the logits: they would wait for the routing anyway.
  g.logit_block0 = std::min(a.has_shared ? g.p1 : 0, grid - g.logit_blocks);
  const KernelLaunch launch(dim3(unsigned(grid)), dim3(kThreadsP), stream, a.pdl);
  return launch(kernel, g);
}

}  // namespace tetra::moe::cuda
