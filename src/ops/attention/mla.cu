// CUDA twins of the absorbed MLA ops (ops/attention/mla.h, mla_cuda.h). Float math on bf16
// inputs, one bf16 rounding per output, like the CPU reference; the sums run in other orders
// (tensor-core sums accumulate in f32 too). Every kernel is deterministic: no atomics, fixed
// reduction orders, so a launch gives the same bits every run.
//   mla_cache_write: a block per token: block-reduced RMSNorm of the latent, RoPE of k_pe.
//   mla_absorb_q:    T <= 64 (decode): a tensor-core GEMV read straight from registers. A block
//                    per (32-token group, 64 latent columns, head); its 4 warps split the nope
//                    rows, load W_uk in 16-byte row pieces and feed them to mma.sync as A
//                    fragments (a permuted k order makes two rows' pieces one fragment), q_nope
//                    from shared memory as B; the warps' sums add in shared memory in a fixed
//                    order. Each W_uk byte is read once per 32 tokens; grids of H * Dl / 64 blocks
//                    keep every SM's loads in flight. The blocks of the first column tile rotate
//                    q_pe. T > 64 (prefill; not while the stream is captured): cuBLAS
//                    strided-batched GEMM over heads (mla_gemm.h) and a small RoPE kernel.
//   mla_attention:   a block per (token, head) (a token's heads adjacent: its keys stay in L2),
//                    8 warps taking interleaved groups of 4 keys (16 warps of 2 when there are
//                    few blocks) with an online softmax (base 2); lanes own fixed 8-dim chunks
//                    of the row (2-dim where rows are not 16-byte aligned), so a key's latent
//                    sits in the registers that scored it; the warps' (max, sum, latent sum)
//                    merge in shared memory at the end.
//   mla_up_v:        T <= 64: the same register-fed tensor-core GEMV as absorb: a block per
//                    (32-token group, 32 W_uv rows, head), 4 warps splitting the latent; W_uv
//                    rows are k-contiguous, so their 16-byte pieces are A fragments as loaded.
//                    T > 64 (not captured): cuBLAS (mla_gemm.h).
// No allocation, no synchronisation, grids from T, the shape and the SM count only: graph
// capturable (a captured launch never reaches cuBLAS).
#include <cuda_bf16.h>

#include <cstdint>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/kernel_smem_attr.h"
#include "ops/attention/mla_cuda.h"
#include "ops/attention/mla_gemm.h"
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

// Two bf16 as one uint32: `lo` in bits 0-15 (the lower k / column index of an mma fragment pair).
__device__ __forceinline__ uint32_t pack_lo_halves(uint32_t a, uint32_t b) {
  return (a & 0xffffu) | (b << 16);  // a's low bf16, b's low bf16
}
__device__ __forceinline__ uint32_t pack_hi_halves(uint32_t a, uint32_t b) {
  return (a >> 16) | (b & 0xffff0000u);  // a's high bf16, b's high bf16
}

// Word i (0..3) of a 16-byte piece: bf16 elements 2i (low half) and 2i + 1 (high half).
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ uint4 load_16(const __nv_bfloat16* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&p);
}

// Rotary pair i of x [Dr] (bf16) at position pos, written to dst [Dr]; the CPU's rounding steps.
__device__ __forceinline__ void rope_pair(const __nv_bfloat16* x, __nv_bfloat16* dst, int i,
                                          int half, bool neox, float pos, const float* inv_freq) {
  float sn, c;
  sincosf(__fmul_rn(pos, inv_freq[i]), &sn, &c);
  int ia, ib;
  rope_pair_dims(i, half, neox, ia, ib);
  rope_turn(__bfloat162float(x[ia]), __bfloat162float(x[ib]), sn, c, dst[ia], dst[ib]);
}

// ---- tensor-core building block (sm_80+) ----------------------------------------------------
// mma.sync m16n8k16, bf16 in, f32 accumulate. Fragments (g = lane / 4, q = lane % 4; a register
// holds 2 bf16, the lower index in the low half):
//   A [16 x 16]: a0 (row g, k 2q..2q+1), a1 (row g+8, k 2q..), a2 (row g, k 2q+8..), a3 (row g+8, k 2q+8..)
//   B [16 x 8]:  b0 (k 2q..2q+1, col g), b1 (k 2q+8.., col g)
//   C [16 x 8]:  c0, c1 (row g, cols 2q, 2q+1), c2, c3 (row g+8, cols 2q, 2q+1)
// A dot product does not care in which order its k terms come, so a kernel may feed any
// permutation of k to A and B alike; the GEMV kernels below use that to take fragments straight
// from 16-byte global loads.

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
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

constexpr int kGemvMaxTokens = 64;  // T above this (eager): the cuBLAS GEMMs (mla_gemm.h)
constexpr int kGemvWarps = 4;
constexpr int kGemvThreads = kGemvWarps * 32;
constexpr int kAbsorbCols = 64;     // latent columns per absorb block: 8 lanes x 8 columns

struct AbsorbArgs {
  const __nv_bfloat16* q;     // [T, H, nope + Dr]
  const __nv_bfloat16* kv_b;  // [H * (nope + v), Dl]
  const int32_t* positions;   // [T]
  const float* inv_freq;      // [Dr / 2]
  int T, H, Dl, Dr, nope, v;
  int q_stride;  // elements per token row of the shared q tile (absorb_q_stride)
  bool neox;
  __nv_bfloat16* q_abs;  // [T, H, Dl + Dr]
};

// Row stride of the absorb kernel's shared q tile: nope rounded up to whole k-steps (16), then
// to 16 mod 64 elements, so that one B fragment read (8 token rows x 4 lanes x 8 bytes) hits
// distinct banks.
int absorb_q_stride(int nope) {
  const int n16 = (nope + 15) / 16 * 16;
  return (n16 - 16 + 63) / 64 * 64 + 16;
}

template <int NT>
size_t absorb_smem_bytes(int q_stride) {
  return size_t(8 * NT) * q_stride * 2 + size_t(kGemvWarps - 1) * NT * 16 * 32 * sizeof(float);
}

// q_pe of token t, head h -> q_abs[t, h, Dl:], rotated (pair i).
__device__ __forceinline__ void absorb_rope(const AbsorbArgs& a, int t, int h, int i) {
  const int64_t th = int64_t(t) * a.H + h;
  rope_pair(a.q + th * (a.nope + a.Dr) + a.nope, a.q_abs + th * (a.Dl + a.Dr) + a.Dl, i,
            a.Dr / 2, a.neox, float(a.positions[t]), a.inv_freq);
}

// q_abs[t, h, c0 : c0 + 64] for the 8 * NT tokens from t0 = blockIdx.x * 8 NT, c0 = blockIdx.y *
// 64, h = blockIdx.z: out^T [64 columns, tokens] = W_uk[h]^T [64, nope] . q_nope^T [nope, tokens]
// as mma tiles M = 16 columns, N = 8 tokens, K = 16 nope rows. Warp w takes the k-steps (16 rows)
// w, w + 4, ...; lane (g, q) loads rows n0 + 4q .. n0 + 4q + 3, columns c0 + 8g .. + 7 (16 bytes
// each: a warp reads 4 whole 128-byte row pieces per load). Logical k 2q + e is row n0 + 4q + e
// and k 2q + 8 + e is row n0 + 4q + 2 + e (e = 0, 1), so an A register pairs the same column of
// two loaded rows; mma i (0..3) takes the column pair 8g + 2i (row g of the tile) and 8g + 2i + 1
// (row g + 8). The B fragment (the same k order) is q_s[token g][n0 + 4q .. + 3]: one 8-byte
// read. Outputs: lane (g, q) ends with columns 8g .. 8g + 7 of tokens 2q and 2q + 1.
template <int NT>
__global__ void __launch_bounds__(kGemvThreads) absorb_q_mma_kernel(AbsorbArgs a) {
  constexpr int KB = NT <= 2 ? 4 : 2;  // k-steps whose W_uk loads a warp issues together
  extern __shared__ __align__(16) unsigned char absorb_smem[];
  // q_s [8 NT, q_stride]: the tile's q_nope, zero past T and past nope.
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(absorb_smem);
  // red [3, NT * 16, 32]: the accumulators of warps 1..3, which warp 0 adds to its own.
  float* red = reinterpret_cast<float*>(absorb_smem + size_t(8 * NT) * a.q_stride * 2);
  const int t0 = blockIdx.x * 8 * NT, c0 = blockIdx.y * kAbsorbCols, h = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int nks = (a.nope + 15) / 16;
  const bool col_ok = c0 + 8 * g < a.Dl;  // Dl % 16 == 0: a 16-byte piece is all in or all out
  const __nv_bfloat16* w_col = a.kv_b + int64_t(h) * (a.nope + a.v) * a.Dl + c0 + 8 * g;
  uint4 w[KB][4];  // [k-step ks0 + 4 b][row 16 ks + 4q + r]
  const auto load_w = [&](int ks0) {
#pragma unroll
    for (int b = 0; b < KB; ++b) {
      const int ks = ks0 + b * kGemvWarps;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int n = ks * 16 + 4 * q + r;
        w[b][r] = ks < nks && col_ok && n < a.nope ? load_16(w_col + int64_t(n) * a.Dl)
                                                   : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  load_w(warp);  // the first weights are in flight while q is staged

  const int q_head = a.nope + a.Dr;
  for (int i = threadIdx.x; i < 8 * NT * a.q_stride; i += kGemvThreads) {
    const int tok = i / a.q_stride, n = i - tok * a.q_stride, t = t0 + tok;
    q_s[i] = t < a.T && n < a.nope ? a.q[(int64_t(t) * a.H + h) * q_head + n]
                                   : __float2bfloat16_rn(0.0f);
  }
  if (blockIdx.y == 0) {  // q_pe -> q_abs[.., Dl:], rotated
    const int half = a.Dr / 2, n_tok = min(8 * NT, a.T - t0);
    for (int i = threadIdx.x; i < n_tok * half; i += kGemvThreads)
      absorb_rope(a, t0 + i / half, h, i % half);
  }
  __syncthreads();

  float acc[NT][4][4] = {};  // [token tile][mma i][c0..c3]
  for (int ks0 = warp; ks0 < nks; ks0 += kGemvWarps * KB) {
    if (ks0 != warp) load_w(ks0);
#pragma unroll
    for (int b = 0; b < KB; ++b) {
      const int ks = ks0 + b * kGemvWarps;
      if (ks < nks) {  // warp-uniform
        uint32_t af[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          af[i][0] = pack_lo_halves(word(w[b][0], i), word(w[b][1], i));  // col 8g+2i,   rows +0 +1
          af[i][1] = pack_hi_halves(word(w[b][0], i), word(w[b][1], i));  // col 8g+2i+1, rows +0 +1
          af[i][2] = pack_lo_halves(word(w[b][2], i), word(w[b][3], i));  // col 8g+2i,   rows +2 +3
          af[i][3] = pack_hi_halves(word(w[b][2], i), word(w[b][3], i));  // col 8g+2i+1, rows +2 +3
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint2 bq =
              *reinterpret_cast<const uint2*>(q_s + (j * 8 + g) * a.q_stride + ks * 16 + 4 * q);
#pragma unroll
          for (int i = 0; i < 4; ++i)
            mma_bf16(acc[j][i], af[i][0], af[i][1], af[i][2], af[i][3], bq.x, bq.y);
        }
      }
    }
  }

  constexpr int kRed = NT * 16 * 32;  // floats per warp in red
  if (warp > 0) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[(warp - 1) * kRed + ((j * 4 + i) * 4 + e) * 32 + lane] = acc[j][i][e];
  }
  __syncthreads();
  if (warp != 0 || !col_ok) return;
  const int row = a.Dl + a.Dr;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int ta = t0 + j * 8 + 2 * q;  // c0, c2: token ta; c1, c3: token ta + 1
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int k = ((j * 4 + i) * 4 + e) * 32 + lane;
        v[e] = ((acc[j][i][e] + red[k]) + red[kRed + k]) + red[2 * kRed + k];  // warps 0, 1, 2, 3
      }
      const int c = c0 + 8 * g + 2 * i;
      if (ta < a.T)
        *reinterpret_cast<uint32_t*>(a.q_abs + (int64_t(ta) * a.H + h) * row + c) = bf16x2_bits(v[0], v[2]);
      if (ta + 1 < a.T)
        *reinterpret_cast<uint32_t*>(a.q_abs + (int64_t(ta + 1) * a.H + h) * row + c) =
            bf16x2_bits(v[1], v[3]);
    }
  }
}
static_assert(kGemvWarps == 4, "the reductions add warps 0..3 by name");

// The rotary part of q_abs alone (the cuBLAS path writes the latent part): a block per token.
__global__ void __launch_bounds__(128) absorb_rope_kernel(AbsorbArgs a) {
  const int t = blockIdx.x, half = a.Dr / 2;
  for (int i = threadIdx.x; i < a.H * half; i += 128) absorb_rope(a, t, i / half, i % half);
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

constexpr int kUpRows = 32;  // W_uv rows per block: two m-tiles of 16

struct UpArgs {
  const __nv_bfloat16* out_lat;  // [T, H, Dl]
  const __nv_bfloat16* kv_b;     // [H * (nope + v), Dl]
  int T, H, Dl, nope, v;
  __nv_bfloat16* out;  // [T, H, v]
};

// out[t, h, j0 : j0 + 32] for the 8 * NT tokens from t0 = blockIdx.x * 8 NT, j0 = blockIdx.y * 32,
// h = blockIdx.z: out^T [32 rows, tokens] = W_uv[h] [32, Dl] . out_lat^T [Dl, tokens] as mma
// tiles M = 16 rows, N = 8 tokens, K = 16 latent columns. Warp w takes the 32-column chunks w,
// w + 4, ... of the latent; lane (g, q) loads 16 bytes at columns 32 c + 8q of W_uv rows g and
// g + 8 of each m-tile and of the latents of tokens g (+ 8 per token tile). Logical k 2q + e of
// k-step s is column 8q + 4s + e and k 2q + 8 + e is 8q + 4s + 2 + e, so the loaded words are the
// fragments as they stand: A = (row g word 2s, row g+8 word 2s, row g word 2s+1, row g+8 word
// 2s+1), B = (latent word 2s, word 2s+1).
template <int NT>
__global__ void __launch_bounds__(kGemvThreads) up_v_mma_kernel(UpArgs a) {
  constexpr int KB = NT <= 2 ? 4 : 2;  // column chunks whose loads a warp issues together
  constexpr int kRed = 2 * NT * 4 * 32;  // floats per warp in red
  __shared__ float red[(kGemvWarps - 1) * kRed];  // warps 1..3's sums, for warp 0 to add
  const int t0 = blockIdx.x * 8 * NT, j0 = blockIdx.y * kUpRows, h = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const __nv_bfloat16* w_h = a.kv_b + (int64_t(h) * (a.nope + a.v) + a.nope) * a.Dl;  // W_uv[h]
  const __nv_bfloat16* w_row[2][2];  // [m-tile][row g, g + 8]
  bool w_ok[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int j = j0 + 16 * mt + 8 * hf + g;
      w_ok[mt][hf] = j < a.v;
      w_row[mt][hf] = w_h + int64_t(w_ok[mt][hf] ? j : 0) * a.Dl;
    }
  const __nv_bfloat16* x_row[NT];  // latent rows of tokens t0 + 8 jt + g
  bool x_ok[NT];
#pragma unroll
  for (int jt = 0; jt < NT; ++jt) {
    const int t = t0 + 8 * jt + g;
    x_ok[jt] = t < a.T;
    x_row[jt] = a.out_lat + (int64_t(x_ok[jt] ? t : 0) * a.H + h) * a.Dl;
  }
  const int n_chunks = (a.Dl + 31) / 32;
  float acc[2][NT][4] = {};  // [m-tile][token tile][c0..c3]
  for (int cs0 = warp; cs0 < n_chunks; cs0 += kGemvWarps * KB) {
    uint4 w[KB][2][2], x[KB][NT];
#pragma unroll
    for (int b = 0; b < KB; ++b) {
      const int cs = cs0 + b * kGemvWarps, c = cs * 32 + 8 * q;
      const bool ok = cs < n_chunks && c < a.Dl;  // Dl % 16 == 0: pieces are all in or all out
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          w[b][mt][hf] = ok && w_ok[mt][hf] ? load_16(w_row[mt][hf] + c) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int jt = 0; jt < NT; ++jt)
        x[b][jt] = ok && x_ok[jt] ? load_16(x_row[jt] + c) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int b = 0; b < KB; ++b) {
      if (cs0 + b * kGemvWarps >= n_chunks) continue;  // warp-uniform
#pragma unroll
      for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int jt = 0; jt < NT; ++jt)
            mma_bf16(acc[mt][jt], word(w[b][mt][0], 2 * s), word(w[b][mt][1], 2 * s),
                     word(w[b][mt][0], 2 * s + 1), word(w[b][mt][1], 2 * s + 1),
                     word(x[b][jt], 2 * s), word(x[b][jt], 2 * s + 1));
    }
  }

  if (warp > 0) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int jt = 0; jt < NT; ++jt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          red[(warp - 1) * kRed + ((mt * NT + jt) * 4 + e) * 32 + lane] = acc[mt][jt][e];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int jt = 0; jt < NT; ++jt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // c0: (row g, token 2q), c1: (row g, token 2q + 1), c2, c3: row g + 8.
        const int j = j0 + 16 * mt + g + (e >= 2 ? 8 : 0), t = t0 + 8 * jt + 2 * q + (e & 1);
        const int k = ((mt * NT + jt) * 4 + e) * 32 + lane;
        const float v = ((acc[mt][jt][e] + red[k]) + red[kRed + k]) + red[2 * kRed + k];
        if (j < a.v && t < a.T) a.out[(int64_t(t) * a.H + h) * a.v + j] = __float2bfloat16_rn(v);
      }
}

template <int NT>
cudaError_t launch_absorb(const AbsorbArgs& a, cudaStream_t stream) {
  const size_t smem = absorb_smem_bytes<NT>(a.q_stride);
  if (smem > 48 * 1024) {  // long nope rows: opt in once, for the largest tile kMaxNope allows
    const cudaError_t e = ensure_max_dynamic_smem<absorb_q_mma_kernel<NT>>(
        int(absorb_smem_bytes<NT>(absorb_q_stride(kMaxNope))));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(unsigned((a.T + 8 * NT - 1) / (8 * NT)),
                  unsigned((a.Dl + kAbsorbCols - 1) / kAbsorbCols), unsigned(a.H));
  absorb_q_mma_kernel<NT><<<grid, kGemvThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

template <int NT>
cudaError_t launch_up_v(const UpArgs& a, cudaStream_t stream) {
  const dim3 grid(unsigned((a.T + 8 * NT - 1) / (8 * NT)), unsigned((a.v + kUpRows - 1) / kUpRows),
                  unsigned(a.H));
  up_v_mma_kernel<NT><<<grid, kGemvThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

// Token tiles of 8 per GEMV block: 1, 2 or 4 (T <= 8, <= 16, larger: groups of 32 tokens).
int gemv_token_tiles(int T) { return T <= 8 ? 1 : T <= 16 ? 2 : 4; }

// Prefill-sized products go to cuBLAS, unless the stream is being captured (a decode graph of a
// large batch bucket): graphs keep to the kernels here, which take any T.
bool use_gemm(int T, cudaStream_t stream) {
  if (T <= kGemvMaxTokens) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &st) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; do not report it as the launch's error
    return false;
  }
  return st == cudaStreamCaptureStatusNone;
}

}  // namespace

std::string mla_unsupported_reason(const MlaShape& s) {
  // Chunks of 8 (16 bytes) never straddle the latent's end; the attention kernel's registers
  // per lane bound the row; the absorb kernel's q tile lives in shared memory; heads
  // index a grid dimension.
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
  TETRA_CHECK(aligned(kv_b, 16) && aligned(q_abs, 4),
              "mla absorb q (cuda): kv_b must be 16-byte aligned and q_abs 4-byte aligned");
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
  a.q_stride = absorb_q_stride(s.nope_dim);
  a.neox = s.style == RopeStyle::NeoX;
  a.q_abs = reinterpret_cast<__nv_bfloat16*>(q_abs);
  if (use_gemm(T, stream)) {  // prefill: tensor-core GEMMs, then the rotary part
    mla_absorb_gemm(q, kv_b, T, s, q_abs, stream);
    absorb_rope_kernel<<<unsigned(T), 128, 0, stream>>>(a);
    return cudaGetLastError();
  }
  switch (gemv_token_tiles(T)) {
    case 1: return launch_absorb<1>(a, stream);
    case 2: return launch_absorb<2>(a, stream);
    default: return launch_absorb<4>(a, stream);
  }
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
  if (use_gemm(T, stream)) {  // prefill: tensor-core GEMMs
    mla_up_v_gemm(out_lat, kv_b, T, s, out, stream);
    return cudaGetLastError();
  }
  UpArgs a;
  a.out_lat = reinterpret_cast<const __nv_bfloat16*>(out_lat);
  a.kv_b = reinterpret_cast<const __nv_bfloat16*>(kv_b);
  a.T = T;
  a.H = s.n_heads;
  a.Dl = s.kv_lora;
  a.nope = s.nope_dim;
  a.v = s.v_dim;
  a.out = reinterpret_cast<__nv_bfloat16*>(out);
  switch (gemv_token_tiles(T)) {
    case 1: return launch_up_v<1>(a, stream);
    case 2: return launch_up_v<2>(a, stream);
    default: return launch_up_v<4>(a, stream);
  }
}

}  // namespace tetra::ops::cuda
