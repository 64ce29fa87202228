// Logprobs kernel: one block per query, two passes over its logit row. Pass 1: each thread keeps
// its 20 best selection keys (value's order key, then the lower id) sorted in registers; the
// warps merge their lanes' lists by 20 rounds of a warp max, and the block ranks the warps'
// 8 x 20 candidates. Pass 2: the row's sum of exp(x - peak) in double (the CPU twin's sum, in
// another order). NaN counts as -inf, as in the CPU twin; +inf logits share all the mass.
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

// The CPU twin's value of a logit: NaN reads as -inf, -0 as +0.
__device__ __forceinline__ float value_of(float x) { return x != x ? -INFINITY : x + 0.0f; }

// Larger is better: the value's order, then the lower id. NaN and -inf share order 0 (so they
// rank by id alone, as equal -inf values do in the CPU twin); every real key is > 0.
__device__ __forceinline__ unsigned long long select_key(float x, int v) {
  return (static_cast<unsigned long long>(sm::order_key(value_of(x))) << 32) |
         (0xffffffffu - static_cast<uint32_t>(v));
}
__device__ __forceinline__ int id_of(unsigned long long key) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(key));
}

// list [kTop] sorted descending (0: empty): k joins it if it beats the last entry.
__device__ __forceinline__ void insert(unsigned long long (&list)[kTop], unsigned long long k) {
  if (k <= list[kTop - 1]) return;
#pragma unroll
  for (int j = kTop - 1; j > 0; --j)
    if (k > list[j]) list[j] = k > list[j - 1] ? list[j - 1] : k;
  if (k > list[0]) list[0] = k;
}

template <typename T>
__device__ T block_sum(T v, T* scratch) {
  for (int off = 16; off >= 1; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];  // the same order in every thread
  return total;
}

__global__ void __launch_bounds__(kThreads)
    logprobs_kernel(const float* __restrict__ logits, int64_t V, const LogprobQuery* queries,
                    PositionLogprobsOut* out) {
  __shared__ unsigned long long cand[kWarps * kTop];  // the warps' merged lists
  __shared__ unsigned long long best[kTop];           // the row's, best first
  __shared__ double sums[kWarps];
  const LogprobQuery q = queries[blockIdx.x];
  const float* row = logits + int64_t(q.row) * V;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  unsigned long long list[kTop];
#pragma unroll
  for (int j = 0; j < kTop; ++j) list[j] = 0;
  if (V % 4 == 0) {  // rows 16-byte aligned: 4 logits per load
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int64_t i = threadIdx.x; i < V / 4; i += kThreads) {
      const float4 x = row4[i];
      const int v = int(4 * i);
      insert(list, select_key(x.x, v));
      insert(list, select_key(x.y, v + 1));
      insert(list, select_key(x.z, v + 2));
      insert(list, select_key(x.w, v + 3));
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += kThreads) insert(list, select_key(row[v], int(v)));
  }
  // The warp's best kTop: each round takes the largest head (keys are distinct) and its lane
  // pops it; lane j keeps round j's key.
  unsigned long long merged = 0;
  for (int j = 0; j < kTop; ++j) {
    unsigned long long top = list[0];
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
  // The block's best kTop by rank among the candidates.
  if (threadIdx.x < kWarps * kTop) {
    const unsigned long long k = cand[threadIdx.x];
    int rank = 0;
    for (int i = 0; i < kWarps * kTop; ++i) rank += cand[i] > k;
    if (k != 0 && rank < kTop) best[rank] = k;
  }
  __syncthreads();

  const float peak = value_of(row[id_of(best[0])]);  // best[0] != 0: V >= 1
  const bool infinite = peak == INFINITY;
  double part = 0.0;
  if (peak != -INFINITY)
    for (int64_t v = threadIdx.x; v < V; v += kThreads) {
      const float x = value_of(row[v]);
      part += infinite ? double(x == peak) : exp(double(x) - double(peak));
    }
  const double sum = block_sum(part, sums);
  if (threadIdx.x != 0) return;
  const double lse = peak == -INFINITY ? -INFINITY : (infinite ? 0.0 : double(peak)) + log(sum);
  auto logprob = [&](float x) {
    if (infinite) return x == peak ? float(-lse) : -INFINITY;
    if (isinf(lse)) return -INFINITY;  // nothing finite
    return float(double(x) - lse);
  };
  PositionLogprobsOut& o = out[blockIdx.x];
  o.logprob = logprob(value_of(row[q.token]));
  o.top_count = int(q.top < V ? int64_t(q.top) : V);
  for (int j = 0; j < o.top_count; ++j) {
    const int id = id_of(best[j]);
    o.top_ids[j] = id;
    o.top_logprobs[j] = logprob(value_of(row[id]));
  }
}

}  // namespace

cudaError_t position_logprobs(const float* logits, int64_t vocab, const LogprobQuery* queries,
                              int n, PositionLogprobsOut* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > int64_t(0x7fffffff)) return cudaErrorInvalidValue;
  logprobs_kernel<<<n, kThreads, 0, stream>>>(logits, vocab, queries, out);
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
