// See token_path.h.
#include "ops/moe/token_path.h"

#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "core/atomics.cuh"
#include "core/cuda_check.h"
#include "core/error.h"
#include "core/kernel_launch.h"
#include "ops/moe/layout_device.cuh"
#include "ops/moe/moe_kernel_smem.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/pdl_chain.cuh"
#include "ops/moe/router_dot.cuh"
#include "ops/moe/routing_device.cuh"
#include "ops/moe/token_path_tiny.h"

namespace tetra::moe::cuda {

namespace {

constexpr int kThreads = 1024;  // = detail::kChunk (layout) = kMaxExperts (one thread per expert)
static_assert(kThreads == detail::kChunk && kThreads == kMaxExperts);
constexpr int kBlocksWanted = 264;  // two 1024-thread blocks per SM of an H200 for the logits

// One block of kThreads threads. Reads what the layout wrote (same block after a barrier, or an
// earlier launch).
__device__ void prepare_rows_block(const RowsPrep& r, int T) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  const bool contiguous = r.max_m == 0;
  const int e = threadIdx.x;
  int count = 0;
  if (e < r.E) {
    count = contiguous ? r.offsets[e + 1] - r.offsets[e] : r.masked_m[e];
    if (contiguous) r.row_count[e] = count;
  }
  const int active = count > 0 ? 1 : 0;
  int pos = 0, total = 0;
  Scan(scan_tmp).ExclusiveSum(active, pos, total);
  if (active && pos < r.num_slots) r.slots[pos] = e;
  if (e >= total && e < r.num_slots) r.slots[e] = -1;
  if (e == 0 && r.sh_rows) {
    r.sh_rows[0] = 0;
    r.sh_rows[1] = T;
  }
  if (r.shared_slot) {
    if (e == 0) {
      r.slots[r.num_slots] = r.E;
      if (contiguous) {
        r.row_count[r.E] = T;
      } else {
        r.masked_m[r.E] = T;
      }
    }
    const int first = contiguous ? r.offsets[r.E] : r.E * r.max_m;
    for (int t = threadIdx.x; t < T; t += kThreads) r.row_token[first + t] = t;
  }
}

__global__ void __launch_bounds__(kThreads) prepare_rows_kernel(RowsPrep r, int T) {
  detail::pdl_chain_entry();
  prepare_rows_block(r, T);
}

struct SmallArgs {
  SmallTokenPath a;
  detail::LayoutOut lo;
  int T = 0;
  int dot_warps = 0;    // warps of each block computing logits (one dot product each)
  int route_warps = 0;  // warps of the last block routing tokens
};

template <bool kSoftmax, bool kVec>
__global__ void __launch_bounds__(kThreads) small_token_path_kernel(const SmallArgs g) {
  extern __shared__ __align__(16) char smem[];
  __shared__ int last_block;
  const SmallTokenPath& a = g.a;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int Eg = a.router.num_experts, K = a.router.top_k, T = g.T;

  // 1. Logits: dot product d = (t, e) by warp d % dot_warps of block d / dot_warps.
  if (warp < g.dot_warps) {
    const int d = blockIdx.x * g.dot_warps + warp;
    if (d < T * Eg) {
      const int t = d / Eg, e = d - t * Eg;
      const float v = detail::router_dot<uint16_t, kVec>(a.x + size_t(t) * a.H,
                                                         a.gate + size_t(e) * a.H, a.H, lane);
      if (lane == 0) a.logits[d] = v;
    }
  }
  __syncthreads();  // the block's logits stores, before thread 0 counts it in (release)
  if (threadIdx.x == 0) last_block = atomic_add_acq_rel_gpu(a.counter, 1u) == gridDim.x - 1;
  __syncthreads();  // the last block's reads below come after thread 0's acquire
  if (!last_block) return;
  // Every block's logits are visible now (read through L2: __ldcg).

  // 2. Routing: warp w < route_warps routes tokens w, w + route_warps, ...
  if (warp < g.route_warps) {
    float* sel = reinterpret_cast<float*>(smem) + size_t(warp) * Eg;  // [E] selection keys
    for (int t = warp; t < T; t += g.route_warps) {
      detail::route_token_regs<kSoftmax, kMaxExperts / 32>(a.logits + size_t(t) * Eg, a.bias,
                                                           a.router, sel, a.ids + size_t(t) * K,
                                                           a.weights + size_t(t) * K, lane);
      __syncwarp();  // sel is reused by the next token
    }
  }
  if (threadIdx.x == 0) {
    *a.counter = 0;  // every block has counted: ready for the next launch
    if (a.dropped) *a.dropped = 0;
  }
  __syncthreads();  // ids visible to the block; the scores' shared memory is free

  // 3. Layout of the T*K pairs, 4. the GEMMs' row bookkeeping.
  detail::layout_one_block(a.ids, int64_t(T) * K, detail::carve(smem, g.lo.E), g.lo);
  __syncthreads();
  prepare_rows_block(a.rows, T);
}

template <bool kSoftmax, bool kVec>
void set_smem(size_t bytes) {
  TETRA_CUDA_CHECK(cudaFuncSetAttribute(small_token_path_kernel<kSoftmax, kVec>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace

namespace detail {
LayoutOut layout_out_of(const SmallTokenPath& a) {
  LayoutOut lo;
  lo.E = a.rows.E;
  lo.top_k = a.router.top_k;
  lo.begin = a.expert_begin;
  lo.E_global = a.router.num_experts;
  lo.max_m = a.rows.max_m;
  lo.offsets = a.offsets;
  lo.masked_m = a.masked_m;
  lo.row_token = a.row_token;
  lo.slot_of = a.slot_of;
  lo.dropped = a.dropped;
  return lo;
}
}  // namespace detail

cudaError_t prepare_rows(const RowsPrep& r, int T, cudaStream_t stream, bool pdl) {
  if (r.E < 1 || r.E > kMaxExperts || T < 0 || r.num_slots < 0 || r.num_slots > r.E)
    TETRA_FAIL("cuda prepare_rows: bad sizes E=", r.E, " T=", T, " slots=", r.num_slots);
  return KernelLaunch(dim3(1), dim3(kThreads), stream, pdl)(prepare_rows_kernel, r, T);
}

bool small_token_path_fits(int T, int top_k) {
  return T >= 1 && int64_t(T) * top_k <= detail::kFusedMaxPairs;
}

void small_token_path_setup(int E_global, int E_local) {
  if (E_global < 1 || E_global > kMaxExperts || E_local < 1 || E_local > E_global)
    TETRA_FAIL("cuda small_token_path: bad expert counts ", E_local, " of ", E_global);
  // One limit for every shape (the routing scratch is capped by moe_smem::kTokenPathRouteBudget),
  // so that a layer built later cannot lower the limit an earlier, larger one needs.
  const size_t bytes = std::max(moe_smem::kTokenPathRouteBudget, moe_smem::layout(kMaxExperts));
  set_smem<false, false>(bytes);
  set_smem<false, true>(bytes);
  set_smem<true, false>(bytes);
  set_smem<true, true>(bytes);
  detail::tiny_token_path_setup();
}

bool small_token_path_takes_pre_norm(const SmallTokenPath& a, int T) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return T == 1 && a.H % 8 == 0 && a.H <= detail::kTinyPreNormMaxH &&
         aligned(a.pre_norm_weight) && aligned(a.pre_norm_out) &&
         detail::tiny_token_path_fits(a, T);
}

cudaError_t small_token_path(const SmallTokenPath& a, int T, cudaStream_t stream) {
  const int Eg = a.router.num_experts, K = a.router.top_k;
  if (a.pre_norm_weight != nullptr &&
      (!small_token_path_takes_pre_norm(a, T) || a.pre_norm_out == nullptr))
    TETRA_FAIL("cuda small_token_path: the folded RMSNorm needs the tiny kernel at T = 1, H <= ",
               detail::kTinyPreNormMaxH, " (T=", T, ", H=", a.H, ") and an output");
  if (!small_token_path_fits(T, K))
    TETRA_FAIL("cuda small_token_path: ", T, " tokens x top-", K, " is too many pairs");
  if (!a.counter || !a.logits || !a.ids || !a.weights || !a.slot_of || !a.row_token)
    TETRA_FAIL("cuda small_token_path: output pointers are missing");
  if (a.rows.E < 1 || a.rows.E > kMaxExperts || a.rows.num_slots < 0 ||
      a.rows.num_slots > a.rows.E)
    TETRA_FAIL("cuda small_token_path: bad sizes E=", a.rows.E, " slots=", a.rows.num_slots);
  if (detail::tiny_token_path_fits(a, T)) return detail::tiny_token_path(a, T, stream);
  // Past the tiny kernel's limits the general kernel routes and lays out even with logits_only:
  // GEMM1's own routing then writes the same layout again (nothing reads it in between).
  SmallArgs g;
  g.a = a;
  g.T = T;
  g.lo = detail::layout_out_of(a);
  const int dots = T * Eg;
  g.dot_warps = std::clamp((dots + kBlocksWanted - 1) / kBlocksWanted, 4, kThreads / 32);
  g.route_warps = moe_smem::token_path_route_warps(Eg);
  const int blocks = (dots + g.dot_warps - 1) / g.dot_warps;
  const size_t smem = moe_smem::token_path(Eg, a.rows.E);
  const bool vec = a.H % 8 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.gate) % 16 == 0;
  const bool softmax = a.router.scoring == Scoring::Softmax;
  if (softmax && vec) {
    small_token_path_kernel<true, true><<<blocks, kThreads, smem, stream>>>(g);
  } else if (softmax) {
    small_token_path_kernel<true, false><<<blocks, kThreads, smem, stream>>>(g);
  } else if (vec) {
    small_token_path_kernel<false, true><<<blocks, kThreads, smem, stream>>>(g);
  } else {
    small_token_path_kernel<false, false><<<blocks, kThreads, smem, stream>>>(g);
  }
  return cudaGetLastError();
}

}  // namespace tetra::moe::cuda
