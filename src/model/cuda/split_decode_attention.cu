// Split paged decode attention (see split_decode_attention.h).
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
};

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
}

// out[s, h, :] = sum_p e^(m_p - M) acc_p / sum_p e^(m_p - M) l_p over the splits p.
__global__ void merge_kernel(const float* part_acc, const float* part_ml, int splits, int D,
                             uint16_t* out) {
  const int64_t sh = blockIdx.x;  // s * H + h
  const float* ml = part_ml + sh * splits * 2;
  float M = -INFINITY;
  for (int p = 0; p < splits; ++p) M = fmaxf(M, ml[2 * p]);
  float den = 0.0f;
  for (int p = 0; p < splits; ++p)
    if (ml[2 * p + 1] > 0.0f) den += expf(ml[2 * p] - M) * ml[2 * p + 1];
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.0f;
    for (int p = 0; p < splits; ++p)
      if (ml[2 * p + 1] > 0.0f) num += expf(ml[2 * p] - M) * part_acc[(sh * splits + p) * D + d];
    out[sh * D + d] = __bfloat16_as_ushort(__float2bfloat16_rn(den > 0.0f ? num / den : 0.0f));
  }
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
  return size_t(num_seqs) * s.n_heads * p.splits * (size_t(s.head_dim) + 2) * sizeof(float);
}

cudaError_t split_decode_attention(const uint16_t* q, const ops::PagedKv& kv, int num_seqs,
                                   const ops::AttentionShape& s, void* workspace,
                                   size_t workspace_bytes, uint16_t* out, cudaStream_t stream) {
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
  const dim3 grid(unsigned(p.splits), unsigned(s.n_kv_heads), unsigned(num_seqs));
  if (s.head_dim == 64)
    split_kernel<64><<<grid, kThreads, 0, stream>>>(a);
  else
    split_kernel<128><<<grid, kThreads, 0, stream>>>(a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  merge_kernel<<<unsigned(num_seqs * s.n_heads), 128, 0, stream>>>(a.part_acc, a.part_ml, p.splits,
                                                                   s.head_dim, out);
  return cudaGetLastError();
}

}  // namespace tetra::model::cuda
