// Split paged decode attention (see split_decode_attention.h).
#include "core/kernel_launch.h"
#include "model/cuda/split_decode_attention.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace tetra::model::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kChunk = kSplitChunkTokens;
constexpr int kMaxGroup = 16;

struct SplitArgs {
  const uint16_t* q;        // [S, q_step]
  const uint16_t* k_cache;  // [blocks, block_size, n_kv, D]
  const uint16_t* v_cache;
  const int32_t* tables;    // [S, max_blocks]
  const int32_t* lens;      // [S]
  int max_blocks, block_size, n_kv, group, splits, split_tokens;
  int64_t q_step;
  float scale;
  float* part_acc;  // [S, H, splits, D] un-normalised sums
  float* part_ml;   // [S, H, splits, 2] (running max, sum of exp)
  int* arrivals;    // [S, n_kv] splits finished so far; zero between launches
  uint16_t* out;    // [S, H, D] bf16
};

// The last split block of a (sequence, kv head) to finish merges the group's partials:
//   out[s, h, :] = sum_p e^(m_p - M) acc_p / sum_p e^(m_p - M) l_p over the splits p,
// so no second launch is needed. Partials are read through L2 (__ldcg): other blocks wrote them.
// The block leaves its arrival counter at zero for the next launch (and graph replay).
// weight: the caller's score scratch, free once its chunks are done (static shared memory is
// capped at 48 KB and the kernels are near it).
static_assert(kChunk >= kMaxSplits, "the score scratch holds one weight per split");
template <int D>
__device__ void merge_if_last(const SplitArgs& a, int s, int kh, float (*weight)[kChunk]) {
  __shared__ int last;
  __shared__ float den_s[kMaxGroup];  // per head: sum_p e^(m_p - M) l_p
  __threadfence();  // this block's partials are visible device-wide before it counts itself
  __syncthreads();
  int* counter = a.arrivals + int64_t(s) * a.n_kv + kh;
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == a.splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int G = a.group, H = a.n_kv * G, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < G; i += kThreads / 32) {
    const float* ml = a.part_ml + (int64_t(s) * H + kh * G + i) * a.splits * 2;
    float m[2], l[2], mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int p = lane + 32 * r;
      m[r] = p < a.splits ? __ldcg(ml + 2 * p) : -INFINITY;
      l[r] = p < a.splits ? __ldcg(ml + 2 * p + 1) : 0.0f;
      mx = fmaxf(mx, m[r]);
    }
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float den = 0.0f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int p = lane + 32 * r;
      const float e = l[r] > 0.0f ? expf(m[r] - mx) : 0.0f;
      if (p < a.splits) weight[i][p] = e;
      den += e * l[r];
    }
    for (int o = 16; o > 0; o /= 2) den += __shfl_xor_sync(0xffffffffu, den, o);
    if (lane == 0) den_s[i] = den;
  }
  __syncthreads();
  // Splits past the sequence's end are empty (weight 0, acc 0): only the first `active` are read.
  // A thread owns up to kItems float4 outputs (4 dims of one head each) and keeps 4 splits' loads
  // of all of them in flight at once: the merge sits on the layer's critical path, so it must
  // not be a chain of dependent L2 round trips.
  constexpr int kItems = kMaxGroup * D / 4 / kThreads;
  const int active = min(a.splits, (a.lens[s] + a.split_tokens - 1) / a.split_tokens);
  const int items = G * D / 4;
  float4 num[kItems];
#pragma unroll
  for (int it = 0; it < kItems; ++it) num[it] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int p0 = 0; p0 < active; p0 += 4) {
    float4 v[kItems][4];
#pragma unroll
    for (int it = 0; it < kItems; ++it) {
      const int idx = threadIdx.x + it * kThreads;
      const int i = idx / (D / 4), d4 = idx % (D / 4);
      const float4* acc = reinterpret_cast<const float4*>(
                              a.part_acc + (int64_t(s) * H + kh * G + i) * a.splits * D) + d4;
#pragma unroll
      for (int u = 0; u < 4; ++u)
        v[it][u] = idx < items && p0 + u < active ? __ldcg(acc + int64_t(p0 + u) * (D / 4))
                                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int it = 0; it < kItems; ++it) {
      const int i = min((threadIdx.x + it * kThreads) / (D / 4), G - 1);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float w = p0 + u < active ? weight[i][p0 + u] : 0.0f;
        num[it].x += w * v[it][u].x, num[it].y += w * v[it][u].y;
        num[it].z += w * v[it][u].z, num[it].w += w * v[it][u].w;
      }
    }
  }
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int idx = threadIdx.x + it * kThreads;
    if (idx >= items) continue;
    const int i = idx / (D / 4), d4 = idx % (D / 4);
    const int64_t o = (int64_t(s) * H + kh * G + i) * D + 4 * d4;
    const float den = den_s[i];
    const float r[4] = {num[it].x, num[it].y, num[it].z, num[it].w};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      a.out[o + e] = __bfloat16_as_ushort(__float2bfloat16_rn(den > 0.0f ? r[e] / den : 0.0f));
  }
  if (threadIdx.x == 0) *counter = 0;
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Rows of a chunk in shared memory are padded to D + 2 bf16 (an odd number of 32-bit words), so
// threads of a warp reading the same column of consecutive tokens hit distinct banks.
template <int D>
__global__ void __launch_bounds__(kThreads) split_kernel(SplitArgs a) {
  constexpr int kRowWords = D / 2 + 1;
  __shared__ uint32_t ks[kChunk * kRowWords];  // [64 tokens][D/2 + 1] bf16 pairs
  __shared__ uint32_t vs[kChunk * kRowWords];
  __shared__ float qs[kMaxGroup][D];            // the group's queries, pre-scaled
  __shared__ float ps[kMaxGroup][kChunk];       // scores, then probabilities
  __shared__ float m_run[kMaxGroup], l_run[kMaxGroup], rescale[kMaxGroup];

  const int split = blockIdx.x, kh = blockIdx.y, s = blockIdx.z;
  const int tid = threadIdx.x, G = a.group;
  const int len = a.lens[s];
  const int begin = split * a.split_tokens;
  const int end = min(len, begin + a.split_tokens);
  const int32_t* table = a.tables + int64_t(s) * a.max_blocks;
  const int64_t row_elems = int64_t(a.n_kv) * D;

  for (int i = tid; i < G * D; i += kThreads) {
    const int h = kh * G + i / D;
    qs[i / D][i % D] = __uint_as_float(uint32_t(a.q[int64_t(s) * a.q_step + int64_t(h) * D + i % D]) << 16) * a.scale;
  }
  if (tid < G) m_run[tid] = -INFINITY, l_run[tid] = 0.0f;
  // Output pairs (head, dim pair) owned by this thread: idx = tid + kThreads * r.
  constexpr int kPairsMax = kMaxGroup * D / 2 / kThreads;
  float acc[kPairsMax][2];
#pragma unroll
  for (int r = 0; r < kPairsMax; ++r) acc[r][0] = acc[r][1] = 0.0f;
  __syncthreads();

  for (int c0 = begin; c0 < end; c0 += kChunk) {
    const int n = min(kChunk, end - c0);
    // Stage K and V rows of the chunk: 16-byte global loads, all issued before any use.
    constexpr int kVecPerRow = D / 8;
    for (int i = tid; i < n * kVecPerRow; i += kThreads) {
      const int j = i / kVecPerRow, v = i % kVecPerRow;
      const int t = c0 + j;
      const int64_t slot = int64_t(table[t / a.block_size]) * a.block_size + t % a.block_size;
      const int64_t off = slot * row_elems + int64_t(kh) * D + v * 8;
      const uint4 kv4 = *reinterpret_cast<const uint4*>(a.k_cache + off);
      const uint4 vv4 = *reinterpret_cast<const uint4*>(a.v_cache + off);
      uint32_t* kd = ks + j * kRowWords + v * 4;
      uint32_t* vd = vs + j * kRowWords + v * 4;
      kd[0] = kv4.x, kd[1] = kv4.y, kd[2] = kv4.z, kd[3] = kv4.w;
      vd[0] = vv4.x, vd[1] = vv4.y, vd[2] = vv4.z, vd[3] = vv4.w;
    }
    __syncthreads();
    // Scores: thread -> token tid % 64, heads tid / 64, +2, +4, ...
    {
      const int j = tid % kChunk;
      for (int i = tid / kChunk; i < G; i += kThreads / kChunk) {
        float dot = -INFINITY;
        if (j < n) {
          dot = 0.0f;
          const uint32_t* kr = ks + j * kRowWords;
#pragma unroll 8
          for (int w = 0; w < D / 2; ++w) {
            const uint32_t kk = kr[w];
            dot = fmaf(qs[i][2 * w], bf16_lo(kk), dot);
            dot = fmaf(qs[i][2 * w + 1], bf16_hi(kk), dot);
          }
        }
        ps[i][j] = dot;
      }
    }
    __syncthreads();
    // Running softmax per head: one warp per head.
    {
      const int warp = tid / 32, lane = tid % 32;
      for (int i = warp; i < G; i += kThreads / 32) {
        const float s0 = ps[i][lane], s1 = ps[i][lane + 32];
        float mx = fmaxf(s0, s1);
        for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float m_new = fmaxf(m_run[i], mx);  // finite: the chunk has at least one token
        const float p0 = expf(s0 - m_new), p1 = expf(s1 - m_new);
        ps[i][lane] = p0;
        ps[i][lane + 32] = p1;
        float sum = p0 + p1;
        for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (lane == 0) {
          const float f = expf(m_run[i] - m_new);  // 0 on the first chunk (m_run = -inf)
          rescale[i] = f;
          l_run[i] = l_run[i] * f + sum;
          m_run[i] = m_new;
        }
      }
    }
    __syncthreads();
    // Weighted values: thread -> (head, dim pair) idx = tid + kThreads * r.
#pragma unroll
    for (int r = 0; r < kPairsMax; ++r) {
      const int idx = tid + kThreads * r;
      const int i = idx / (D / 2), w = idx % (D / 2);
      if (i < G) {
        const float f = rescale[i];
        float x0 = acc[r][0] * f, x1 = acc[r][1] * f;
        for (int j = 0; j < n; ++j) {
          const float p = ps[i][j];
          const uint32_t vv = vs[j * kRowWords + w];
          x0 = fmaf(p, bf16_lo(vv), x0);
          x1 = fmaf(p, bf16_hi(vv), x1);
        }
        acc[r][0] = x0;
        acc[r][1] = x1;
      }
    }
    __syncthreads();  // ks/vs/ps are reused by the next chunk
  }

  const int H = a.n_kv * G;
#pragma unroll
  for (int r = 0; r < kPairsMax; ++r) {
    const int idx = tid + kThreads * r;
    const int i = idx / (D / 2), w = idx % (D / 2);
    if (i < G) {
      const int64_t part = (int64_t(s) * H + kh * G + i) * a.splits + split;
      a.part_acc[part * D + 2 * w] = acc[r][0];
      a.part_acc[part * D + 2 * w + 1] = acc[r][1];
    }
  }
  if (tid < G) {
    const int64_t part = (int64_t(s) * H + kh * G + tid) * a.splits + split;
    a.part_ml[part * 2] = m_run[tid];  // -inf with l = 0 for an empty split
    a.part_ml[part * 2 + 1] = l_run[tid];
  }
  merge_if_last<D>(a, s, kh, ps);
}


// Tensor-core variant: the same chunks and running softmax, but Q.K^T and P.V as
// mma.sync.m16n8k16 (bf16 in, f32 accumulate) with the group's <= 16 query heads as the M side.
// P is rounded to bf16 for P.V (as the prefill kernel and FlashAttention do). Rows of the staged
// chunk are padded to D/2 + 4 words: fragment loads of the 8 row groups x 4 lanes hit 32
// distinct banks, and rows stay 16-byte aligned for the staging stores.
__device__ __forceinline__ void mma_16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int D>
__global__ void __launch_bounds__(kThreads) split_mma_kernel(SplitArgs a) {
  constexpr int kRW = D / 2 + 4;            // words per staged K/V row
  constexpr int kPW = kChunk / 2 + 4;       // words per P row
  constexpr int kQW = D / 2 + 4;            // words per Q row
  constexpr int kTilesPerWarp = D / 8 / 4;  // P.V: each warp owns D/4 output dims
  __shared__ __align__(16) uint32_t ks[kChunk * kRW];
  __shared__ __align__(16) uint32_t vs[kChunk * kRW];
  __shared__ uint32_t qw[kMaxGroup * kQW];  // bf16 pairs, rows >= G zero
  __shared__ uint32_t pw[kMaxGroup * kPW];  // P as bf16 pairs, rows >= G zero
  __shared__ float ps[kMaxGroup][kChunk];
  __shared__ float m_run[kMaxGroup], l_run[kMaxGroup], rescale[kMaxGroup];

  // A programmatic dependent (the o_proj GEMV) may start streaming its weights now; it waits for
  // this grid before it reads the attention output.
  asm volatile("griddepcontrol.launch_dependents;");
  // Launched as a programmatic dependent itself (of the RoPE + KV write): wait for it before
  // reading q or the cache.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int split = blockIdx.x, kh = blockIdx.y, s = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int G = a.group;
  const int len = a.lens[s];
  const int begin = split * a.split_tokens;
  const int end = min(len, begin + a.split_tokens);
  const int32_t* table = a.tables + int64_t(s) * a.max_blocks;
  const int64_t row_elems = int64_t(a.n_kv) * D;

  for (int i = tid; i < kMaxGroup * kQW; i += kThreads) {
    const int h = i / kQW, w = i % kQW;
    uint32_t v = 0;
    if (h < G && w < D / 2)
      v = *reinterpret_cast<const uint32_t*>(a.q + int64_t(s) * a.q_step + int64_t(kh * G + h) * D + 2 * w);
    qw[i] = v;
  }
  for (int i = tid; i < kMaxGroup * kPW; i += kThreads) pw[i] = 0;
  if (tid < kMaxGroup) m_run[tid] = -INFINITY, l_run[tid] = 0.0f, rescale[tid] = 0.0f;
  float acc[kTilesPerWarp][4];
#pragma unroll
  for (int j = 0; j < kTilesPerWarp; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  __syncthreads();

  for (int c0 = begin; c0 < end; c0 += kChunk) {
    const int n = min(kChunk, end - c0);
    constexpr int kVecPerRow = D / 8;
    for (int i = tid; i < kChunk * kVecPerRow; i += kThreads) {
      const int j = i / kVecPerRow, v = i % kVecPerRow;
      uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);  // zero rows past n
      if (j < n) {
        const int tok = c0 + j;
        const int64_t slot = int64_t(table[tok / a.block_size]) * a.block_size + tok % a.block_size;
        const int64_t off = slot * row_elems + int64_t(kh) * D + v * 8;
        kv4 = *reinterpret_cast<const uint4*>(a.k_cache + off);
        vv4 = *reinterpret_cast<const uint4*>(a.v_cache + off);
      }
      *reinterpret_cast<uint4*>(ks + j * kRW + v * 4) = kv4;
      *reinterpret_cast<uint4*>(vs + j * kRW + v * 4) = vv4;
    }
    __syncthreads();
    // Scores: warp w -> tokens 16w .. 16w+15 (two n8 tiles), all D in k16 steps.
    {
      float sc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
      for (int k0 = 0; k0 < D; k0 += 16) {
        uint32_t A[4];
        A[0] = qw[g * kQW + k0 / 2 + t];
        A[1] = qw[(g + 8) * kQW + k0 / 2 + t];
        A[2] = qw[g * kQW + k0 / 2 + 4 + t];
        A[3] = qw[(g + 8) * kQW + k0 / 2 + 4 + t];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int tok = 16 * warp + 8 * nt + g;
          mma_16816(sc[nt], A, ks[tok * kRW + k0 / 2 + t], ks[tok * kRW + k0 / 2 + 4 + t]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int head = g + (r >= 2 ? 8 : 0);
          const int tok = 16 * warp + 8 * nt + 2 * t + (r & 1);
          ps[head][tok] = tok < n ? sc[nt][r] * a.scale : -INFINITY;
        }
    }
    __syncthreads();
    for (int i = warp; i < G; i += kThreads / 32) {
      const float s0 = ps[i][lane], s1 = ps[i][lane + 32];
      float mx = fmaxf(s0, s1);
      for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m_run[i], mx);
      const float p0 = expf(s0 - m_new), p1 = expf(s1 - m_new);
      // P for the MMA in bf16; the running sum takes the same rounded values.
      const __nv_bfloat16 b0 = __float2bfloat16_rn(p0), b1 = __float2bfloat16_rn(p1);
      reinterpret_cast<__nv_bfloat16*>(pw + i * kPW)[lane] = b0;
      reinterpret_cast<__nv_bfloat16*>(pw + i * kPW)[lane + 32] = b1;
      float sum = __bfloat162float(b0) + __bfloat162float(b1);
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) {
        const float f = expf(m_run[i] - m_new);
        rescale[i] = f;
        l_run[i] = l_run[i] * f + sum;
        m_run[i] = m_new;
      }
    }
    __syncthreads();
    // P.V: warp w -> dims [w*D/4, (w+1)*D/4) in n8 tiles, tokens in k16 steps.
    {
      const float f_lo = rescale[g], f_hi = rescale[g + 8];
#pragma unroll
      for (int j = 0; j < kTilesPerWarp; ++j) {
        acc[j][0] *= f_lo, acc[j][1] *= f_lo, acc[j][2] *= f_hi, acc[j][3] *= f_hi;
      }
      const uint16_t* vh = reinterpret_cast<const uint16_t*>(vs);
#pragma unroll
      for (int k0 = 0; k0 < kChunk; k0 += 16) {
        uint32_t A[4];
        A[0] = pw[g * kPW + k0 / 2 + t];
        A[1] = pw[(g + 8) * kPW + k0 / 2 + t];
        A[2] = pw[g * kPW + k0 / 2 + 4 + t];
        A[3] = pw[(g + 8) * kPW + k0 / 2 + 4 + t];
#pragma unroll
        for (int j = 0; j < kTilesPerWarp; ++j) {
          const int dim = warp * (D / 4) + 8 * j + g;
          const int r0 = k0 + 2 * t, r1 = k0 + 2 * t + 8;
          const uint32_t b0 = uint32_t(vh[r0 * 2 * kRW + dim]) | (uint32_t(vh[(r0 + 1) * 2 * kRW + dim]) << 16);
          const uint32_t b1 = uint32_t(vh[r1 * 2 * kRW + dim]) | (uint32_t(vh[(r1 + 1) * 2 * kRW + dim]) << 16);
          mma_16816(acc[j], A, b0, b1);
        }
      }
    }
    __syncthreads();
  }

  const int H = a.n_kv * G;
#pragma unroll
  for (int j = 0; j < kTilesPerWarp; ++j)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int head = g + (r >= 2 ? 8 : 0);
      if (head < G) {
        const int dim = warp * (D / 4) + 8 * j + 2 * t + (r & 1);
        const int64_t part = (int64_t(s) * H + kh * G + head) * a.splits + split;
        a.part_acc[part * D + dim] = acc[j][r];
      }
    }
  if (tid < G) {
    const int64_t part = (int64_t(s) * H + kh * G + tid) * a.splits + split;
    a.part_ml[part * 2] = m_run[tid];
    a.part_ml[part * 2 + 1] = l_run[tid];
  }
  merge_if_last<D>(a, s, kh, ps);
}

struct SplitPlan {
  int splits = 1, split_tokens = kChunk;
};
SplitPlan plan_for(const ops::PagedKv& kv) {
  const int64_t max_tokens = std::max<int64_t>(1, int64_t(kv.max_blocks_per_seq) * kv.block_size);
  SplitPlan p;
  const int64_t chunks = (max_tokens + kChunk - 1) / kChunk;
  p.splits = int(std::min<int64_t>(chunks, kMaxSplits));
  p.split_tokens = int((chunks + p.splits - 1) / p.splits) * kChunk;
  return p;
}

}  // namespace

std::string split_decode_unsupported_reason(const ops::AttentionShape& s) {
  if (s.head_dim != 64 && s.head_dim != 128)
    return str("head_dim ", s.head_dim, " (the split decode kernel takes 64 or 128)");
  if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0) return "bad head counts";
  if (s.n_heads / s.n_kv_heads > kMaxGroup)
    return str("query heads per kv head ", s.n_heads / s.n_kv_heads, " > ", kMaxGroup);
  if (s.q_step() % 8 != 0 || s.kv_step() != int64_t(s.n_kv_heads) * s.head_dim)
    return "q rows must be 16-byte aligned and k/v packed";
  return "";
}

size_t split_decode_workspace_bytes(int num_seqs, const ops::AttentionShape& s,
                                    const ops::PagedKv& kv) {
  const SplitPlan p = plan_for(kv);
  return size_t(num_seqs) * s.n_heads * p.splits * (size_t(s.head_dim) + 2) * sizeof(float) +
         size_t(num_seqs) * s.n_kv_heads * sizeof(int);
}

cudaError_t split_decode_attention(const uint16_t* q, const ops::PagedKv& kv, int num_seqs,
                                   const ops::AttentionShape& s, void* workspace,
                                   size_t workspace_bytes, uint16_t* out, cudaStream_t stream,
                                   bool tensor_cores) {
  const std::string why = split_decode_unsupported_reason(s);
  if (!why.empty()) TETRA_FAIL("split decode attention: ", why);
  if (num_seqs <= 0) return cudaSuccess;
  TETRA_CHECK_LE(split_decode_workspace_bytes(num_seqs, s, kv), workspace_bytes);
  const SplitPlan p = plan_for(kv);
  SplitArgs a;
  a.q = q;
  a.k_cache = kv.k_cache;
  a.v_cache = kv.v_cache;
  a.tables = kv.block_tables;
  a.lens = kv.seq_lens;
  a.max_blocks = kv.max_blocks_per_seq;
  a.block_size = kv.block_size;
  a.n_kv = s.n_kv_heads;
  a.group = s.n_heads / s.n_kv_heads;
  a.splits = p.splits;
  a.split_tokens = p.split_tokens;
  a.q_step = s.q_step();
  a.scale = s.scale;
  a.part_acc = static_cast<float*>(workspace);
  a.part_ml = a.part_acc + size_t(num_seqs) * s.n_heads * p.splits * s.head_dim;
  a.arrivals = reinterpret_cast<int*>(a.part_ml + size_t(num_seqs) * s.n_heads * p.splits * 2);
  a.out = out;
  const dim3 grid(unsigned(p.splits), unsigned(s.n_kv_heads), unsigned(num_seqs));
  if (tensor_cores) {
    // Programmatic dependent launch: scheduled while the previous kernel drains; the kernel
    // waits for it before reading.
    const KernelLaunch launch(grid, dim3(kThreads), stream);
    if (s.head_dim == 64) return launch(split_mma_kernel<64>, a);
    return launch(split_mma_kernel<128>, a);
  } else if (s.head_dim == 64) {
    split_kernel<64><<<grid, kThreads, 0, stream>>>(a);
  } else {
    split_kernel<128><<<grid, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace tetra::model::cuda
