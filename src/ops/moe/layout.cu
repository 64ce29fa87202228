// Layout builders: a stable counting sort of the (token, k) pairs by expert.
//
// Pairs are processed in chunks of kChunk (one thread per pair). Within a chunk, the rank of a
// pair among the earlier pairs of its expert is: the expert's running count before the chunk
// + its count in earlier warps of the chunk (per-warp tallies in shared memory) + its rank among
// the same-expert lanes of its own warp (__match_any_sync). Ascending pair order in, ascending
// rows out: the same rows as the CPU builders, deterministically.
//  - small inputs (<= kFusedMaxPairs pairs): one block counts, scans and places everything;
//  - larger inputs: per-chunk counts (grid), a one-block scan over chunks, per-chunk placement.
#include <algorithm>

#include "core/error.h"
#include "core/kernel_launch.h"
#include "ops/moe/layout_device.cuh"
#include "ops/moe/moe_kernel_smem.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/pdl_chain.cuh"

namespace tetra::moe::cuda {

namespace {

using namespace detail;

// Small inputs: everything in one block, including the row_token fill (-1 over `fill` rows) and
// the dropped count's reset, which would otherwise be two memset nodes before it in a graph. The
// fill is T * top_k rows (contiguous) or E * max_m (masked, meant for decode-sized max_m): one
// block storing it is cheap at those sizes, not for a masked layout of thousands of rows each.
__global__ void __launch_bounds__(kChunk) layout_fused_kernel(const int32_t* __restrict__ ids,
                                                              int64_t S, int64_t fill,
                                                              LayoutOut o) {
  extern __shared__ __align__(16) char raw[];
  pdl_chain_entry();
  for (int64_t i = threadIdx.x; i < fill; i += kChunk) o.row_token[i] = -1;
  if (threadIdx.x == 0 && o.dropped) *o.dropped = 0;
  // layout_one_block's first barrier orders these stores before its placement writes.
  layout_one_block(ids, S, carve(raw, o.E), o);
}

// Large inputs, step 1: counts[c, e] = pairs of expert e in chunk c.
__global__ void __launch_bounds__(kChunk) layout_count_kernel(const int32_t* __restrict__ ids,
                                                              int64_t S, LayoutOut o,
                                                              int32_t* __restrict__ counts) {
  extern __shared__ __align__(16) char raw[];
  const int E = o.E;
  int32_t* count = reinterpret_cast<int32_t*>(raw);  // [E]
  for (int e = threadIdx.x; e < E; e += kChunk) count[e] = 0;
  __syncthreads();
  const int64_t p = int64_t(blockIdx.x) * kChunk + threadIdx.x;
  const int e_local = p < S ? local_expert(ids[p], o) : -1;
  if (e_local >= 0) atomicAdd(&count[e_local], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kChunk) counts[size_t(blockIdx.x) * E + e] = count[e];
}

// Step 2 (one block): counts[c, e] becomes the rank of chunk c's first pair of expert e;
// totals give the per-expert outputs.
__global__ void __launch_bounds__(kChunk) layout_scan_kernel(int32_t* __restrict__ counts,
                                                             int chunks, LayoutOut o) {
  extern __shared__ __align__(16) char raw[];
  const Smem s = carve(raw, o.E);
  const int e = threadIdx.x;
  if (e < o.E) {
    int run = 0;
    for (int c = 0; c < chunks; ++c) {
      const int v = counts[size_t(c) * o.E + e];
      counts[size_t(c) * o.E + e] = run;
      run += v;
    }
    s.count[e] = run;
  }
  __syncthreads();
  write_expert_info(s, o);
}

// Step 3: place chunk c, starting from the ranks of step 2.
__global__ void __launch_bounds__(kChunk) layout_place_kernel(const int32_t* __restrict__ ids,
                                                              int64_t S,
                                                              const int32_t* __restrict__ ranks,
                                                              LayoutOut o) {
  extern __shared__ __align__(16) char raw[];
  const Smem s = carve(raw, o.E);
  for (int e = threadIdx.x; e < o.E; e += kChunk) {
    s.count[e] = ranks[size_t(blockIdx.x) * o.E + e];
    s.base[e] = o.max_m > 0 ? e * o.max_m : o.offsets[e];
  }
  zero_tally(s, o.E);
  __syncthreads();
  place_chunk(ids, S, int64_t(blockIdx.x) * kChunk, s, o);
}

void check_sizes(const char* what, int T, int top_k, int E, const ExpertBlock& b) {
  if (T < 0 || top_k < 1 || E < 1)
    TETRA_FAIL(what, ": bad sizes T=", T, " top_k=", top_k, " E=", E);
  const int64_t global = b.global_experts == 0 ? E : b.global_experts;
  if (b.expert_begin < 0 || b.expert_begin + int64_t(E) > global)
    TETRA_FAIL(what, ": expert block ", b.expert_begin, " + ", E, " outside ", global,
               " experts");
  if (E > kMaxExperts) TETRA_FAIL(what, ": ", E, " experts, at most ", kMaxExperts, " supported");
  if (int64_t(T) * top_k > INT32_MAX)
    TETRA_FAIL(what, ": T*top_k = ", int64_t(T) * top_k, " rows do not fit int32");
}

int64_t chunk_count(int T, int top_k) { return (int64_t(T) * top_k + kChunk - 1) / kChunk; }

// Runs the fused or the three-step path; fill: the row_token entries set to -1 first (and
// dropped to 0).
cudaError_t run_layout(const int32_t* ids, int T, const LayoutOut& o, size_t fill,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream, bool pdl) {
  const int64_t S = int64_t(T) * o.top_k;
  const size_t smem = moe_smem::layout(o.E);
  if (S <= kFusedMaxPairs)
    return KernelLaunch(dim3(1), dim3(kChunk), stream, pdl, smem)(layout_fused_kernel, ids, S,
                                                                   int64_t(fill), o);
  cudaError_t err = cudaMemsetAsync(o.row_token, 0xff, fill * sizeof(int32_t), stream);  // -1
  if (err == cudaSuccess && o.dropped) err = cudaMemsetAsync(o.dropped, 0, 4, stream);
  if (err != cudaSuccess) return err;
  const size_t need = layout_workspace_bytes(T, o.top_k, o.E);
  if (!workspace || workspace_bytes < need)
    TETRA_FAIL("cuda layout: workspace of ", workspace_bytes, " bytes, ", need, " needed");
  const int chunks = int(chunk_count(T, o.top_k));
  int32_t* counts = static_cast<int32_t*>(workspace);  // [chunks, E]
  layout_count_kernel<<<chunks, kChunk, moe_smem::layout_count(o.E), stream>>>(ids, S, o, counts);
  layout_scan_kernel<<<1, kChunk, smem, stream>>>(counts, chunks, o);
  layout_place_kernel<<<chunks, kChunk, smem, stream>>>(ids, S, counts, o);
  return cudaGetLastError();
}

}  // namespace

size_t layout_workspace_bytes(int T, int top_k, int E) {
  if (int64_t(T) * top_k <= kFusedMaxPairs) return 0;
  return size_t(chunk_count(T, top_k)) * size_t(E) * sizeof(int32_t);
}

cudaError_t build_contiguous(const int32_t* ids, int T, int top_k, int E, void* workspace,
                             size_t workspace_bytes, const ContiguousLayoutView& out,
                             cudaStream_t stream, bool pdl) {
  check_sizes("cuda build_contiguous", T, top_k, E, out.block);
  if (!out.expert_offsets || !out.slot_token || !out.slot_of)
    TETRA_FAIL("cuda build_contiguous: output pointers are missing");
  LayoutOut o;
  o.E = E;
  o.top_k = top_k;
  o.begin = out.block.expert_begin;
  o.E_global = out.block.global_experts == 0 ? E : out.block.global_experts;
  o.offsets = out.expert_offsets;
  o.row_token = out.slot_token;
  o.slot_of = out.slot_of;
  o.expert_rows = out.expert_rows;
  o.dropped = out.dropped;
  return run_layout(ids, T, o, size_t(T) * top_k, workspace, workspace_bytes, stream, pdl);
}

cudaError_t build_masked(const int32_t* ids, int T, int top_k, int E, void* workspace,
                         size_t workspace_bytes, const MaskedLayoutView& out, cudaStream_t stream,
                         bool pdl) {
  check_sizes("cuda build_masked", T, top_k, E, out.block);
  if (out.max_m < 1) TETRA_FAIL("cuda build_masked: max_m must be >= 1, got ", out.max_m);
  if (int64_t(E) * out.max_m > INT32_MAX)
    TETRA_FAIL("cuda build_masked: E*max_m = ", int64_t(E) * out.max_m, " rows do not fit int32");
  if (!out.masked_m || !out.row_token || !out.slot_of)
    TETRA_FAIL("cuda build_masked: output pointers are missing");
  LayoutOut o;
  o.E = E;
  o.top_k = top_k;
  o.begin = out.block.expert_begin;
  o.E_global = out.block.global_experts == 0 ? E : out.block.global_experts;
  o.max_m = out.max_m;
  o.masked_m = out.masked_m;
  o.row_token = out.row_token;
  o.slot_of = out.slot_of;
  o.expert_rows = out.expert_rows;
  o.dropped = out.dropped;
  return run_layout(ids, T, o, size_t(E) * out.max_m, workspace, workspace_bytes, stream, pdl);
}

}  // namespace tetra::moe::cuda
