// Sampling kernel: one block of 1024 threads per row. Passes over the row (vocab):
//   penalties + temperature into x (workspace) and the block argmax; min-p; top-k and top-p cuts
//   by radix select (largest key cut with weight(key >= cut) >= target, built byte by byte from
//   shared-memory histograms); the Gumbel-max draw. Dropped tokens become NaN in x, which
//   sampling_math::order_key maps to 0 ("not a candidate"). Every thread walks the same tokens
//   (v = tid + i * 1024) in every pass, so a pass reads only what the same thread wrote.
#include <cuda_bf16.h>

#include "core/error.h"
#include "ops/sampling/sampling_cuda.h"
#include "ops/sampling/sampling_math.h"

namespace tetra::ops::cuda {

namespace {

namespace sm = sampling_math;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kSeenBit = 1 << 30;  // history count word: bit 30 = seen, low bits = output count

// Best (value, index): larger value, then lower index. Index -1 means "none" and always loses.
template <typename T>
__device__ __forceinline__ bool better(T v, int i, T bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

template <typename T>
__device__ void block_best(T& v, int& i, T* sv, int* si) {
  for (int off = 16; off >= 1; off /= 2) {
    const T ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, i, off);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // sv/si may still be read from a previous call
  if (lane == 0) sv[warp] = v, si[warp] = i;
  __syncthreads();
  v = sv[0];
  i = si[0];
  for (int w = 1; w < kWarps; ++w)
    if (better(sv[w], si[w], v, i)) v = sv[w], i = si[w];
}

struct Shared {
  unsigned long long hist[256];
  unsigned long long above;  // weight of keys above the prefix chosen so far
  uint32_t prefix;
  int none;                  // total weight below the target: no cut
  float best_f[kWarps];
  double best_d[kWarps];
  int best_i[kWarps];
};

// Largest cut with sum of weight(x) over candidates with key >= cut >= target; 0 if the whole
// row weighs less than target (then nothing is cut).
template <typename WeightFn>
__device__ uint32_t radix_cut(const float* x, int V, unsigned long long target, WeightFn weight,
                              Shared& sh) {
  uint32_t prefix = 0, mask = 0;
  for (int level = 0; level < 4; ++level) {
    const int shift = 24 - 8 * level;
    for (int i = threadIdx.x; i < 256; i += kThreads) sh.hist[i] = 0;
    if (level == 0 && threadIdx.x == 0) sh.above = 0;
    __syncthreads();
    for (int v = threadIdx.x; v < V; v += kThreads) {
      const uint32_t key = sm::order_key(x[v]);
      if (key != 0 && (key & mask) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], weight(x[v]));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long acc = sh.above;
      if (level == 0) {
        unsigned long long total = 0;
        for (int d = 0; d < 256; ++d) total += sh.hist[d];
        sh.none = total < target;
      }
      int d = 255;
      for (; d > 0; --d) {
        if (acc + sh.hist[d] >= target) break;
        acc += sh.hist[d];
      }
      sh.above = acc;
      sh.prefix = prefix | (uint32_t(d) << shift);
    }
    __syncthreads();
    if (sh.none) return 0;
    prefix = sh.prefix;
    mask |= 255u << shift;
  }
  return prefix;
}

__device__ void drop_below(float* x, int V, uint32_t cut) {
  for (int v = threadIdx.x; v < V; v += kThreads)
    if (sm::order_key(x[v]) < cut) x[v] = NAN;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, int V, const SamplingParams* __restrict__ params,
                  TokenHistory hist, float* __restrict__ x_ws, int32_t* __restrict__ count_ws,
                  int32_t* __restrict__ tokens) {
  __shared__ Shared sh;
  const int r = blockIdx.x;
  const SamplingParams p = params[r];
  const float* lg = logits + int64_t(r) * V;
  float* x = x_ws + int64_t(r) * V;
  int32_t* cnt = count_ws + int64_t(r) * V;

  const bool penalties = p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f ||
                         p.presence_penalty != 0.0f;
  if (penalties) {
    for (int v = threadIdx.x; v < V; v += kThreads) cnt[v] = 0;
    __syncthreads();
    if (hist.prompt_tokens != nullptr && hist.prompt_offsets != nullptr)
      for (int i = hist.prompt_offsets[r] + threadIdx.x; i < hist.prompt_offsets[r + 1]; i += kThreads) {
        const int t = hist.prompt_tokens[i];
        if (t >= 0 && t < V) atomicOr(&cnt[t], kSeenBit);
      }
    if (hist.output_tokens != nullptr && hist.output_offsets != nullptr)
      for (int i = hist.output_offsets[r] + threadIdx.x; i < hist.output_offsets[r + 1]; i += kThreads) {
        const int t = hist.output_tokens[i];
        if (t >= 0 && t < V) atomicAdd(&cnt[t], 1);  // a count > 0 also means seen
      }
    __syncthreads();
  }
  const bool greedy = p.temperature <= 0.0f;
  float best = 0.0f;
  int best_i = -1;
  for (int v = threadIdx.x; v < V; v += kThreads) {
    const int c = penalties ? cnt[v] : 0;
    float xv = sm::penalised(lg[v], c != 0, c & (kSeenBit - 1), p.repetition_penalty,
                             p.frequency_penalty, p.presence_penalty) + 0.0f;
    if (!greedy) xv = xv / p.temperature;
    x[v] = xv;
    if (sm::order_key(xv) != 0 && better(xv, v, best, best_i)) best = xv, best_i = v;
  }
  block_best(best, best_i, sh.best_f, sh.best_i);
  if (greedy || best_i < 0) {
    if (threadIdx.x == 0) tokens[r] = best_i;
    return;
  }
  const float x_max = best;
  if (p.min_p > 0.0f)
    for (int v = threadIdx.x; v < V; v += kThreads)
      if (sm::order_key(x[v]) != 0 && !sm::min_p_keeps(x[v], x_max, p.min_p)) x[v] = NAN;
  __syncthreads();
  if (p.top_k > 0 && p.top_k < V) {
    const uint32_t cut = radix_cut(x, V, (unsigned long long)p.top_k,
                                   [](float) { return 1ull; }, sh);
    if (cut != 0) drop_below(x, V, cut);
    __syncthreads();
  }
  if (p.top_p < 1.0f) {
    // Total weight first (a full-row block sum), then the cut at ceil(top_p * total).
    unsigned long long part = 0;
    for (int v = threadIdx.x; v < V; v += kThreads)
      if (sm::order_key(x[v]) != 0) part += sm::top_p_weight(x[v], x_max);
    for (int off = 16; off >= 1; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);
    if (threadIdx.x == 0) sh.above = 0;
    __syncthreads();
    if (threadIdx.x % 32 == 0) atomicAdd(&sh.above, part);
    __syncthreads();
    const unsigned long long total = sh.above;
    __syncthreads();  // radix_cut resets sh.above
    const uint32_t cut = radix_cut(x, V, sm::top_p_target(p.top_p, total),
                                   [x_max](float xv) { return sm::top_p_weight(xv, x_max); }, sh);
    if (cut != 0) drop_below(x, V, cut);
    __syncthreads();
  }
  double best_score = 0.0;
  int pick = -1;
  for (int v = threadIdx.x; v < V; v += kThreads) {
    if (sm::order_key(x[v]) == 0) continue;
    const double score = double(x[v]) + sm::gumbel(p.seed, p.step, uint32_t(v));
    if (better(score, v, best_score, pick)) best_score = score, pick = v;
  }
  block_best(best_score, pick, sh.best_d, sh.best_i);
  if (threadIdx.x == 0) tokens[r] = pick;
}

}  // namespace

size_t sampling_workspace_bytes(int rows, int vocab) {
  return size_t(rows) * size_t(vocab) * (sizeof(float) + sizeof(int32_t));
}

cudaError_t sample(const float* logits, int rows, int vocab, const SamplingParams* params,
                   const TokenHistory& history, void* workspace, size_t workspace_bytes,
                   int32_t* tokens, cudaStream_t stream) {
  TETRA_CHECK(rows >= 0 && vocab > 0, "sampling: rows=", rows, " vocab=", vocab);
  const size_t need = sampling_workspace_bytes(rows, vocab);
  TETRA_CHECK(workspace_bytes >= need && (need == 0 || workspace != nullptr),
              "sampling: workspace ", workspace_bytes, " bytes, needs ", need);
  if (rows == 0) return cudaSuccess;
  float* x = static_cast<float*>(workspace);
  int32_t* counts = reinterpret_cast<int32_t*>(x + size_t(rows) * vocab);
  sample_kernel<<<rows, kThreads, 0, stream>>>(logits, vocab, params, history, x, counts, tokens);
  return cudaGetLastError();
}

}  // namespace tetra::ops::cuda
