// CUDA twins of the DSA indexer ops (ops/attention/dsa.h, dsa_cuda.h).
//   dsa_index_keys: a block per token: LayerNorm of wk's output (mean and variance in double,
//                   as the CPU does), rounded to bf16, then RoPE of the first Dr dims.
//   dsa_select:     two kernels.
//     score:  a (token, split) grid; each block turns its token's Hi query heads into shared
//             memory (rounded to bf16 as the CPU does), then its warps walk the keys (grid
//             stride), L lanes per key (16-byte chunks of the key row), one shuffle reduction per
//             head: score[t, j] = sum_h relu(q_h . k_j * D^-0.5) * w_h -> workspace row of t.
//     select: a block per token: a radix select (8-bit digits, histograms in shared memory)
//             finds the k-th largest score's order-preserving 32-bit key, then a block-wide
//             ordered compaction (prefix sums in position order) writes, ascending, every key
//             above it and the lowest-position keys equal to it (ties to the lower position).
//   Tokens whose key count n <= topk keep every key: the score kernel skips them and the select
//   kernel writes 0 .. n - 1. The two kernels run once per pass of as many tokens as the
//   workspace has rows (a budget keeps long contexts x long prefill chunks from taking GBs).
// No allocation, no synchronisation, grids from T, the workspace, the shape and the SM count
// only (key counts are read on the device): graph capturable.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/attention/dsa_cuda.h"
#include "ops/rope/rope_turn.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kMaxHeadDim = 256;   // index keys: at most 2 dims per thread of a 128-thread block
constexpr int kMaxQFloats = 8192;  // Hi * D: the score kernel's turned queries in shared memory
constexpr int kMaxTopk = 1 << 20;  // no storage scales with topk; a sanity bound

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void check_cuda_shape(const DsaShape& s, const char* op) {
  check_dsa_shape(s);
  const std::string why = dsa_unsupported_reason(s);
  TETRA_CHECK(why.empty(), op, " (cuda): ", why);
}

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Token t's sequence: the last b with cu_seqlens[b] <= t (cu_seqlens [S + 1]).
__device__ __forceinline__ int sequence_of(const int32_t* cu_seqlens, int S, int t) {
  int lo = 0, hi = S - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Cache slot of key j of sequence b (whose first token is `first`): mla_key_slot on the device.
__device__ __forceinline__ int64_t key_slot(const MlaKeys& k, int b, int first, int j) {
  if (k.step_slots) return k.step_slots[first + j];
  const int32_t blk = k.block_tables[int64_t(b) * k.max_blocks_per_seq + j / k.block_size];
  return int64_t(blk) * k.block_size + j % k.block_size;
}

// Token t's key count as both select kernels see it: positions[t] + 1, capped at the
// workspace's row (max_keys).
__device__ __forceinline__ int key_count(const int32_t* positions, int t, int max_keys) {
  return min(positions[t] + 1, max_keys);
}

// ---- dsa_index_keys -----------------------------------------------------------------------

constexpr int kKeyThreads = 128;
constexpr int kKeyWarps = kKeyThreads / 32;

struct KeyArgs {
  const __nv_bfloat16* wk_out;  // [T, D]
  const __nv_bfloat16* ln_w;    // [D]
  const __nv_bfloat16* ln_b;    // [D]
  const int32_t* positions;     // [T]
  const int64_t* slots;         // [T]
  const float* inv_freq;        // [Dr / 2]
  float eps;
  int D, Dr;
  bool neox;
  __nv_bfloat16* key_cache;  // [num_slots, D]
};

// Sum of v over the block (kKeyThreads threads), in every thread. `part` [kKeyWarps] is
// reused, so the call ends with a barrier.
__device__ double key_block_sum(double v, double* part) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0.0;
#pragma unroll
  for (int w = 0; w < kKeyWarps; ++w) total += part[w];
  __syncthreads();
  return total;
}

// A block per token: k = bf16(rope(bf16((x - mean) * inv_std * w + b))) into its cache slot.
// Mean and variance in double as on the CPU (a D-element row per token: the cost is nothing),
// so the normed key matches the CPU's bits; the turn uses the shared rope_turn steps.
__global__ void __launch_bounds__(kKeyThreads) index_keys_kernel(KeyArgs a) {
  const int t = blockIdx.x;
  const int64_t slot = a.slots[t];
  if (slot < 0) return;  // the whole block leaves before its barriers
  __shared__ double part[kKeyWarps];
  __shared__ __nv_bfloat16 k_s[kMaxHeadDim];  // [D] the normed key, rounded to bf16
  const __nv_bfloat16* x = a.wk_out + int64_t(t) * a.D;
  double sum = 0.0;
  for (int c = threadIdx.x; c < a.D; c += kKeyThreads) sum += double(__bfloat162float(x[c]));
  const double mean = key_block_sum(sum, part) / a.D;
  double ss = 0.0;
  for (int c = threadIdx.x; c < a.D; c += kKeyThreads) {
    const double d = double(__bfloat162float(x[c])) - mean;
    ss += d * d;
  }
  const double var = key_block_sum(ss, part);
  const float inv_std = float(1.0 / sqrt(var / a.D + double(a.eps)));
  const float mean_f = float(mean);
  for (int c = threadIdx.x; c < a.D; c += kKeyThreads) {  // ((x - mean) * inv_std) * w + b
    const float n = __fmul_rn(__fsub_rn(__bfloat162float(x[c]), mean_f), inv_std);
    k_s[c] = __float2bfloat16_rn(
        __fadd_rn(__fmul_rn(n, __bfloat162float(a.ln_w[c])), __bfloat162float(a.ln_b[c])));
  }
  __syncthreads();
  __nv_bfloat16* dst = a.key_cache + slot * a.D;
  const int half = a.Dr / 2;
  const float pos = float(a.positions[t]);
  for (int i = threadIdx.x; i < half; i += kKeyThreads) {
    float sn, cs;
    sincosf(__fmul_rn(pos, a.inv_freq[i]), &sn, &cs);
    int ia, ib;
    rope_pair_dims(i, half, a.neox, ia, ib);
    rope_turn(__bfloat162float(k_s[ia]), __bfloat162float(k_s[ib]), sn, cs, dst[ia], dst[ib]);
  }
  for (int c = a.Dr + threadIdx.x; c < a.D; c += kKeyThreads) dst[c] = k_s[c];
}

// ---- dsa_select: scores -------------------------------------------------------------------

constexpr int kScoreThreads = 256;
constexpr int kScoreWarps = kScoreThreads / 32;
constexpr int kMaxScoreSplit = 256;  // blocks per token at most (decode: few tokens, many keys)

struct ScoreArgs {
  const __nv_bfloat16* q;          // [T, Hi, D]
  const __nv_bfloat16* weights;    // [T, Hi]
  const __nv_bfloat16* key_cache;  // [num_slots, D], 16-byte aligned rows
  const int32_t* cu_seqlens;       // [S + 1]
  const int32_t* positions;        // [T]
  MlaKeys keys;
  const float* inv_freq;  // [Dr / 2]
  int S, Hi, D, Dr, topk, max_keys;
  bool neox;
  float scale;        // D^-0.5
  float head_weight;  // Hi^-0.5
  int t0;             // this pass's first token: block x scores token t0 + x
  float* scores;      // [tokens of the pass, max_keys]
};

// Where dim d of head h sits in the score kernel's q tile: per head, the dims of 16-byte key
// chunk c (8c .. 8c + 7) split into two float4 planes, [2, D / 8, 4], so that the lanes of a key,
// reading chunks c = 0, 1, .., read consecutive float4s (no bank conflicts).
__device__ __forceinline__ int q_tile_at(int h, int d, int D) {
  return h * D + ((d % 8) / 4) * (D / 2) + (d / 8) * 4 + d % 4;
}

// L: lanes per key, the power of two >= D / 8; 32 / L keys per warp step. Lane l of a key's
// group holds key dims 8l .. 8l + 7 (none when l >= D / 8).
template <int L>
__global__ void __launch_bounds__(kScoreThreads) score_kernel(ScoreArgs a) {
  extern __shared__ float4 score_smem[];
  float* q_s = reinterpret_cast<float*>(score_smem);  // [Hi, 2, D / 8, 4] turned q (q_tile_at)
  float* w_s = q_s + a.Hi * a.D;                       // [Hi] weights[t, h] * Hi^-0.5
  float* sin_s = w_s + a.Hi;                           // [Dr / 2]
  float* cos_s = sin_s + a.Dr / 2;                     // [Dr / 2]
  const int t = a.t0 + int(blockIdx.x);
  const int n = key_count(a.positions, t, a.max_keys);
  if (n <= a.topk) return;  // keeps every key: nothing to rank

  // q[t] as float, the weights, the angles; then the turn, rounded to bf16 as the CPU does.
  const int half = a.Dr / 2;
  const float pos = float(a.positions[t]);
  const __nv_bfloat16* qt = a.q + int64_t(t) * a.Hi * a.D;
  for (int i = threadIdx.x; i < a.Hi * a.D; i += kScoreThreads)
    q_s[q_tile_at(i / a.D, i % a.D, a.D)] = __bfloat162float(qt[i]);
  for (int h = threadIdx.x; h < a.Hi; h += kScoreThreads)
    w_s[h] = __fmul_rn(__bfloat162float(a.weights[int64_t(t) * a.Hi + h]), a.head_weight);
  for (int i = threadIdx.x; i < half; i += kScoreThreads)
    sincosf(__fmul_rn(pos, a.inv_freq[i]), &sin_s[i], &cos_s[i]);
  __syncthreads();
  for (int i = threadIdx.x; i < a.Hi * half; i += kScoreThreads) {
    const int h = i / half, p = i % half;
    int ia, ib;
    rope_pair_dims(p, half, a.neox, ia, ib);
    float& qa = q_s[q_tile_at(h, ia, a.D)];
    float& qb = q_s[q_tile_at(h, ib, a.D)];
    __nv_bfloat16 ra, rb;
    rope_turn(qa, qb, sin_s[p], cos_s[p], ra, rb);
    qa = __bfloat162float(ra);
    qb = __bfloat162float(rb);
  }
  __syncthreads();

  constexpr int G = 32 / L;  // keys per warp step
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group = lane / L, chunk = lane % L, n_chunks = a.D / 8;
  const bool has_chunk = chunk < n_chunks;
  const int my_chunk = has_chunk ? chunk : 0;  // lanes without a chunk read chunk 0, times 0
  const float4* q4 = reinterpret_cast<const float4*>(q_s);
  const int b = sequence_of(a.cu_seqlens, a.S, t), first = a.cu_seqlens[b];
  float* row = a.scores + int64_t(blockIdx.x) * a.max_keys;
  const int step = gridDim.y * kScoreWarps * G;
  // j0 is uniform over the warp, so every lane takes part in the shuffles.
  for (int j0 = (blockIdx.y * kScoreWarps + warp) * G; j0 < n; j0 += step) {
    const int j = j0 + group;
    float k[8] = {};  // this lane's 8 key dims
    if (j < n && has_chunk) {
      const uint4 raw = *reinterpret_cast<const uint4*>(
          a.key_cache + key_slot(a.keys, b, first, j) * a.D + chunk * 8);
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        k[2 * e] = __uint_as_float(w[e] << 16);
        k[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
      }
    }
    float sum = 0.0f;
#pragma unroll 4
    for (int h = 0; h < a.Hi; ++h) {
      const float4 qa = q4[h * (a.D / 4) + my_chunk];                 // dims 8c .. 8c + 3
      const float4 qb = q4[h * (a.D / 4) + n_chunks + my_chunk];      // dims 8c + 4 .. 8c + 7
      float dot = qa.x * k[0] + qa.y * k[1] + qa.z * k[2] + qa.w * k[3] + qb.x * k[4] +
                  qb.y * k[5] + qb.z * k[6] + qb.w * k[7];
#pragma unroll
      for (int o = L / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      // The CPU's steps after the dot: relu(dot * scale) * w, summed over heads in order.
      sum = __fadd_rn(sum, __fmul_rn(fmaxf(__fmul_rn(dot, a.scale), 0.0f), w_s[h]));
    }
    if (j < n && chunk == 0) row[j] = sum;
  }
}

template <int L>
cudaError_t launch_score(const ScoreArgs& a, int T, int split, cudaStream_t stream) {
  const size_t smem = (size_t(a.Hi) * a.D + a.Hi + a.Dr) * sizeof(float);
  score_kernel<L><<<dim3(unsigned(T), unsigned(split)), kScoreThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

// ---- dsa_select: top-k --------------------------------------------------------------------

constexpr int kSelectThreads = 512;
constexpr int kSelectWarps = kSelectThreads / 32;
constexpr int kBins = 256;  // 8-bit digits: four passes over a 32-bit key at most
static_assert(kSelectThreads >= kBins, "a thread per bin in the digit scan");
static_assert(kSelectThreads < (1 << 16), "two 16-bit counts packed in one scan word");

struct SelectArgs {
  const float* scores;       // [tokens of the pass, max_keys]
  const int32_t* positions;  // [T]
  int topk, max_keys;
  int t0;             // this pass's first token: block x selects for token t0 + x
  int32_t* selected;  // [T, topk]
};

// Order-preserving unsigned key of a float: a > b as floats <=> key(a) > key(b) as uint32
// (positives get the sign bit set, negatives are inverted; -0 counts as +0, as float
// comparison does).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t bits = f == 0.0f ? 0u : __float_as_uint(f);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Inclusive prefix sum of v over the block's threads in thread order; `total` gets the block's
// sum. Ends with a barrier, so calls may follow each other.
__device__ uint32_t select_block_scan(uint32_t v, uint32_t& total) {
  __shared__ uint32_t warp_sums[kSelectWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t x = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += x;
  }
  if (lane == 31) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    uint32_t s = lane < kSelectWarps ? warp_sums[lane] : 0u;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t x = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += x;
    }
    if (lane < kSelectWarps) warp_sums[lane] = s;
  }
  __syncthreads();
  if (warp > 0) v += warp_sums[warp - 1];
  total = warp_sums[kSelectWarps - 1];
  __syncthreads();
  return v;
}

// A block per token: the positions of its k = min(topk, n) best keys, ascending, ties to the
// lower position. Radix select: `prefix` (under `mask`, the digits fixed so far) narrows to the
// k-th largest key's bits, `remaining` counts how many keys matching the prefix still belong
// to the top k. It stops early once the whole matching bin belongs (it would take them all
// anyway). Then keys above the prefix all go, plus the first `remaining` matching it.
__global__ void __launch_bounds__(kSelectThreads) select_kernel(SelectArgs a) {
  __shared__ uint32_t hist[kBins];
  __shared__ uint32_t pick_digit, pick_remaining, pick_bin;
  const int t = a.t0 + int(blockIdx.x);
  const int n = key_count(a.positions, t, a.max_keys);
  int32_t* out = a.selected + int64_t(t) * a.topk;
  if (n <= a.topk) {  // every key, in order (n <= 0 writes nothing)
    for (int j = threadIdx.x; j < n; j += kSelectThreads) out[j] = j;
    return;
  }
  const uint32_t k = uint32_t(a.topk);
  const float* row = a.scores + int64_t(blockIdx.x) * a.max_keys;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  uint32_t prefix = 0, mask = 0, remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kBins; i += kSelectThreads) hist[i] = 0;
    __syncthreads();
    // Histogram of this digit over the keys matching the prefix; lanes with the same digit add
    // once (__match_any_sync), since scores crowd into few bins on the first passes.
    for (int base = warp * 32; base < n; base += kSelectThreads) {  // uniform over the warp
      const int j = base + lane;
      uint32_t digit = kBins;  // no digit: past n or off the prefix
      if (j < n) {
        const uint32_t u = order_key(row[j]);
        if ((u & mask) == prefix) digit = (u >> shift) & 0xffu;
      }
      const uint32_t peers = __match_any_sync(0xffffffffu, digit);
      if (digit < kBins && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], __popc(peers));
    }
    __syncthreads();
    // Bins from the highest digit down: the one where the running count reaches `remaining`.
    const uint32_t own = threadIdx.x < kBins ? hist[kBins - 1 - threadIdx.x] : 0u;
    uint32_t total;
    const uint32_t incl = select_block_scan(own, total);
    if (threadIdx.x < kBins && incl >= remaining && incl - own < remaining) {
      pick_digit = kBins - 1 - threadIdx.x;
      pick_remaining = remaining - (incl - own);
      pick_bin = own;
    }
    __syncthreads();
    prefix |= pick_digit << shift;
    mask |= 0xffu << shift;
    remaining = pick_remaining;
    const bool whole_bin = pick_bin == remaining;
    __syncthreads();  // every thread has read pick_* before the next pass may write them
    if (whole_bin) break;
  }

  // Ordered compaction: a key's output index is the number of kept keys before it, counted by
  // one block scan per tile of keys (above the prefix in the low half, matching it in the high).
  uint32_t above_before_tile = 0, equal_before_tile = 0;
  for (int base = 0; base < n; base += kSelectThreads) {
    const int j = base + threadIdx.x;
    bool above = false, equal = false;
    if (j < n) {
      const uint32_t m = order_key(row[j]) & mask;
      above = m > prefix;
      equal = m == prefix;
    }
    const uint32_t packed = uint32_t(above) | (uint32_t(equal) << 16);
    uint32_t tile_total;
    const uint32_t excl = select_block_scan(packed, tile_total) - packed;
    const uint32_t above_before = above_before_tile + (excl & 0xffffu);
    const uint32_t equal_before = equal_before_tile + (excl >> 16);
    if (above || (equal && equal_before < remaining))
      out[above_before + min(equal_before, remaining)] = j;
    above_before_tile += tile_total & 0xffffu;
    equal_before_tile += tile_total >> 16;
    if (above_before_tile + min(equal_before_tile, remaining) >= k) break;  // uniform
  }
}

}  // namespace

std::string dsa_unsupported_reason(const DsaShape& s) {
  // 16-byte key chunks; the index-keys block holds the row in shared memory; the score kernel
  // holds the token's turned queries in shared memory.
  if (s.head_dim % 8 != 0 || s.head_dim > kMaxHeadDim)
    return str("index_head_dim ", s.head_dim, " (the CUDA DSA kernels take a multiple of 8 up to ",
               kMaxHeadDim, ")");
  if (int64_t(s.n_heads) * s.head_dim > kMaxQFloats)
    return str("index_n_heads x index_head_dim = ", int64_t(s.n_heads) * s.head_dim,
               " (the CUDA DSA kernels take up to ", kMaxQFloats, ")");
  if (s.topk > kMaxTopk)
    return str("index_topk ", s.topk, " (the CUDA DSA kernels take up to ", kMaxTopk, ")");
  return "";
}

cudaError_t dsa_index_keys(const uint16_t* wk_out, const uint16_t* ln_w, const uint16_t* ln_b,
                           float eps, const int32_t* positions, const int64_t* slots, int T,
                           const float* inv_freq, const DsaShape& s, int64_t num_slots,
                           uint16_t* key_cache, cudaStream_t stream) {
  (void)num_slots;  // slots are trusted on the device (dsa_cuda.h)
  check_cuda_shape(s, "dsa index keys");
  TETRA_CHECK(T >= 0 && eps > 0, "dsa index keys (cuda): T ", T, " eps ", eps);
  if (T == 0) return cudaSuccess;
  KeyArgs a;
  a.wk_out = reinterpret_cast<const __nv_bfloat16*>(wk_out);
  a.ln_w = reinterpret_cast<const __nv_bfloat16*>(ln_w);
  a.ln_b = reinterpret_cast<const __nv_bfloat16*>(ln_b);
  a.positions = positions;
  a.slots = slots;
  a.inv_freq = inv_freq;
  a.eps = eps;
  a.D = s.head_dim;
  a.Dr = s.rope_dim;
  a.neox = s.style == RopeStyle::NeoX;
  a.key_cache = reinterpret_cast<__nv_bfloat16*>(key_cache);
  index_keys_kernel<<<unsigned(T), kKeyThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

size_t dsa_select_workspace_bytes(int max_tokens, int max_keys) {
  TETRA_CHECK(max_tokens >= 0 && max_keys >= 0, "dsa select workspace: ", max_tokens,
              " tokens, ", max_keys, " keys");
  const size_t row = size_t(max_keys) * sizeof(float);
  if (row == 0) return 0;
  const size_t rows = std::clamp<size_t>(kDsaScoreWorkspaceBudget / row, 1, size_t(max_tokens));
  return max_tokens == 0 ? 0 : rows * row;
}

cudaError_t dsa_select(const uint16_t* q, const uint16_t* weights, const uint16_t* key_cache,
                       int64_t num_slots, const int32_t* cu_seqlens, int S,
                       const int32_t* positions, const MlaKeys& keys, const float* inv_freq,
                       const DsaShape& s, int32_t* selected, int T, int max_keys, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream) {
  (void)num_slots;  // slots are trusted on the device (dsa_cuda.h)
  check_cuda_shape(s, "dsa select");
  TETRA_CHECK(T >= 0 && (S >= 1 || T == 0), "dsa select (cuda): ", S, " sequences, ", T,
              " tokens");
  TETRA_CHECK(keys.step_slots != nullptr ||
                  (keys.block_tables != nullptr && keys.block_size > 0 &&
                   keys.max_blocks_per_seq > 0),
              "dsa select (cuda): keys need step slots or block tables");
  TETRA_CHECK(max_keys >= 1, "dsa select (cuda): max_keys ", max_keys);
  const size_t row_bytes = size_t(max_keys) * sizeof(float);
  TETRA_CHECK(T == 0 || workspace_bytes >= row_bytes, "dsa select (cuda): workspace of ",
              workspace_bytes, " bytes; one token's scores over ", max_keys, " keys take ",
              row_bytes);
  TETRA_CHECK(aligned(key_cache, 16) && aligned(workspace, 4),
              "dsa select (cuda): key_cache must be 16-byte aligned, the workspace 4-byte");
  if (T == 0) return cudaSuccess;

  ScoreArgs a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(q);
  a.weights = reinterpret_cast<const __nv_bfloat16*>(weights);
  a.key_cache = reinterpret_cast<const __nv_bfloat16*>(key_cache);
  a.cu_seqlens = cu_seqlens;
  a.positions = positions;
  a.keys = keys;
  a.inv_freq = inv_freq;
  a.S = S;
  a.Hi = s.n_heads;
  a.D = s.head_dim;
  a.Dr = s.rope_dim;
  a.topk = s.topk;
  a.max_keys = max_keys;
  a.neox = s.style == RopeStyle::NeoX;
  a.scale = float(1.0 / std::sqrt(double(s.head_dim)));    // as dsa_select_cpu
  a.head_weight = float(1.0 / std::sqrt(double(s.n_heads)));
  a.scores = static_cast<float*>(workspace);
  SelectArgs sa;
  sa.scores = a.scores;
  sa.positions = positions;
  sa.topk = s.topk;
  sa.max_keys = max_keys;
  sa.selected = selected;
  // The tokens in passes of as many as the workspace has score rows for (one pass unless T x
  // max_keys floats would pass dsa_select_workspace_bytes' budget); the stream orders each
  // pass's select before the next pass's scores overwrite the rows.
  const int pass_tokens = int(std::min<size_t>(size_t(T), workspace_bytes / row_bytes));
  // Enough blocks to fill the GPU a few times over when there are few tokens (decode); the
  // split depends on T, the workspace and the SM count only, never on the key counts.
  const int64_t target = 4 * int64_t(current_device_sm_count());
  const int split =
      int(std::clamp<int64_t>((target + pass_tokens - 1) / pass_tokens, 1, kMaxScoreSplit));
  for (int t0 = 0; t0 < T; t0 += pass_tokens) {
    const int n = std::min(pass_tokens, T - t0);
    a.t0 = sa.t0 = t0;
    cudaError_t err;
    switch (s.head_dim / 8) {  // 16-byte chunks per key row -> lanes per key
      case 1: err = launch_score<1>(a, n, split, stream); break;
      case 2: err = launch_score<2>(a, n, split, stream); break;
      case 3: case 4: err = launch_score<4>(a, n, split, stream); break;
      case 5: case 6: case 7: case 8: err = launch_score<8>(a, n, split, stream); break;
      default:
        err = s.head_dim / 8 <= 16 ? launch_score<16>(a, n, split, stream)
                                   : launch_score<32>(a, n, split, stream);
    }
    if (err != cudaSuccess) return err;
    select_kernel<<<unsigned(n), kSelectThreads, 0, stream>>>(sa);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace tetra::ops::cuda
