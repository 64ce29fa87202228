// CUDA twins of the absorbed MLA ops (ops/attention/mla.h, mla_cuda.h). Float math on bf16
// inputs, one bf16 rounding per output, like the CPU reference; the sums run in other orders.
//   mla_cache_write: a block per token: block-reduced RMSNorm of the latent, RoPE of k_pe.
//   mla_absorb_q:    a block per (8 tokens, 128 latent columns, head): each W_uk row read from
//                    memory serves the 8 tokens; the block holding columns 0.. also rotates q_pe.
//   mla_attention:   a block per (token, head) (a token's heads adjacent: its keys stay in L2),
//                    8 warps taking interleaved groups of 4 keys (16 warps of 2 when there are
//                    few blocks) with an online softmax (base 2); lanes own fixed 8-dim chunks
//                    of the row (2-dim where rows are not 16-byte aligned), so a key's latent
//                    sits in the registers that scored it; the warps' (max, sum, latent sum)
//                    merge in shared memory at the end.
//   mla_up_v:        a block per (8 tokens, 16 W_uv rows, head), a warp per 4 rows, lanes over
//                    the latent in 16-byte chunks, the token tile's latents in shared memory.
// No allocation, no synchronisation, grids from T and the shape only: graph capturable.
#include <cuda_bf16.h>

#include <cstdint>

#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/attention/mla_cuda.h"
#include "ops/rope/rope_turn.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kMaxRow = 1024;   // Dl + Dr: bounds the attention kernel's registers per lane
constexpr int kMaxNope = 1024;  // the absorb kernel's q tile lives in shared memory

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The shapes every kernel here takes (mla_unsupported_reason), refused with the op's name.
void check_cuda_shape(const MlaShape& s, const char* op) {
  check_mla_shape(s);
  const std::string why = mla_unsupported_reason(s);
  TETRA_CHECK(why.empty(), op, " (cuda): ", why);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// bf16 pair packed in a uint32 -> its two floats (exact: bf16 is a float's top half).
__device__ __forceinline__ float lo_f(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_f(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Rotary pair i of x [Dr] (bf16) at position pos, written to dst [Dr]; the CPU's rounding steps.
__device__ __forceinline__ void rope_pair(const __nv_bfloat16* x, __nv_bfloat16* dst, int i,
                                          int half, bool neox, float pos, const float* inv_freq) {
  float sn, c;
  sincosf(__fmul_rn(pos, inv_freq[i]), &sn, &c);
  int ia, ib;
  rope_pair_dims(i, half, neox, ia, ib);
  rope_turn(__bfloat162float(x[ia]), __bfloat162float(x[ib]), sn, c, dst[ia], dst[ib]);
}

// ---- mla_cache_write ----------------------------------------------------------------------

constexpr int kWriteThreads = 128;

struct WriteArgs {
  const __nv_bfloat16* kv_a;    // [T, Dl + Dr]
  const __nv_bfloat16* norm_w;  // [Dl]
  const int32_t* positions;     // [T]
  const int64_t* slots;         // [T]
  const float* inv_freq;        // [Dr / 2]
  float eps;
  int Dl, Dr;
  bool neox;
  __nv_bfloat16* cache;  // [num_slots, Dl + Dr]
};

__global__ void __launch_bounds__(kWriteThreads) cache_write_kernel(WriteArgs a) {
  const int t = blockIdx.x;
  const int64_t slot = a.slots[t];
  if (slot < 0) return;  // the whole block leaves before its barrier
  const int row = a.Dl + a.Dr;
  const __nv_bfloat16* x = a.kv_a + int64_t(t) * row;
  __nv_bfloat16* dst = a.cache + slot * row;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < a.Dl; c += kWriteThreads) {
    const float v = __bfloat162float(x[c]);
    ss += v * v;
  }
  __shared__ float part[kWriteThreads / 32];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWriteThreads / 32; ++w) total += part[w];
  const float inv_rms = 1.0f / sqrtf(total / float(a.Dl) + a.eps);
  for (int c = threadIdx.x; c < a.Dl; c += kWriteThreads)  // (x * inv_rms) * w as on the CPU
    dst[c] = __float2bfloat16_rn(
        __fmul_rn(__fmul_rn(__bfloat162float(x[c]), inv_rms), __bfloat162float(a.norm_w[c])));
  const float pos = float(a.positions[t]);
  for (int i = threadIdx.x; i < a.Dr / 2; i += kWriteThreads)
    rope_pair(x + a.Dl, dst + a.Dl, i, a.Dr / 2, a.neox, pos, a.inv_freq);
}

// ---- mla_absorb_q -------------------------------------------------------------------------

constexpr int kAbsorbTok = 8;       // tokens per block: every W_uk element loaded serves 8
constexpr int kAbsorbThreads = 64;  // a latent column pair each: 128 columns per block
constexpr int kAbsorbCols = 2 * kAbsorbThreads;

struct AbsorbArgs {
  const __nv_bfloat16* q;     // [T, H, nope + Dr]
  const __nv_bfloat16* kv_b;  // [H * (nope + v), Dl]
  const int32_t* positions;   // [T]
  const float* inv_freq;      // [Dr / 2]
  int T, H, Dl, Dr, nope, v;
  bool neox;
  __nv_bfloat16* q_abs;  // [T, H, Dl + Dr]
};

__global__ void __launch_bounds__(kAbsorbThreads) absorb_q_kernel(AbsorbArgs a) {
  // [nope, kAbsorbTok] the tile's q_nope as float, 0 past T; token-minor so that one row n's
  // 8 token values are two broadcast 16-byte reads.
  extern __shared__ float4 q_s4[];
  float* q_s = reinterpret_cast<float*>(q_s4);
  static_assert(kAbsorbTok == 8, "two float4 per row of q_s");
  const int t0 = blockIdx.x * kAbsorbTok, h = blockIdx.z;
  const int n_tok = min(kAbsorbTok, a.T - t0);
  const int q_head = a.nope + a.Dr, row = a.Dl + a.Dr;
  for (int i = threadIdx.x; i < kAbsorbTok * a.nope; i += kAbsorbThreads) {
    const int tok = i / a.nope, n = i % a.nope;  // q reads coalesced along n
    q_s[n * kAbsorbTok + tok] =
        tok < n_tok ? __bfloat162float(a.q[(int64_t(t0 + tok) * a.H + h) * q_head + n]) : 0.0f;
  }
  __syncthreads();
  const int c = blockIdx.y * kAbsorbCols + 2 * threadIdx.x;
  if (c < a.Dl) {
    float acc[kAbsorbTok][2] = {};
    // W_uk[h] [nope, Dl] column pair c: stride Dl / 2 pairs per row n.
    const __nv_bfloat162* w = reinterpret_cast<const __nv_bfloat162*>(
        a.kv_b + int64_t(h) * (a.nope + a.v) * a.Dl + c);
    const int stride = a.Dl / 2;
#pragma unroll 8
    for (int n = 0; n < a.nope; ++n) {
      const float2 wf = __bfloat1622float2(w[int64_t(n) * stride]);
      const float4 qa = q_s4[2 * n], qb = q_s4[2 * n + 1];
      const float qn[kAbsorbTok] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
      for (int tok = 0; tok < kAbsorbTok; ++tok) {
        acc[tok][0] += qn[tok] * wf.x;
        acc[tok][1] += qn[tok] * wf.y;
      }
    }
#pragma unroll
    for (int tok = 0; tok < kAbsorbTok; ++tok)
      if (tok < n_tok)
        *reinterpret_cast<__nv_bfloat162*>(a.q_abs + (int64_t(t0 + tok) * a.H + h) * row + c) =
            __floats2bfloat162_rn(acc[tok][0], acc[tok][1]);
  }
  if (blockIdx.y == 0) {  // q_pe -> q_abs[.., Dl:], rotated
    const int half = a.Dr / 2;
    for (int i = threadIdx.x; i < n_tok * half; i += kAbsorbThreads) {
      const int t = t0 + i / half;
      const int64_t th = int64_t(t) * a.H + h;
      rope_pair(a.q + th * q_head + a.nope, a.q_abs + th * row + a.Dl, i % half, half, a.neox,
                float(a.positions[t]), a.inv_freq);
    }
  }
}

// ---- mla_attention ------------------------------------------------------------------------

struct AttnArgs {
  const __nv_bfloat16* q_abs;  // [T, H, row]
  const __nv_bfloat16* cache;  // [num_slots, row]
  const int32_t* cu_seqlens;   // [S + 1]
  const int32_t* positions;    // [T]
  MlaKeys keys;
  int S, H, Dl, row;
  float scale_log2;        // scale * log2(e): the softmax runs in base 2
  __nv_bfloat16* out_lat;  // [T, H, Dl]
};

// N bf16 at p (N = 8: one 16-byte load; N = 2: one 4-byte load) as N / 2 packed pairs.
template <int N>
__device__ __forceinline__ void load_chunk(const __nv_bfloat16* p, uint32_t (&w)[N / 2]) {
  if constexpr (N == 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
}

// Cache slot of key j of sequence b (whose first token is `first`); -1 past the n keys.
__device__ __forceinline__ int64_t key_slot(const MlaKeys& k, int b, int first, int j, int n) {
  if (j >= n) return -1;
  if (k.step_slots) return k.step_slots[first + j];
  const int32_t blk = k.block_tables[int64_t(b) * k.max_blocks_per_seq + j / k.block_size];
  return int64_t(blk) * k.block_size + j % k.block_size;
}

// N: bf16 per chunk (8, or 2 where rows are not 16-byte aligned); K: chunks per lane
// (ceil(row / N / 32)); W: warps per block; P: keys a warp scores per step (P row loads in
// flight, P shuffle reductions interleaved). Lane owns chunks lane, lane + 32, ...
template <int N, int K, int W, int P>
__global__ void __launch_bounds__(W * 32) attention_kernel(AttnArgs a) {
  extern __shared__ float red[];  // [W, Dl] each warp's latent sum, then m [W], l [W], f [W]
  float* m_s = red + W * a.Dl;
  float* l_s = m_s + W;
  float* f_s = l_s + W;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x / a.H;  // blockIdx.x = t * H + h: a token's heads share keys in L2
  int lo = 0, hi = a.S - 1;  // token t's sequence: the last b with cu_seqlens[b] <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.cu_seqlens[mid] <= t) lo = mid; else hi = mid - 1;
  }
  const int b = lo, first = a.cu_seqlens[b];
  const int n = a.positions[t] + 1;  // keys 0 .. positions[t]
  const int n_chunks = a.row / N;

  uint32_t q[K][N / 2];  // this lane's chunks of the query row, packed bf16
  const __nv_bfloat16* qr = a.q_abs + int64_t(blockIdx.x) * a.row;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int ch = lane + 32 * k;
    if (ch < n_chunks) {
      load_chunk<N>(qr + ch * N, q[k]);
    } else {
#pragma unroll
      for (int e = 0; e < N / 2; ++e) q[k][e] = 0u;
    }
  }
  float acc[K][N] = {};  // unnormalised latent sum (chunks past Dl are never stored)
  float m = -INFINITY, l = 0.0f;

  constexpr int kStep = W * P;
  int64_t slot[P];
#pragma unroll
  for (int i = 0; i < P; ++i)
    slot[i] = key_slot(a.keys, b, first, warp * P + i, n);
  for (int j0 = warp * P; j0 < n; j0 += kStep) {
    uint32_t kv[P][K][N / 2];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const __nv_bfloat16* kr = a.cache + (slot[i] < 0 ? 0 : slot[i]) * a.row;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int ch = lane + 32 * k;
        if (slot[i] >= 0 && ch < n_chunks) {
          load_chunk<N>(kr + ch * N, kv[i][k]);
        } else {
#pragma unroll
          for (int e = 0; e < N / 2; ++e) kv[i][k][e] = 0u;
        }
      }
    }
    // The next step's slots now, so a block-table read overlaps this step's math.
#pragma unroll
    for (int i = 0; i < P; ++i) slot[i] = key_slot(a.keys, b, first, j0 + kStep + i, n);

    float s[P];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      s[i] = 0.0f;
#pragma unroll
      for (int k = 0; k < K; ++k)
#pragma unroll
        for (int e = 0; e < N / 2; ++e)
          s[i] += lo_f(q[k][e]) * lo_f(kv[i][k][e]) + hi_f(q[k][e]) * hi_f(kv[i][k][e]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int i = 0; i < P; ++i) s[i] += __shfl_xor_sync(0xffffffffu, s[i], o);
    float m_new = m;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      s[i] = j0 + i < n ? s[i] * a.scale_log2 : -INFINITY;
      m_new = fmaxf(m_new, s[i]);  // finite: key j0 < n
    }
    const float corr = exp2f(m - m_new);  // 0 on the first step (m = -inf)
    float p[P];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      p[i] = exp2f(s[i] - m_new);
      l = i == 0 ? l * corr + p[i] : l + p[i];
    }
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int e = 0; e < N / 2; ++e) {
        float x = acc[k][2 * e] * corr, y = acc[k][2 * e + 1] * corr;
#pragma unroll
        for (int i = 0; i < P; ++i) {
          x += p[i] * lo_f(kv[i][k][e]);
          y += p[i] * hi_f(kv[i][k][e]);
        }
        acc[k][2 * e] = x;
        acc[k][2 * e + 1] = y;
      }
    m = m_new;
  }

  // Merge the warps: out = sum_w acc_w 2^(m_w - M) / sum_w l_w 2^(m_w - M), M = max_w m_w
  // (finite: warp 0 has key 0; a warp without keys has m = -inf and weighs 0).
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int ch = lane + 32 * k;
    if (ch * N < a.Dl) {
      float* r = red + warp * a.Dl + ch * N;
#pragma unroll
      for (int e = 0; e < N; ++e) r[e] = acc[k][e];
    }
  }
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
  __syncthreads();
  if (threadIdx.x < W) {
    float M = -INFINITY, L = 0.0f;
    for (int w = 0; w < W; ++w) M = fmaxf(M, m_s[w]);
    for (int w = 0; w < W; ++w) L += l_s[w] * exp2f(m_s[w] - M);
    f_s[threadIdx.x] = exp2f(m_s[threadIdx.x] - M) / L;
  }
  __syncthreads();
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(a.out_lat + int64_t(blockIdx.x) * a.Dl);
  for (int c2 = threadIdx.x; c2 < a.Dl / 2; c2 += W * 32) {
    float x = 0.0f, y = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      x += red[w * a.Dl + 2 * c2] * f_s[w];
      y += red[w * a.Dl + 2 * c2 + 1] * f_s[w];
    }
    out[c2] = __floats2bfloat162_rn(x, y);
  }
}

template <int N, int K, int W, int P>
cudaError_t launch_attention(const AttnArgs& a, unsigned blocks, cudaStream_t stream) {
  const size_t smem = (size_t(W) * a.Dl + 3 * W) * sizeof(float);
  attention_kernel<N, K, W, P><<<blocks, W * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

// ---- mla_up_v -----------------------------------------------------------------------------

constexpr int kUpTok = 8;       // tokens per block: every W_uv element loaded serves 8
constexpr int kUpWarps = 4;
constexpr int kUpRowsPerWarp = 4;  // W_uv rows a warp walks together (4 loads in flight)
constexpr int kUpRows = kUpWarps * kUpRowsPerWarp;

struct UpArgs {
  const __nv_bfloat16* out_lat;  // [T, H, Dl]
  const __nv_bfloat16* kv_b;     // [H * (nope + v), Dl]
  int T, H, Dl, nope, v;
  __nv_bfloat16* out;  // [T, H, v]
};

__global__ void __launch_bounds__(kUpWarps * 32) up_v_kernel(UpArgs a) {
  extern __shared__ uint4 lat_s[];  // [kUpTok, Dl / 8] the tile's latents as bf16, 0 past T
  const int t0 = blockIdx.x * kUpTok, h = blockIdx.z;
  const int n_tok = min(kUpTok, a.T - t0);
  const int c8n = a.Dl / 8;
  for (int i = threadIdx.x; i < kUpTok * c8n; i += kUpWarps * 32) {
    const int tok = i / c8n;
    lat_s[i] = tok < n_tok ? *reinterpret_cast<const uint4*>(
                                 a.out_lat + (int64_t(t0 + tok) * a.H + h) * a.Dl + (i % c8n) * 8)
                           : make_uint4(0u, 0u, 0u, 0u);
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j0 = blockIdx.y * kUpRows + warp * kUpRowsPerWarp;  // this warp's first row of W_uv[h]
  if (j0 >= a.v) return;  // after the only barrier
  const __nv_bfloat16* w = a.kv_b + (int64_t(h) * (a.nope + a.v) + a.nope + j0) * a.Dl;
  float acc[kUpRowsPerWarp][kUpTok] = {};
  for (int c8 = lane; c8 < c8n; c8 += 32) {
    uint32_t wr[kUpRowsPerWarp][4];
#pragma unroll
    for (int r = 0; r < kUpRowsPerWarp; ++r) {
      const uint4 raw = j0 + r < a.v ? *reinterpret_cast<const uint4*>(w + int64_t(r) * a.Dl + c8 * 8)
                                     : make_uint4(0u, 0u, 0u, 0u);
      wr[r][0] = raw.x;
      wr[r][1] = raw.y;
      wr[r][2] = raw.z;
      wr[r][3] = raw.w;
    }
#pragma unroll
    for (int tok = 0; tok < kUpTok; ++tok) {
      const uint4 raw = lat_s[tok * c8n + c8];
      const uint32_t x[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int r = 0; r < kUpRowsPerWarp; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          acc[r][tok] += lo_f(x[e]) * lo_f(wr[r][e]) + hi_f(x[e]) * hi_f(wr[r][e]);
    }
  }
#pragma unroll
  for (int r = 0; r < kUpRowsPerWarp; ++r)
#pragma unroll
    for (int tok = 0; tok < kUpTok; ++tok) {
      const float sum = warp_sum(acc[r][tok]);
      // Lane r * kUpTok + tok writes (tok, row r): 32 lanes, 32 outputs.
      if (lane == r * kUpTok + tok && j0 + r < a.v && tok < n_tok)
        a.out[(int64_t(t0 + tok) * a.H + h) * a.v + j0 + r] = __float2bfloat16_rn(sum);
    }
}
static_assert(kUpRowsPerWarp * kUpTok == 32, "one output per lane");

}  // namespace

std::string mla_unsupported_reason(const MlaShape& s) {
  // Chunks of 8 (16 bytes) never straddle the latent's end; the attention kernel's registers
  // per lane bound the row; the absorb kernel's q tile lives in shared memory; heads index a
  // grid dimension.
  if (s.kv_lora % 16 != 0)
    return str("kv_lora_rank ", s.kv_lora, " (the CUDA MLA kernels take a multiple of 16)");
  if (s.row() > kMaxRow)
    return str("kv_lora_rank + qk_rope_head_dim = ", s.row(), " (the CUDA MLA kernels take up to ",
               kMaxRow, ")");
  if (s.nope_dim > kMaxNope)
    return str("qk_nope_head_dim ", s.nope_dim, " (the CUDA MLA kernels take up to ", kMaxNope, ")");
  if (s.n_heads > 65535)
    return str(s.n_heads, " heads (the CUDA MLA kernels take up to 65535)");
  return "";
}

cudaError_t mla_cache_write(const uint16_t* kv_a, const uint16_t* norm_w, float eps,
                            const int32_t* positions, const int64_t* slots, int T,
                            const float* inv_freq, const MlaShape& s, int64_t num_slots,
                            uint16_t* cache, cudaStream_t stream) {
  check_cuda_shape(s, "mla cache write");
  TETRA_CHECK(T >= 0 && eps > 0 && num_slots >= 0, "mla cache write (cuda): T ", T, " eps ", eps,
              " num_slots ", num_slots);
  if (T == 0) return cudaSuccess;
  WriteArgs a;
  a.kv_a = reinterpret_cast<const __nv_bfloat16*>(kv_a);
  a.norm_w = reinterpret_cast<const __nv_bfloat16*>(norm_w);
  a.positions = positions;
  a.slots = slots;
  a.inv_freq = inv_freq;
  a.eps = eps;
  a.Dl = s.kv_lora;
  a.Dr = s.rope_dim;
  a.neox = s.style == RopeStyle::NeoX;
  a.cache = reinterpret_cast<__nv_bfloat16*>(cache);
  cache_write_kernel<<<unsigned(T), kWriteThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t mla_absorb_q(const uint16_t* q, const uint16_t* kv_b, const int32_t* positions, int T,
                         const float* inv_freq, const MlaShape& s, uint16_t* q_abs,
                         cudaStream_t stream) {
  check_cuda_shape(s, "mla absorb q");
  TETRA_CHECK(T >= 0, "mla absorb q (cuda): T ", T);
  TETRA_CHECK(aligned(kv_b, 4) && aligned(q_abs, 4),
              "mla absorb q (cuda): kv_b and q_abs must be 4-byte aligned");
  if (T == 0) return cudaSuccess;
  AbsorbArgs a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(q);
  a.kv_b = reinterpret_cast<const __nv_bfloat16*>(kv_b);
  a.positions = positions;
  a.inv_freq = inv_freq;
  a.T = T;
  a.H = s.n_heads;
  a.Dl = s.kv_lora;
  a.Dr = s.rope_dim;
  a.nope = s.nope_dim;
  a.v = s.v_dim;
  a.neox = s.style == RopeStyle::NeoX;
  a.q_abs = reinterpret_cast<__nv_bfloat16*>(q_abs);
  const dim3 grid(unsigned((T + kAbsorbTok - 1) / kAbsorbTok),
                  unsigned((s.kv_lora + kAbsorbCols - 1) / kAbsorbCols), unsigned(s.n_heads));
  const size_t smem = size_t(kAbsorbTok) * s.nope_dim * sizeof(float);
  absorb_q_kernel<<<grid, kAbsorbThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t mla_attention(const uint16_t* q_abs, const uint16_t* cache, int64_t num_slots,
                          const int32_t* cu_seqlens, int S, int T, const int32_t* positions,
                          const MlaKeys& keys, const MlaShape& s, uint16_t* out_lat,
                          cudaStream_t stream) {
  (void)num_slots;  // slots are trusted on the device (mla_cuda.h)
  check_cuda_shape(s, "mla attention");
  TETRA_CHECK(T >= 0 && (S >= 1 || T == 0), "mla attention (cuda): ", S, " sequences, ", T,
              " tokens");
  TETRA_CHECK(keys.step_slots != nullptr ||
                  (keys.block_tables != nullptr && keys.block_size > 0 &&
                   keys.max_blocks_per_seq > 0),
              "mla attention (cuda): keys need step slots or block tables");
  TETRA_CHECK(int64_t(T) * s.n_heads < (int64_t(1) << 31), "mla attention (cuda): ", T,
              " tokens x ", s.n_heads, " heads");
  TETRA_CHECK(aligned(q_abs, 4) && aligned(cache, 4) && aligned(out_lat, 4),
              "mla attention (cuda): q_abs, cache and out_lat must be 4-byte aligned");
  if (T == 0) return cudaSuccess;
  AttnArgs a;
  a.q_abs = reinterpret_cast<const __nv_bfloat16*>(q_abs);
  a.cache = reinterpret_cast<const __nv_bfloat16*>(cache);
  a.cu_seqlens = cu_seqlens;
  a.positions = positions;
  a.keys = keys;
  a.S = S;
  a.H = s.n_heads;
  a.Dl = s.kv_lora;
  a.row = s.row();
  a.scale_log2 = s.scale * 1.4426950408889634f;
  a.out_lat = reinterpret_cast<__nv_bfloat16*>(out_lat);
  const unsigned blocks = unsigned(int64_t(T) * s.n_heads);
  // 16-byte chunks where rows and pointers allow (every real model: Dl + Dr = 576).
  if (s.row() % 8 == 0 && aligned(q_abs, 16) && aligned(cache, 16)) {
    const int K = (s.row() / 8 + 31) / 32;
    // Few blocks (decode, T * H < 2 SMs' worth): 16 warps of 2 keys a step instead of 8 of 4,
    // the same loads in flight in chains half as long; the [16, Dl] merge buffer stays within
    // 48 KB and the registers within the 128 a thread that 512 threads allow.
    const bool wide = int64_t(blocks) < 2 * int64_t(current_device_sm_count()) && K <= 3 &&
                      s.kv_lora <= 512;
    switch (K) {
      case 1: return wide ? launch_attention<8, 1, 16, 2>(a, blocks, stream)
                          : launch_attention<8, 1, 8, 4>(a, blocks, stream);
      case 2: return wide ? launch_attention<8, 2, 16, 2>(a, blocks, stream)
                          : launch_attention<8, 2, 8, 4>(a, blocks, stream);
      case 3: return wide ? launch_attention<8, 3, 16, 2>(a, blocks, stream)
                          : launch_attention<8, 3, 8, 4>(a, blocks, stream);
      default: return launch_attention<8, 4, 8, 4>(a, blocks, stream);
    }
  }
  return launch_attention<2, kMaxRow / 2 / 32, 8, 4>(a, blocks, stream);  // 4-byte chunks
}

cudaError_t mla_up_v(const uint16_t* out_lat, const uint16_t* kv_b, int T, const MlaShape& s,
                     uint16_t* out, cudaStream_t stream) {
  check_cuda_shape(s, "mla up v");
  TETRA_CHECK(T >= 0, "mla up v (cuda): T ", T);
  TETRA_CHECK(aligned(out_lat, 16) && aligned(kv_b, 16),
              "mla up v (cuda): out_lat and kv_b must be 16-byte aligned");
  if (T == 0) return cudaSuccess;
  UpArgs a;
  a.out_lat = reinterpret_cast<const __nv_bfloat16*>(out_lat);
  a.kv_b = reinterpret_cast<const __nv_bfloat16*>(kv_b);
  a.T = T;
  a.H = s.n_heads;
  a.Dl = s.kv_lora;
  a.nope = s.nope_dim;
  a.v = s.v_dim;
  a.out = reinterpret_cast<__nv_bfloat16*>(out);
  const dim3 grid(unsigned((T + kUpTok - 1) / kUpTok), unsigned((s.v_dim + kUpRows - 1) / kUpRows),
                  unsigned(s.n_heads));
  const size_t smem = size_t(kUpTok) * s.kv_lora * sizeof(uint16_t);
  up_v_kernel<<<grid, kUpWarps * 32, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace tetra::ops::cuda
