// Logprobs kernel: `parts` blocks per query, each over one slice of its logit row (so one query
// streams through many SMs, as the greedy argmax does). A block finds its slice's 20 best
// selection keys (the value's order key, then the lower id: each thread keeps a sorted list in
// registers, the warps merge their lanes' lists by 20 rounds of a warp max, the block ranks the
// warps' candidates), its largest value m and sum of exp(x - m) in double. The query's last
// block to finish merges the parts the same way, rescales their sums to the row's peak and
// writes the answer. NaN counts as -inf, as in the CPU twin; +inf logits share all the mass.
#include <algorithm>
#include <cmath>

#include "ops/sampling/logprobs_cuda.h"
#include "ops/sampling/sampling_math.h"

namespace tetra::ops::cuda {

namespace {

namespace sm = sampling_math;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTop = kMaxTopLogprobs;
using Key = unsigned long long;

// One part's result, in the workspace after the counters.
struct PartResult {
  Key best[kTop];  // descending, 0: empty
  float peak;      // the slice's largest value (-inf: nothing finite or +inf)
  double sum;      // sum of exp(x - peak) over the slice, or its count of +inf when peak is +inf
};

// The CPU twin's value of a logit: NaN reads as -inf, -0 as +0.
__device__ __forceinline__ float value_of(float x) { return x != x ? -INFINITY : x + 0.0f; }

// Larger is better: the value's order, then the lower id. NaN and -inf share order 0 (so they
// rank by id alone, as equal -inf values do in the CPU twin); every real key is > 0.
__device__ __forceinline__ Key select_key(float x, int v) {
  return (Key(sm::order_key(value_of(x))) << 32) | (0xffffffffu - uint32_t(v));
}
__device__ __forceinline__ int id_of(Key key) { return int(0xffffffffu - uint32_t(key)); }

// The value of the best key (-inf when no key): the largest value of what it ranked.
__device__ __forceinline__ float peak_of(const Key* best, const float* row) {
  return best[0] == 0 ? -INFINITY : value_of(row[id_of(best[0])]);
}

// list [kTop] sorted descending (0: empty): k joins it if it beats the last entry.
__device__ __forceinline__ void insert(Key (&list)[kTop], Key k) {
  if (k <= list[kTop - 1]) return;
#pragma unroll
  for (int j = kTop - 1; j > 0; --j)
    if (k > list[j]) list[j] = k > list[j - 1] ? list[j - 1] : k;
  if (k > list[0]) list[0] = k;
}

// The block's best kTop of its threads' lists -> best [kTop] (shared, descending, 0-padded).
// Keys are distinct (their ids are). cand: [kWarps * kTop] scratch.
__device__ void block_top(Key (&list)[kTop], Key* cand, Key* best) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Key merged = 0;  // lane j: the warp's j-th best
  for (int j = 0; j < kTop; ++j) {
    Key top = list[0];
    for (int off = 16; off >= 1; off /= 2) top = max(top, __shfl_xor_sync(0xffffffffu, top, off));
    if (top == 0) break;  // the same in every lane
    if (list[0] == top) {
#pragma unroll
      for (int k = 0; k < kTop - 1; ++k) list[k] = list[k + 1];
      list[kTop - 1] = 0;
    }
    if (lane == j) merged = top;
  }
  if (lane < kTop) cand[warp * kTop + lane] = merged;
  if (threadIdx.x < kTop) best[threadIdx.x] = 0;
  __syncthreads();
  if (threadIdx.x < kWarps * kTop) {
    const Key k = cand[threadIdx.x];
    int rank = 0;
    for (int i = 0; i < kWarps * kTop; ++i) rank += cand[i] > k;
    if (k != 0 && rank < kTop) best[rank] = k;
  }
  __syncthreads();
}

__device__ double block_sum(double v, double* scratch) {
  for (int off = 16; off >= 1; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];  // the same order in every thread
  return total;
}

// Grid [parts, n]: block (p, q) takes slice p of query q's row; counters [n] start and end 0.
// sampled: see position_logprobs.
__global__ void __launch_bounds__(kThreads)
    logprobs_kernel(const float* __restrict__ logits, int64_t V, const LogprobQuery* queries,
                    const int32_t* sampled, PartResult* parts_out, unsigned int* counters,
                    PositionLogprobsOut* out) {
  __shared__ Key cand[kWarps * kTop];
  __shared__ Key best[kTop];
  __shared__ double sums[kWarps];
  __shared__ bool last;
  const int parts = int(gridDim.x), part = int(blockIdx.x), qi = int(blockIdx.y);
  const LogprobQuery q = queries[qi];
  const float* row = logits + int64_t(q.row) * V;
  // Slices of whole float4 groups when rows are 16-byte aligned.
  const int unit = V % 4 == 0 ? 4 : 1;
  const int64_t units = V / unit, per = (units + parts - 1) / parts;
  const int64_t begin = std::min(units, part * per) * unit, end = std::min(units, (part + 1) * per) * unit;

  Key list[kTop];
#pragma unroll
  for (int j = 0; j < kTop; ++j) list[j] = 0;
  if (unit == 4) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t i = begin / 4 + threadIdx.x; i < end / 4; i += kThreads) {
      const float4 x = row4[i];
      const int v = int(4 * i);
      insert(list, select_key(x.x, v));
      insert(list, select_key(x.y, v + 1));
      insert(list, select_key(x.z, v + 2));
      insert(list, select_key(x.w, v + 3));
    }
  } else {
    for (int64_t v = begin + threadIdx.x; v < end; v += kThreads) insert(list, select_key(row[v], int(v)));
  }
  block_top(list, cand, best);
  // The slice's peak and its sum (rows re-read from L1/L2).
  const float peak = peak_of(best, row);
  const bool infinite = peak == INFINITY;
  double s = 0.0;
  if (peak != -INFINITY)
    for (int64_t v = begin + threadIdx.x; v < end; v += kThreads) {
      const float x = value_of(row[v]);
      s += infinite ? double(x == peak) : exp(double(x) - double(peak));
    }
  s = block_sum(s, sums);
  PartResult& mine = parts_out[int64_t(qi) * parts + part];
  if (threadIdx.x < kTop) mine.best[threadIdx.x] = best[threadIdx.x];
  if (threadIdx.x == 0) mine.peak = peak, mine.sum = s;
  if (parts > 1) {
    __threadfence();  // this block's part lands before it counts itself done
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&counters[qi], 1u) == unsigned(parts) - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();  // the other parts' writes are visible to this block's loads below
    // Merge: every thread loads its share of the parts' candidates (parts * kTop <= kTop *
    // kThreads: at most kTop each, all loads in flight at once), then inserts them.
    const PartResult* all = parts_out + int64_t(qi) * parts;
    Key mine_keys[kTop];
#pragma unroll
    for (int j = 0; j < kTop; ++j) {
      const int i = int(threadIdx.x) + j * kThreads;
      mine_keys[j] = i < parts * kTop ? __ldcg(&all[i / kTop].best[i % kTop]) : 0;
    }
#pragma unroll
    for (int j = 0; j < kTop; ++j) list[j] = 0;
#pragma unroll
    for (int j = 0; j < kTop; ++j) insert(list, mine_keys[j]);
    block_top(list, cand, best);
  }
  // The row's peak (the best key's value), and the parts' sums rescaled to it: thread p takes
  // part p (parts <= kThreads), added in a fixed order.
  const PartResult* all = parts_out + int64_t(qi) * parts;
  const float row_peak = peak_of(best, row);
  const bool row_inf = row_peak == INFINITY;
  double contribution = 0.0;
  if (int(threadIdx.x) < parts) {
    const float pk = __ldcg(&all[threadIdx.x].peak);
    const double ps = __ldcg(&all[threadIdx.x].sum);
    if (row_inf) {
      if (pk == INFINITY) contribution = ps;
    } else if (pk != -INFINITY) {
      contribution = ps * exp(double(pk) - double(row_peak));
    }
  }
  const double sum = block_sum(contribution, sums);
  if (threadIdx.x != 0) return;
  if (parts > 1) counters[qi] = 0;  // for the next launch
  const double lse = row_peak == -INFINITY ? -INFINITY : (row_inf ? 0.0 : double(row_peak)) + log(sum);
  auto logprob = [&](float x) {
    if (row_inf) return x == row_peak ? float(-lse) : -INFINITY;
    if (isinf(lse)) return -INFINITY;  // nothing finite
    return float(double(x) - lse);
  };
  PositionLogprobsOut& o = out[qi];
  const int token = sampled ? sampled[q.token] : q.token;
  o.logprob = token >= 0 && token < V ? logprob(value_of(row[token])) : -INFINITY;
  o.top_count = int(q.top < V ? int64_t(q.top) : V);
  for (int j = 0; j < o.top_count; ++j) {
    const int id = id_of(best[j]);
    o.top_ids[j] = id;
    o.top_logprobs[j] = logprob(value_of(row[id]));
  }
}

// Blocks per query: about 512 blocks in all, at least ~2 KB of logits per block.
int logprobs_parts(int n, int64_t V) {
  return int(std::clamp<int64_t>(std::min<int64_t>(512 / std::max(n, 1), V / 512), 1, 256));
}

}  // namespace

size_t logprobs_workspace_bytes(int n, int64_t vocab) {
  const size_t counters = (size_t(std::max(n, 0)) * sizeof(unsigned int) + 15) & ~size_t(15);
  return counters + size_t(std::max(n, 0)) * size_t(logprobs_parts(n, vocab)) * sizeof(PartResult);
}

cudaError_t position_logprobs(const float* logits, int64_t vocab, const LogprobQuery* queries,
                              int n, void* workspace, size_t workspace_bytes,
                              PositionLogprobsOut* out, cudaStream_t stream,
                              const int32_t* sampled) {
  if (n <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > int64_t(0x7fffffff) || n > 65535) return cudaErrorInvalidValue;
  if (workspace == nullptr || workspace_bytes < logprobs_workspace_bytes(n, vocab))
    return cudaErrorInvalidValue;
  auto* counters = static_cast<unsigned int*>(workspace);
  const size_t counter_bytes = (size_t(n) * sizeof(unsigned int) + 15) & ~size_t(15);
  auto* parts_out = reinterpret_cast<PartResult*>(static_cast<char*>(workspace) + counter_bytes);
  const dim3 grid(unsigned(logprobs_parts(n, vocab)), unsigned(n));
  logprobs_kernel<<<grid, kThreads, 0, stream>>>(logits, vocab, queries, sampled, parts_out,
                                                 counters, out);
  return cudaGetLastError();
}

PositionLogprobs to_position_logprobs(const PositionLogprobsOut& o) {
  PositionLogprobs p;
  p.logprob = o.logprob;
  const int n = std::clamp(o.top_count, 0, kTop);
  for (int j = 0; j < n; ++j) p.top.push_back({o.top_ids[j], o.top_logprobs[j]});
  return p;
}

}  // namespace tetra::ops::cuda
