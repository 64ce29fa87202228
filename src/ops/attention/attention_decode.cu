// Paged decode attention. Grid (sequence, kv head, split): a block takes one kv head's group of
// query heads over up to kDecodeSplitTokens cached tokens, reading each k/v row once for the
// whole group. Three phases over shared memory:
//   1. scores[g][j] = scale * q_g . k_j   (a warp per token, D/32 dims per lane, warp reduce)
//   2. per head: max, p = exp(s - max), sum  (a warp per head)
//   3. acc[g][:] += p[g][j] * v_j          (a warp per token, summed across warps at the end)
// With one split the block writes bf16 out; otherwise it writes its normalised partial output
// with (max, sum), and merge_kernel combines the splits: out = sum_s w_s o_s / sum_s w_s,
// w_s = exp(m_s - M) l_s. Plain FMA code (no tensor cores): decode reads each k/v byte once.
#include <cuda_bf16.h>

#include "core/error.h"
#include "ops/attention/attention_cuda.h"

namespace tetra::ops::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kSplit = kDecodeSplitTokens;

struct DecodeArgs {
  const __nv_bfloat16* q;        // [S, Hq, D] with q_step
  const __nv_bfloat16* k_cache;  // [num_blocks, block_size, Hk, D]
  const __nv_bfloat16* v_cache;
  const int32_t* block_tables;   // [S, max_blocks]
  const int32_t* seq_lens;       // [S]
  int max_blocks, block_size, n_heads, n_kv_heads, group, num_splits;
  int64_t q_step;
  float scale;
  __nv_bfloat16* out;    // [S, Hq, D]           (one split)
  float* part_out;       // [S, Hq, splits, D]   (several splits)
  float* part_ml;        // [S, Hq, splits, 2]   (max, sum)
};

// kPer consecutive bf16 of a row -> float.
template <int kPer>
__device__ __forceinline__ void load_row(const __nv_bfloat16* p, float* f) {
#pragma unroll
  for (int i = 0; i < kPer; i += 2) {
    const float2 two = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p + i));
    f[i] = two.x;
    f[i + 1] = two.y;
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off >= 1; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off >= 1; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

template <int D, int G>
__global__ void __launch_bounds__(kWarps * 32) decode_kernel(DecodeArgs a) {
  constexpr int kPer = D / 32;  // dims per lane
  extern __shared__ float smem[];  // [max(G * kSplit, kWarps * G * D)] scores, then partial sums
  __shared__ float head_max[G], head_sum[G];
  const int s = blockIdx.x, kh = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = a.group;
  const int len = a.seq_lens[s];
  const int begin = split * kSplit;
  const int n = max(0, min(len - begin, kSplit));  // tokens of this split
  const int32_t* table = a.block_tables + int64_t(s) * a.max_blocks;
  const int64_t row_elems = int64_t(a.n_kv_heads) * D;
  auto row_of = [&](int j) {  // offset of token j's kv-head row in a cache
    const int64_t slot = int64_t(table[j / a.block_size]) * a.block_size + j % a.block_size;
    return slot * row_elems + int64_t(kh) * D + lane * kPer;
  };

  float qr[G][kPer];  // the group's queries, this lane's dims
#pragma unroll
  for (int i = 0; i < G; ++i) {
    if (i < g) load_row<kPer>(a.q + s * a.q_step + int64_t(kh * g + i) * D + lane * kPer, qr[i]);
  }
  // 1. scores
  for (int j = warp; j < n; j += kWarps) {
    float kf[kPer];
    load_row<kPer>(a.k_cache + row_of(begin + j), kf);
#pragma unroll
    for (int i = 0; i < G; ++i) {
      if (i >= g) break;
      float dot = 0.0f;
#pragma unroll
      for (int d = 0; d < kPer; ++d) dot += qr[i][d] * kf[d];
      dot = warp_sum(dot);
      if (lane == 0) smem[i * kSplit + j] = dot * a.scale;
    }
  }
  __syncthreads();
  // 2. softmax statistics per head
  for (int i = warp; i < g; i += kWarps) {
    float m = -INFINITY;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, smem[i * kSplit + j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float p = expf(smem[i * kSplit + j] - m);
      smem[i * kSplit + j] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) head_max[i] = m, head_sum[i] = l;
  }
  __syncthreads();
  // 3. weighted values
  float acc[G][kPer];
#pragma unroll
  for (int i = 0; i < G; ++i)
#pragma unroll
    for (int d = 0; d < kPer; ++d) acc[i][d] = 0.0f;
  for (int j = warp; j < n; j += kWarps) {
    float vf[kPer];
    load_row<kPer>(a.v_cache + row_of(begin + j), vf);
#pragma unroll
    for (int i = 0; i < G; ++i) {
      if (i >= g) break;
      const float p = smem[i * kSplit + j];
#pragma unroll
      for (int d = 0; d < kPer; ++d) acc[i][d] += p * vf[d];
    }
  }
  __syncthreads();  // every warp is done with the scores: reuse smem for the partial sums
#pragma unroll
  for (int i = 0; i < G; ++i) {
    if (i >= g) break;
#pragma unroll
    for (int d = 0; d < kPer; ++d) smem[(warp * G + i) * D + lane * kPer + d] = acc[i][d];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < g * D; idx += kWarps * 32) {
    const int i = idx / D, d = idx % D;
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) o += smem[(w * G + i) * D + d];
    const float l = head_sum[i];
    o = l > 0.0f ? o / l : 0.0f;
    const int h = kh * g + i;
    if (a.num_splits == 1) {
      a.out[(int64_t(s) * a.n_heads + h) * D + d] = __float2bfloat16_rn(o);
    } else {
      const int64_t part = (int64_t(s) * a.n_heads + h) * a.num_splits + split;
      a.part_out[part * D + d] = o;
      if (d == 0) {
        a.part_ml[part * 2] = head_max[i];
        a.part_ml[part * 2 + 1] = l;
      }
    }
  }
}

// One block per (sequence, head), one thread per dim.
__global__ void merge_kernel(const float* __restrict__ part_out, const float* __restrict__ part_ml,
                             int num_splits, int n_heads, int D, __nv_bfloat16* __restrict__ out) {
  const int64_t sh = int64_t(blockIdx.x) * n_heads + blockIdx.y;
  const float* ml = part_ml + sh * num_splits * 2;
  float M = -INFINITY;
  for (int p = 0; p < num_splits; ++p)
    if (ml[2 * p + 1] > 0.0f) M = fmaxf(M, ml[2 * p]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    for (int p = 0; p < num_splits; ++p) {
      const float l = ml[2 * p + 1];
      if (l <= 0.0f) continue;
      const float w = expf(ml[2 * p] - M) * l;
      num += w * part_out[(sh * num_splits + p) * D + d];
      den += w;
    }
    out[sh * D + d] = __float2bfloat16_rn(den > 0.0f ? num / den : 0.0f);
  }
}

int splits_for(const PagedKv& kv) {
  const int64_t max_tokens = int64_t(kv.max_blocks_per_seq) * kv.block_size;
  return int(std::max<int64_t>(1, (max_tokens + kSplit - 1) / kSplit));
}

template <int D, int G>
cudaError_t launch(const DecodeArgs& a, int num_seqs, cudaStream_t stream) {
  const size_t smem = sizeof(float) * std::max(G * kSplit, kWarps * G * D);
  auto kernel = decode_kernel<D, G>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(num_seqs, a.n_kv_heads, a.num_splits);
  kernel<<<grid, kWarps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_group(const DecodeArgs& a, int num_seqs, cudaStream_t stream) {
  if (a.group <= 1) return launch<D, 1>(a, num_seqs, stream);
  if (a.group <= 2) return launch<D, 2>(a, num_seqs, stream);
  if (a.group <= 4) return launch<D, 4>(a, num_seqs, stream);
  if (a.group <= 8) return launch<D, 8>(a, num_seqs, stream);
  return launch<D, 16>(a, num_seqs, stream);
}

}  // namespace

size_t paged_decode_workspace_bytes(int num_seqs, const AttentionShape& s, const PagedKv& kv) {
  const int splits = splits_for(kv);
  if (splits == 1) return 0;
  return size_t(num_seqs) * s.n_heads * splits * (size_t(s.head_dim) + 2) * sizeof(float);
}

cudaError_t paged_decode_attention(const uint16_t* q, const PagedKv& kv, int num_seqs,
                                   const AttentionShape& s, void* workspace,
                                   size_t workspace_bytes, uint16_t* out, cudaStream_t stream) {
  check_attention_shape(s);
  TETRA_CHECK(attention_head_dim_supported(s.head_dim), "paged decode: head_dim ", s.head_dim,
              " unsupported (64 or 128)");
  const int group = s.n_heads / s.n_kv_heads;
  TETRA_CHECK(group <= kDecodeMaxGroup, "paged decode: GQA ratio ", group, " unsupported (at most 16)");
  TETRA_CHECK(kv.block_size > 0 && kv.num_blocks > 0 && kv.max_blocks_per_seq > 0,
              "paged decode: block_size ", kv.block_size, " num_blocks ", kv.num_blocks,
              " max_blocks_per_seq ", kv.max_blocks_per_seq);
  TETRA_CHECK(s.q_step() % 2 == 0, "paged decode: q stride must be even");
  TETRA_CHECK(num_seqs >= 0, "paged decode: num_seqs ", num_seqs);
  const size_t need = paged_decode_workspace_bytes(num_seqs, s, kv);
  TETRA_CHECK(workspace_bytes >= need && (need == 0 || workspace != nullptr),
              "paged decode: workspace ", workspace_bytes, " bytes, needs ", need);
  if (num_seqs == 0) return cudaSuccess;
  DecodeArgs a{};
  a.q = reinterpret_cast<const __nv_bfloat16*>(q);
  a.k_cache = reinterpret_cast<const __nv_bfloat16*>(kv.k_cache);
  a.v_cache = reinterpret_cast<const __nv_bfloat16*>(kv.v_cache);
  a.block_tables = kv.block_tables;
  a.seq_lens = kv.seq_lens;
  a.max_blocks = kv.max_blocks_per_seq;
  a.block_size = kv.block_size;
  a.n_heads = s.n_heads;
  a.n_kv_heads = s.n_kv_heads;
  a.group = group;
  a.num_splits = splits_for(kv);
  a.q_step = s.q_step();
  a.scale = s.scale;
  a.out = reinterpret_cast<__nv_bfloat16*>(out);
  a.part_out = static_cast<float*>(workspace);
  a.part_ml = a.num_splits > 1
                  ? a.part_out + size_t(num_seqs) * s.n_heads * a.num_splits * s.head_dim
                  : nullptr;
  cudaError_t err = s.head_dim == 64 ? launch_group<64>(a, num_seqs, stream)
                                     : launch_group<128>(a, num_seqs, stream);
  if (err != cudaSuccess || a.num_splits == 1) return err;
  merge_kernel<<<dim3(num_seqs, s.n_heads), 128, 0, stream>>>(a.part_out, a.part_ml, a.num_splits,
                                                              s.n_heads, s.head_dim, a.out);
  return cudaGetLastError();
}

}  // namespace tetra::ops::cuda
