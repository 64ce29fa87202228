// Sampling kernel: one block of 1024 threads per row. Passes over the row (vocab):
//   the row's logit biases (sparse: their tokens marked in the count words, their x written
//   first); penalties + temperature into x (workspace) and the block argmax; min-p; top-k and top-p cuts
//   by radix select (largest key cut with weight(key >= cut) >= target, built byte by byte from
//   shared-memory histograms); the Gumbel-max draw. Dropped tokens become NaN in x, which
//   sampling_math::order_key maps to 0 ("not a candidate"). After the first pass (4 tokens per
//   thread and load) every thread walks the same tokens (v = tid + i * 1024), with a block
//   barrier between passes that rewrite x and the passes that read it.
#include <cuda_bf16.h>

#include <algorithm>

#include "core/error.h"
#include "ops/sampling/sampling_cuda.h"
#include "ops/sampling/sampling_math.h"

namespace tetra::ops::cuda {

namespace {

namespace sm = sampling_math;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
// Count word of a token: bit 30 = seen in the history, bit 29 = biased (its x is written before
// the main pass), the low bits its output count.
constexpr int kSeenBit = 1 << 30;
constexpr int kBiasBit = 1 << 29;
constexpr int kCountMask = kBiasBit - 1;

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

// visit(v, logit) for the logits [begin, end) of one row, the block's threads kStride apart. Rows
// are 16-byte aligned when V % 4 == 0 (then begin and end are multiples of 4): 4 logits per load.
template <int kStride, typename Visit>
__device__ __forceinline__ void walk_logits(const float* lg, int V, int begin, int end,
                                            Visit&& visit) {
  if (V % 4 == 0) {
    const float4* lg4 = reinterpret_cast<const float4*>(lg);
#pragma unroll 4
    for (int q = begin / 4 + int(threadIdx.x); q < end / 4; q += kStride) {
      const float4 l = lg4[q];
      visit(4 * q, l.x), visit(4 * q + 1, l.y), visit(4 * q + 2, l.z), visit(4 * q + 3, l.w);
    }
  } else {
    for (int v = begin + int(threadIdx.x); v < end; v += kStride) visit(v, lg[v]);
  }
}

// A launch's rows, passed by value (kernel parameter space): no copy to the device per step.
// Row r's biases are entries [bias_begin[r], bias_end[r]) of the device bias arrays.
struct ChunkParams {
  SamplingParams row[kMaxRowsPerLaunch];
  int32_t bias_begin[kMaxRowsPerLaunch];
  int32_t bias_end[kMaxRowsPerLaunch];
};
static_assert(sizeof(ChunkParams) + 128 <= 4096, "kernel parameters are limited to 4 KB");

// Row r of the chunk is this kernel's when bit r of `mask` is set; the other kernel takes it.
__device__ __forceinline__ bool takes_row(uint64_t mask, int r) { return (mask >> r) & 1u; }

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float* __restrict__ logits, int V, const __grid_constant__ ChunkParams params,
                  uint64_t mask, TokenHistory hist, const int32_t* __restrict__ bias_tokens,
                  const float* __restrict__ bias_values, float* __restrict__ x_ws,
                  int32_t* __restrict__ count_ws, int32_t* __restrict__ tokens) {
  __shared__ Shared sh;
  const int r = blockIdx.x;
  if (!takes_row(mask, r)) return;
  const SamplingParams& p = params.row[r];
  const float* lg = logits + int64_t(r) * V;
  float* x = x_ws + int64_t(r) * V;
  int32_t* cnt = count_ws + int64_t(r) * V;

  const bool penalties = has_penalties(p);
  const int bias_begin = params.bias_begin[r], bias_end = params.bias_end[r];
  const bool biased = bias_end > bias_begin;
  const bool counts = penalties || biased;  // cnt is read in the main pass
  const bool greedy = p.temperature <= 0.0f;
  if (counts) {
    for (int v = threadIdx.x; v < V; v += kThreads) cnt[v] = 0;
    __syncthreads();
  }
  if (penalties) {
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
  // x of a token after its bias, penalties and temperature; c: its count word.
  auto processed = [&](float logit, int c) {
    float xv = sm::penalised(logit, (c & ~kBiasBit) != 0, c & kCountMask, p.repetition_penalty,
                             p.frequency_penalty, p.presence_penalty) + 0.0f;
    return greedy ? xv : xv / p.temperature;
  };
  if (biased) {  // ids distinct (check_sampling_inputs): one writer per token
    for (int i = bias_begin + int(threadIdx.x); i < bias_end; i += kThreads) {
      const int t = bias_tokens[i];
      if (t < 0 || t >= V) continue;  // refused by the CPU twin
      x[t] = processed(sm::biased(lg[t], bias_values[i]), cnt[t]);
      cnt[t] |= kBiasBit;
    }
    __syncthreads();
  }
  float best = 0.0f;
  int best_i = -1;
  auto visit = [&](int v, float logit) {
    const int c = counts ? cnt[v] : 0;
    // A biased token's x was written above; a greedy row writes x only there (nothing else
    // reads it: the row ends at this pass's argmax).
    const float xv = (c & kBiasBit) ? x[v] : processed(logit, c);
    if (!greedy) x[v] = xv;
    if (sm::order_key(xv) != 0 && better(xv, v, best, best_i)) best = xv, best_i = v;
  };
  walk_logits<kThreads>(lg, V, 0, V, visit);
  block_best(best, best_i, sh.best_f, sh.best_i);  // (its barrier also publishes x block-wide)
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

// Greedy rows without penalties need only their argmax: `parts` blocks per row (grid
// [parts, rows]), so a small batch reads each row through many SMs. Each block folds its slice
// into the row's 64-bit key with atomicMax: the order key in the high word and the index's
// complement in the low one, so the larger value wins and then the lower index (0: nothing
// drawable). The row's last block to finish turns the key into the token and zeroes the key and
// its counter for the next launch.
constexpr int kGreedyThreads = 256;

struct GreedyState {
  unsigned long long key[kMaxRowsPerLaunch];
  unsigned int done[kMaxRowsPerLaunch];
};

__global__ void __launch_bounds__(kGreedyThreads)
    greedy_kernel(const float* __restrict__ logits, int V, uint64_t mask, GreedyState* state,
                  int32_t* __restrict__ tokens) {
  __shared__ unsigned long long warp_key[kGreedyThreads / 32];
  __shared__ bool last;
  const int r = blockIdx.y;
  if (!takes_row(mask, r)) return;
  // Slices of whole float4 groups when rows are 16-byte aligned.
  const int parts = int(gridDim.x), part = int(blockIdx.x);
  const int unit = V % 4 == 0 ? 4 : 1;
  const int units = V / unit, per = (units + parts - 1) / parts;
  const int begin = std::min(units, part * per) * unit, end = std::min(units, (part + 1) * per) * unit;
  const float* lg = logits + int64_t(r) * V;
  unsigned long long key = 0;
  auto visit = [&](int v, float x) {
    // (+0.0f: -0 reads as +0, as sampling_math::penalised returns it)
    const unsigned long long k = (uint64_t(sm::order_key(x + 0.0f)) << 32) | (0xffffffffu - uint32_t(v));
    if (k >> 32 != 0 && k > key) key = k;
  };
  walk_logits<kGreedyThreads>(lg, V, begin, end, visit);
  for (int off = 16; off >= 1; off /= 2) key = max(key, __shfl_xor_sync(0xffffffffu, key, off));
  if (threadIdx.x % 32 == 0) warp_key[threadIdx.x / 32] = key;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kGreedyThreads / 32; ++w) key = max(key, warp_key[w]);
    if (key != 0) atomicMax(&state->key[r], key);
    __threadfence();  // the key lands before this block counts itself done
    last = atomicAdd(&state->done[r], 1u) == unsigned(parts) - 1;
    if (last) {
      const unsigned long long row_key = atomicExch(&state->key[r], 0ull);
      state->done[r] = 0;
      tokens[r] = row_key == 0 ? -1 : int32_t(0xffffffffu - uint32_t(row_key));
    }
  }
}

bool plain_greedy(const SamplingParams& p) { return p.temperature <= 0.0f && !has_penalties(p); }

int bias_count(const LogitBias& bias, int row) {
  return bias.offsets ? bias.offsets[row + 1] - bias.offsets[row] : 0;
}

// Blocks per row: about 512 blocks in all (4 per SM), at least ~2 KB of logits per block.
int greedy_parts(int rows, int V) {
  return std::clamp(std::min(512 / std::max(rows, 1), V / 512), 1, 256);
}

}  // namespace

size_t sampling_workspace_bytes(int rows, int vocab) {
  return sizeof(GreedyState) +
         size_t(std::min(rows, kMaxRowsPerLaunch)) * size_t(vocab) * (sizeof(float) + sizeof(int32_t));
}

bool sampling_needs_scratch(const SamplingParams* params, int rows, const LogitBias& bias) {
  for (int r = 0; r < rows; ++r)
    if (!plain_greedy(params[r]) || bias_count(bias, r) > 0) return true;
  return false;
}

cudaError_t sample(const float* logits, int rows, int vocab, const SamplingParams* params,
                   const TokenHistory& history, const LogitBias& bias, void* workspace,
                   size_t workspace_bytes, int32_t* tokens, cudaStream_t stream) {
  TETRA_CHECK(rows >= 0 && vocab > 0, "sampling: rows=", rows, " vocab=", vocab);
  const size_t least =
      sampling_workspace_bytes(sampling_needs_scratch(params, rows, bias) ? rows : 0, vocab);
  TETRA_CHECK(workspace != nullptr && workspace_bytes >= least, "sampling: workspace ",
              workspace_bytes, " bytes, needs ", least);
  auto* state = static_cast<GreedyState*>(workspace);
  for (int r0 = 0; r0 < rows; r0 += kMaxRowsPerLaunch) {
    const int n = std::min(kMaxRowsPerLaunch, rows - r0);
    ChunkParams chunk{};
    uint64_t greedy = 0;
    for (int r = 0; r < n; ++r) {
      chunk.row[r] = params[r0 + r];
      chunk.bias_begin[r] = bias.offsets ? bias.offsets[r0 + r] : 0;
      chunk.bias_end[r] = chunk.bias_begin[r] + bias_count(bias, r0 + r);
      if (plain_greedy(chunk.row[r]) && bias_count(bias, r0 + r) == 0) greedy |= uint64_t(1) << r;
    }
    const uint64_t all = n == 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1;
    const float* lg = logits + size_t(r0) * vocab;
    if (greedy != 0) {
      const dim3 grid(unsigned(greedy_parts(n, vocab)), unsigned(n));
      greedy_kernel<<<grid, kGreedyThreads, 0, stream>>>(lg, vocab, greedy, state, tokens + r0);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
    }
    if (greedy == all) continue;  // (else `least` above covered this chunk's scratch)
    TokenHistory part = history;  // offsets index the whole token arrays: shift only them
    if (part.prompt_offsets != nullptr) part.prompt_offsets += r0;
    if (part.output_offsets != nullptr) part.output_offsets += r0;
    float* x = reinterpret_cast<float*>(static_cast<char*>(workspace) + sizeof(GreedyState));
    int32_t* counts = reinterpret_cast<int32_t*>(x + size_t(n) * vocab);
    sample_kernel<<<n, kThreads, 0, stream>>>(lg, vocab, chunk, all & ~greedy, part, bias.tokens,
                                              bias.values, x, counts, tokens + r0);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace tetra::ops::cuda
