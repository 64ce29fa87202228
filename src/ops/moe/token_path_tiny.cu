// See token_path_tiny.h.
#include "ops/moe/token_path_tiny.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "core/atomics.cuh"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/global_timer.cuh"
#include "core/kernel_launch.h"
#include "ops/moe/bf16_device.cuh"
#include "ops/moe/layout_device.cuh"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/router_dot.cuh"
#include "ops/moe/routing_device.cuh"
#include "perf/block_stamps.cuh"

namespace tetra::moe::cuda::detail {

namespace {

constexpr int kWarpsT = kTinyThreads / 32;
constexpr int kExpertsPerThread = kMaxExperts / kTinyThreads;  // for the expert scan
static_assert(kExpertsPerThread * kTinyThreads == kMaxExperts);

// Experts per logits block, at least: GLM-4.5-Air (128 experts) then runs 32 blocks, not 128.
// Fewer blocks to place while the kernel before still holds the SMs and fewer arrivals on the
// block counter: H200, Air decode batch 1 -1.2% per step (three rounds; batch 4 unchanged, the
// layer at 1 token -1%); 8 per block lost at 4 tokens (+1.5%) and on GLM-5's layer.
constexpr int kMinExpertsPerBlock = 4;

// Dynamic shared memory the kernels may use (0 until tiny_token_path_setup).
std::atomic<int> g_smem_limit{0};

struct TinyArgs {
  SmallTokenPath a;
  LayoutOut lo;
  int T = 0;
  int G = 0;            // experts per block in the logits phase
  int TC = 0;           // tokens per shared-memory chunk in the logits phase
  int route_warps = 0;  // warps of the last block routing tokens
  bool scored = false;  // sigmoid scores, keys and group keys first computed by the whole block
  int bias_off = -1;    // byte offset of every block's shared copy of the bias, -1: read global
  // Profiling only (tiny_token_path_profiled): phase stamps, see there.
  unsigned long long* stamps = nullptr;
  unsigned long long* block_stamps = nullptr;  // perf/block_stamps.h (nullptr: none)
  int block_stamp_launch = 0;
};

// The last block's shared memory: ids, weights, per-expert counts and bases, scan, tallies, then
// each routing warp's selection keys.
__host__ __device__ inline size_t tail_route_offset(int El) {
  return (size_t(2) * kTinyThreads * 4 + size_t(El) * 8 + kWarpsT * 4 + size_t(kWarpsT) * El +
          15) / 16 * 16;
}
size_t tail_bytes(int El, int Eg, int route_warps) {
  return tail_route_offset(El) + size_t(route_warps) * Eg * sizeof(float);
}
// The scored routing's tail: keys and scores [T, Eg] f32, group keys [T, 32] u32.
size_t tail_bytes_scored(int El, int Eg, int T) {
  return tail_route_offset(El) + size_t(T) * (size_t(2) * Eg + 32) * 4;
}

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem_src) : "memory");
}
// stamps[i] = globaltimer, stamps[8 + i] = clock64 (thread 0 of this block, when profiling).
__device__ __forceinline__ void stamp(unsigned long long* stamps, int i) {
  if (stamps && threadIdx.x == 0) {
    stamps[i] = global_timer_ns();
    stamps[8 + i] = static_cast<unsigned long long>(clock64());
  }
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

// Block b of n asks the L2 for its share of [p, p + bytes), widened to 16-byte boundaries (the
// bulk prefetch's granule; cudaMalloc'd buffers are 256-byte aligned), in pieces of 32 KB.
__device__ void warm_l2_share(const void* p, size_t bytes, int b, int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (bytes == 0) return;
  const uint64_t lo = reinterpret_cast<uint64_t>(p) & ~uint64_t(15);
  const uint64_t hi = (reinterpret_cast<uint64_t>(p) + bytes + 15) & ~uint64_t(15);
  const uint64_t share = ((hi - lo + n - 1) / n + 15) & ~uint64_t(15);
  const uint64_t end = min(hi, lo + share * (b + 1));
  constexpr uint64_t kPiece = 32 << 10;
  for (uint64_t at = lo + share * b; at < end; at += kPiece)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at),
                 "r"(uint32_t(min(kPiece, end - at)))
                 : "memory");
#endif
}

// The folded RMSNorm (SmallTokenPath::pre_norm_weight, T = 1): the staged row xs [H] is h;
// normalised in place as rms_norm_vec_kernel does (y = h * inv_rms * weight, rounded to bf16).
// Thread t owns pieces t + j * kTinyThreads, the ones it copied (visible to it after its
// cp.async wait), so the only barrier is the one that joins the warps' sums of squares; every
// block adds them in the same order and gets the same inv_rms. Block 0 stores the row to `out`.
__device__ __forceinline__ void normalise_staged_row(uint16_t* xs, int H,
                                                     const uint4 (&weight)[kTinyPreNormPieces],
                                                     float eps, uint16_t* out, float* warp_ss) {
  const int H8 = H / 8;
  float v[kTinyPreNormPieces][8];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kTinyPreNormPieces; ++j) {
    const int i = threadIdx.x + j * kTinyThreads;
    if (i >= H8) continue;
    const uint4 p = *reinterpret_cast<const uint4*>(xs + 8 * size_t(i));
    const uint32_t w4[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[j][e] = bf16_to_f32(uint16_t(w4[e / 2] >> (16 * (e % 2))));
      ss += v[j][e] * v[j][e];
    }
  }
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if (threadIdx.x % 32 == 0) warp_ss[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarpsT; ++w) total += warp_ss[w];
  const float inv_rms = rsqrtf(total / float(H) + eps);
#pragma unroll
  for (int j = 0; j < kTinyPreNormPieces; ++j) {
    const int i = threadIdx.x + j * kTinyThreads;
    if (i >= H8) continue;
    const uint32_t g4[4] = {weight[j].x, weight[j].y, weight[j].z, weight[j].w};
    uint32_t y4[4];
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const float g0 = bf16_to_f32(uint16_t(g4[e / 2]));
      const float g1 = bf16_to_f32(uint16_t(g4[e / 2] >> 16));
      const __nv_bfloat162 y = __floats2bfloat162_rn(v[j][e] * inv_rms * g0,
                                                      v[j][e + 1] * inv_rms * g1);
      y4[e / 2] = *reinterpret_cast<const uint32_t*>(&y);
    }
    const uint4 y = make_uint4(y4[0], y4[1], y4[2], y4[3]);
    *reinterpret_cast<uint4*>(xs + 8 * size_t(i)) = y;
    if (blockIdx.x == 0) reinterpret_cast<uint4*>(out)[i] = y;
  }
}

template <bool kSoftmax, int kPerLane>
__global__ void __launch_bounds__(kTinyThreads) tiny_token_path_kernel(const TinyArgs g) {
  extern __shared__ __align__(16) char smem[];
  __shared__ int last_block;
  const SmallTokenPath& a = g.a;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int Eg = a.router.num_experts, K = a.router.top_k, T = g.T, H = a.H, H8 = H / 8;

  // 1. Logits of experts [e0, e0 + ne) for every token.
  const int e0 = blockIdx.x * g.G, ne = min(g.G, Eg - e0);
  uint16_t* ws = reinterpret_cast<uint16_t*>(smem);  // [G, H] gate rows e0..
  uint16_t* xs = ws + size_t(g.G) * H;               // [TC, H] rows of the current token chunk
  const uint16_t* gsrc = a.gate + size_t(e0) * H;
  unsigned long long* stamps = blockIdx.x == 0 ? g.stamps : nullptr;
  stamp(stamps, 0);
  const uint64_t t_start = perf::stamp_time();
  for (int i = threadIdx.x; i < ne * H8; i += kTinyThreads)
    cp_async16(ws + size_t(i) * 8, gsrc + size_t(i) * 8);
  if (threadIdx.x < SmallTokenPath::kMaxWarm)
    warm_l2_share(a.warm[threadIdx.x], a.warm_bytes[threadIdx.x], blockIdx.x, gridDim.x);
  // Every block keeps a copy of the bias: the last one routes without another trip to memory.
  float* bias_s = reinterpret_cast<float*>(smem + (g.bias_off < 0 ? 0 : g.bias_off));  // [Eg]
  if (g.bias_off >= 0)
    for (int i = threadIdx.x; i < Eg / 4; i += kTinyThreads)
      cp_async16(bias_s + 4 * i, a.bias + 4 * i);
  // The folded RMSNorm's weight (a parameter): this thread's pieces, before the wait.
  const bool pre_norm = a.pre_norm_weight != nullptr;
  uint4 norm_w[kTinyPreNormPieces] = {};
  __shared__ float warp_ss[kWarpsT];
  if (pre_norm) {
#pragma unroll
    for (int j = 0; j < kTinyPreNormPieces; ++j) {
      const int i = threadIdx.x + j * kTinyThreads;
      if (i < H8) norm_w[j] = __ldg(reinterpret_cast<const uint4*>(a.pre_norm_weight) + i);
    }
  }
  // As a programmatic dependent launch, the gate rows (weights) stream in while the previous
  // kernel drains; everything it may write (x) or read (this kernel's outputs) waits for it.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const uint64_t t_waited = perf::stamp_time();
  for (int t0 = 0; t0 < T; t0 += g.TC) {
    const int tc = min(g.TC, T - t0);
    const uint16_t* xsrc = a.x + size_t(t0) * H;
    for (int i = threadIdx.x; i < tc * H8; i += kTinyThreads)
      cp_async16(xs + size_t(i) * 8, xsrc + size_t(i) * 8);
    cp_async_wait_all();
    if (pre_norm) normalise_staged_row(xs, H, norm_w, a.pre_norm_eps, a.pre_norm_out, warp_ss);
    __syncthreads();
    if (t0 == 0) stamp(stamps, 1);
    for (int d = warp; d < tc * ne; d += kWarpsT) {
      const int t = d / ne, j = d - t * ne;
      const float v = router_dot<uint16_t, true>(xs + size_t(t) * H, ws + size_t(j) * H, H, lane);
      if (lane == 0) a.logits[size_t(t0 + t) * Eg + e0 + j] = v;
    }
    __syncthreads();  // xs is refilled by the next chunk
  }
  __syncthreads();  // the block's logits stores, before thread 0 counts it in (release)
  stamp(stamps, 2);
  const uint64_t t_logits = perf::stamp_time();
  if (a.logits_only) {  // GEMM1 routes (it waits for this whole grid)
    // Trigger GEMM1 (a programmatic dependent) now rather than at this grid's completion: its
    // launch then overlaps the last blocks' exit and the grid's completion, while GEMM1 still
    // waits for that completion before reading the logits. Block stamps: GEMM1's blocks start
    // ~0.35 us earlier per layer; GLM-4.5-Air batch 1 -0.1..-0.5% in three calls, inside or at
    // the edge of their null controls (bench/results/2026-12-03-session45-h200.md).
    asm volatile("griddepcontrol.launch_dependents;");
    if (threadIdx.x == 0)
      perf::block_stamp(g.block_stamps, perf::kStampTokenPath, g.block_stamp_launch, t_start,
                        t_waited, t_logits, 0, perf::stamp_time());
    return;
  }
  if (threadIdx.x == 0) last_block = atomic_add_acq_rel_gpu(a.counter, 1u) == gridDim.x - 1;
  __syncthreads();  // the last block's reads below come after thread 0's acquire
  if (!last_block) {
    if (threadIdx.x == 0)
      perf::block_stamp(g.block_stamps, perf::kStampTokenPath, g.block_stamp_launch, t_start,
                        t_waited, t_logits, 0, perf::stamp_time());
    return;
  }
  // Every block's logits are visible now (read through L2: __ldcg).
  stamps = g.stamps;
  stamp(stamps, 3);
  const float* bias = g.bias_off >= 0 ? bias_s : a.bias;

  // 2. Routing, one warp per token; ids and weights to shared memory.
  const LayoutOut& lo = g.lo;
  const int El = lo.E, S = T * K;
  const bool masked = lo.max_m > 0;
  int32_t* ids_s = reinterpret_cast<int32_t*>(smem);          // [kTinyThreads] pair ids
  float* wts_s = reinterpret_cast<float*>(ids_s + kTinyThreads);  // [kTinyThreads] weights
  int32_t* count = reinterpret_cast<int32_t*>(wts_s + kTinyThreads);  // [El] pairs per expert
  int32_t* base = count + El;                                   // [El] first row of expert e
  int32_t* scan = base + El;                                    // [kWarpsT]
  uint8_t* tally = reinterpret_cast<uint8_t*>(scan + kWarpsT);  // [kWarpsT, El] pairs per warp
  float* sel_s = reinterpret_cast<float*>(smem + tail_route_offset(El));  // [route_warps, Eg]
  for (int e = threadIdx.x; e < El; e += kTinyThreads) count[e] = 0;
  for (int i = threadIdx.x; i < kWarpsT * El / 4; i += kTinyThreads)
    reinterpret_cast<uint32_t*>(tally)[i] = 0;  // El * kWarpsT bytes: a multiple of 4
  if (!kSoftmax && g.scored) {
    // Few tokens: one warp per token would run E/32 sigmoids and (grouped routing) n_group/32
    // group visits one after another; the whole block computes them first instead.
    float* keys = sel_s;                                             // [T, Eg]
    float* scores = keys + size_t(T) * Eg;                           // [T, Eg]
    uint32_t* group_keys = reinterpret_cast<uint32_t*>(scores + size_t(T) * Eg);  // [T, 32]
    for (int i = threadIdx.x; i < T * Eg; i += kTinyThreads) {
      const float sc = math::sigmoid_f32(__ldcg(a.logits + i));
      scores[i] = sc;
      keys[i] = score_selection_key(sc, bias, i % Eg);
    }
    __syncthreads();
    const int ng = a.router.n_group;
    if (ng != 1) {
      const int group_size = Eg / ng;
      for (int q = warp; q < T * ng; q += kWarpsT) {
        const int t = q / ng, grp = q - t * ng;
        const uint32_t gk = group_order_key_warp(keys + size_t(t) * Eg + grp * group_size,
                                                 group_size, lane);
        if (lane == 0) group_keys[t * 32 + grp] = gk;
      }
      __syncthreads();
    }
    for (int t = warp; t < T; t += kWarpsT)
      route_token_scored<kPerLane>(scores + size_t(t) * Eg, keys + size_t(t) * Eg,
                                   group_keys + t * 32, a.router, ids_s + t * K, wts_s + t * K,
                                   lane);
  } else if (warp < g.route_warps) {
    float* sel = sel_s + size_t(warp) * Eg;
    for (int t = warp; t < T; t += g.route_warps) {
      route_token_regs<kSoftmax, kPerLane>(a.logits + size_t(t) * Eg, bias, a.router, sel,
                                           ids_s + t * K, wts_s + t * K, lane);
      __syncwarp();  // sel is reused by the next token
    }
  }
  __syncthreads();
  stamp(stamps, 4);
  const uint64_t t_routed = perf::stamp_time();

  // 3. Layout: pair p = threadIdx.x; its rank among the earlier pairs of its expert.
  const int p = threadIdx.x;
  const bool in = p < S;
  const int32_t raw = in ? ids_s[p] : -1;
  if (in) {
    a.ids[p] = raw;
    a.weights[p] = wts_s[p];
  }
  const int key = in ? local_expert(raw, lo) : -1;
  const unsigned peers = __match_any_sync(kFullMask, key);
  const int lane_rank = __popc(peers & ((1u << lane) - 1u));
  if (key >= 0 && lane_rank == 0) {
    tally[warp * El + key] = uint8_t(__popc(peers));
    atomicAdd(&count[key], __popc(peers));
  }
  __syncthreads();
  int rank = lane_rank;
  if (key >= 0)
    for (int w = 0; w < warp; ++w) rank += tally[w * El + key];

  // 4. Per expert: rows (low 16 bits, <= kTinyThreads) and active (high bits) in one scan.
  int c[kExpertsPerThread];
  int packed = 0;
  for (int i = 0; i < kExpertsPerThread; ++i) {
    const int e = threadIdx.x * kExpertsPerThread + i;
    c[i] = e < El ? count[e] : 0;
    packed += (masked ? min(c[i], lo.max_m) : c[i]) | (c[i] > 0 ? 1 << 16 : 0);
  }
  int total = 0;
  int run = block_scan_small<kWarpsT>(packed, scan, total);
  const int total_rows = total & 0xffff, total_active = total >> 16;
  const RowsPrep& r = a.rows;
  for (int i = 0; i < kExpertsPerThread; ++i) {
    const int e = threadIdx.x * kExpertsPerThread + i;
    if (e >= El) break;
    const int rows_e = masked ? min(c[i], lo.max_m) : c[i];
    const int start = run & 0xffff, pos = run >> 16;
    if (masked) {
      lo.masked_m[e] = rows_e;
      base[e] = e * lo.max_m;
    } else {
      lo.offsets[e] = start;
      r.row_count[e] = rows_e;
      base[e] = start;
    }
    if (c[i] > 0 && pos < r.num_slots) r.slots[pos] = e;
    run += rows_e | (c[i] > 0 ? 1 << 16 : 0);
  }
  for (int i = threadIdx.x; i < r.num_slots; i += kTinyThreads)
    if (i >= total_active) r.slots[i] = -1;
  if (threadIdx.x == 0) {
    if (!masked) lo.offsets[El] = total_rows;
    if (r.sh_rows) {
      r.sh_rows[0] = 0;
      r.sh_rows[1] = T;
    }
    if (r.shared_slot) {
      r.slots[r.num_slots] = El;
      if (masked) {
        lo.masked_m[El] = T;
      } else {
        r.row_count[El] = T;
      }
    }
  }
  if (r.shared_slot) {
    const int first = masked ? El * lo.max_m : total_rows;
    for (int t = threadIdx.x; t < T; t += kTinyThreads) lo.row_token[first + t] = t;
  }
  __syncthreads();  // base[] is complete
  stamp(stamps, 5);

  // 5. Placement; pairs over max_m or with bad ids are dropped and counted.
  bool drop = false;
  if (in) {
    int row = -1;
    if (key >= 0 && (!masked || rank < lo.max_m)) row = base[key] + rank;
    lo.slot_of[p] = row;
    if (row >= 0) {
      lo.row_token[row] = p / K;
    } else {
      drop = key >= 0 || bad_id(raw, lo);
    }
  }
  const int dropped = __syncthreads_count(drop);
  if (threadIdx.x == 0) {
    if (lo.dropped) *lo.dropped = dropped;
    *a.counter = 0;  // every block has counted: ready for the next launch
  }
  stamp(stamps, 6);
  if (stamps && threadIdx.x == 0) stamps[7] = blockIdx.x;
  // Block stamps: start, wait returned, logits counted, routed, end (0: not this block's phase).
  if (threadIdx.x == 0)
    perf::block_stamp(g.block_stamps, perf::kStampTokenPath, g.block_stamp_launch, t_start,
                      t_waited, t_logits, t_routed, perf::stamp_time());
}

template <bool kSoftmax, int kPerLane>
void set_limit(int bytes) {
  TETRA_CUDA_CHECK(cudaFuncSetAttribute(tiny_token_path_kernel<kSoftmax, kPerLane>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  // The most shared memory, as the expert GEMMs around it: no L1/shared reconfiguration between
  // them (the kernel reads nothing through L1 that it needs to keep).
  TETRA_CUDA_CHECK(cudaFuncSetAttribute(tiny_token_path_kernel<kSoftmax, kPerLane>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        int(cudaSharedmemCarveoutMaxShared)));
}

template <bool kSoftmax, int kPerLane>
int static_smem() {
  cudaFuncAttributes fa{};
  TETRA_CUDA_CHECK(cudaFuncGetAttributes(&fa, tiny_token_path_kernel<kSoftmax, kPerLane>));
  return int(fa.sharedSizeBytes);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void tiny_token_path_setup() {
  const int optin = current_device_smem_optin_per_block();
  const int st = std::max({static_smem<false, 8>(), static_smem<false, 32>(),
                           static_smem<true, 8>(), static_smem<true, 32>()});
  const int limit = optin - st;
  if (limit <= 0) return;
  set_limit<false, 8>(limit);
  set_limit<false, 32>(limit);
  set_limit<true, 8>(limit);
  set_limit<true, 32>(limit);
  // The smallest limit any device was given (several devices may be set up).
  int cur = g_smem_limit.load();
  while ((cur == 0 || limit < cur) && !g_smem_limit.compare_exchange_weak(cur, limit)) {
  }
}

bool tiny_token_path_fits(const SmallTokenPath& a, int T) {
  const int limit = g_smem_limit.load();
  const int Eg = a.router.num_experts, El = a.rows.E, K = a.router.top_k;
  const size_t row_bytes = size_t(a.H) * 2;
  return limit > 0 && T >= 1 && int64_t(T) * K <= kTinyThreads && Eg >= 1 &&
         Eg <= kMaxExperts && El >= 1 && El <= kMaxExperts && a.H >= 8 && a.H % 8 == 0 &&
         aligned16(a.x) && aligned16(a.gate) && 2 * row_bytes <= size_t(limit) &&
         tail_bytes(El, Eg, 1) <= size_t(limit) && a.rows.offsets == a.offsets &&
         a.rows.masked_m == a.masked_m && a.rows.row_token == a.row_token;
}

namespace {

cudaError_t launch_tiny(const SmallTokenPath& a, int T, cudaStream_t stream,
                        unsigned long long* stamps) {
  if (!tiny_token_path_fits(a, T)) TETRA_FAIL("cuda tiny token path: arguments do not fit");
  const int limit = g_smem_limit.load();
  const int Eg = a.router.num_experts, El = a.rows.E;
  const int sms = current_device_sm_count();
  TinyArgs g;
  g.a = a;
  g.T = T;
  g.lo = layout_out_of(a);
  // Logits: at most one block per SM and at least kMinExpertsPerBlock experts per block (G), the
  // gate rows plus as many token rows as fit in shared memory.
  const size_t row_bytes = size_t(a.H) * 2;
  g.G = std::max(kMinExpertsPerBlock, (Eg + sms - 1) / std::max(sms, 1));
  while (g.G > 1 && size_t(g.G + 1) * row_bytes > size_t(limit)) --g.G;
  g.TC = int(std::min<size_t>(T, (size_t(limit) - size_t(g.G) * row_bytes) / row_bytes));
  g.route_warps = std::min(T, kWarpsT);
  while (g.route_warps > 1 && tail_bytes(El, Eg, g.route_warps) > size_t(limit)) --g.route_warps;
  const bool softmax = a.router.scoring == Scoring::Softmax;
  // Block-wide scores when each thread then has fewer sigmoids than a routing lane would.
  g.scored = !softmax && a.router.n_group <= 32 &&
             (T * Eg + kTinyThreads - 1) / kTinyThreads < (Eg + 31) / 32 &&
             tail_bytes_scored(El, Eg, T) <= size_t(limit);
  const size_t tail = g.scored ? tail_bytes_scored(El, Eg, T) : tail_bytes(El, Eg, g.route_warps);
  size_t smem = std::max(size_t(g.G + g.TC) * row_bytes, tail);
  smem = (smem + 15) / 16 * 16;
  if (a.bias && aligned16(a.bias) && Eg % 4 == 0 && smem + size_t(Eg) * 4 <= size_t(limit)) {
    g.bias_off = int(smem);  // past both phases' shared memory: never overwritten
    smem += size_t(Eg) * 4;
  }
  g.stamps = stamps;
  g.block_stamps = perf::block_stamp_buffer();
  if (g.block_stamps) g.block_stamp_launch = perf::next_block_stamp_launch();
  const int blocks = (Eg + g.G - 1) / g.G;
  const bool narrow = Eg <= 32 * 8;
  const KernelLaunch launch(dim3(blocks), dim3(kTinyThreads), stream, a.pdl, smem);
  if (softmax && narrow) return launch(tiny_token_path_kernel<true, 8>, g);
  if (softmax) return launch(tiny_token_path_kernel<true, 32>, g);
  if (narrow) return launch(tiny_token_path_kernel<false, 8>, g);
  return launch(tiny_token_path_kernel<false, 32>, g);
}

}  // namespace

cudaError_t tiny_token_path(const SmallTokenPath& a, int T, cudaStream_t stream) {
  return launch_tiny(a, T, stream, nullptr);
}

cudaError_t tiny_token_path_profiled(const SmallTokenPath& a, int T, cudaStream_t stream,
                                     unsigned long long* stamps) {
  return launch_tiny(a, T, stream, stamps);
}

}  // namespace tetra::moe::cuda::detail
