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
//   mla_attention:   rows 16-byte aligned and Dl <= 512 (every real model): a flash-attention
//                    style tensor-core kernel. A block per (token, 32 heads, key split): the
//                    token's 32 absorbed query rows and tiles of 64 cached rows (32 where two
//                    tiles of 64 do not fit) in shared memory (cp.async, double buffered), so
//                    each cached row is read once per 32 heads;
//                    scores Q K^T and the latent sum P V on mma.sync, an online softmax in base 2
//                    between them. When T * H is small (decode) the keys are split over up to 32
//                    blocks per row group, whose partials (max, sum, latent sum) a combine kernel
//                    merges in split order (workspace: mla_attention_workspace_bytes). Otherwise
//                    (4-byte rows, Dl > 512): a CUDA-core kernel, a block per (token, head).
//   mla_up_v:        T <= 64: the same register-fed tensor-core GEMV as absorb: a block per
//                    (32-token group, 32 W_uv rows, head), 4 warps splitting the latent; W_uv
//                    rows are k-contiguous, so their 16-byte pieces are A fragments as loaded.
//                    T > 64 (not captured): cuBLAS (mla_gemm.h).
// No allocation, no synchronisation, grids from T, the shape and the SM count only: graph
// capturable (a captured launch never reaches cuBLAS).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/kernel_smem_attr.h"
#include "ops/attention/mla_cuda.h"
#include "ops/attention/mla_gemm.h"
#include "ops/rope/rope_turn.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kMaxRow = 1024;   // Dl + Dr: bounds the CUDA-core attention kernel's registers
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

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Max over the 4 lanes of a quad (the lanes holding one mma row). Every lane gets the same value.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Sum over a quad; the same bits in all 4 lanes (a + b == b + a in IEEE arithmetic).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
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

// ---- tensor-core building blocks (sm_80+) --------------------------------------------------
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

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; valid false writes 16 zero bytes instead (src is
// not read then).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Four 8x8 bf16 matrices from shared memory; lane l gives the address of row l % 8 of matrix
// l / 8. Plain: lane gets (row g, cols 2q, 2q+1) of each; trans: (rows 2q, 2q+1, col g).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
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

// ---- mla_attention on CUDA cores (rows not 16-byte aligned, Dl > 512) ---------------------
// A block per (token, head) (a token's heads adjacent: its keys stay in L2), 8 warps taking
// interleaved groups of 4 keys (16 warps of 2 when there are few blocks) with an online softmax
// (base 2); lanes own fixed 8-dim chunks of the row (2-dim where rows are not 16-byte aligned),
// so a key's latent sits in the registers that scored it; the warps' (max, sum, latent sum)
// merge in shared memory at the end.

// What both attention kernels read (the tensor-core kernel's TcAttnArgs adds its tiling).
struct AttnArgs {
  const __nv_bfloat16* q_abs;  // [T, H, row]
  const __nv_bfloat16* cache;  // [num_slots, row]
  const int32_t* cu_seqlens;   // [S + 1]
  const int32_t* positions;    // [T]
  MlaKeys keys;
  int S, H, Dl, row;
  float scale_log2;        // scale * log2(e): the softmax runs in base 2
  __nv_bfloat16* out_lat;  // [T, H, Dl] (TcAttnArgs: when splits == 1)
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

// Keys token t reads: positions 0 .. pos, or with a DSA selection its first min(stride, pos + 1)
// selected positions (MlaKeys::selected).
__device__ __forceinline__ int key_count(const MlaKeys& k, int pos) {
  return k.selected ? min(k.selected_stride, pos + 1) : pos + 1;
}

// Cache slot of token t's i-th key in sequence b (whose first token is `first`); -1 past its n
// keys. The i-th key is position i, or the i-th selected position.
__device__ __forceinline__ int64_t key_slot(const MlaKeys& k, int b, int first, int t, int i,
                                            int n) {
  if (i >= n) return -1;
  const int j = k.selected ? k.selected[int64_t(t) * k.selected_stride + i] : i;
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
  const int n = key_count(a.keys, a.positions[t]);  // keys 0 .. positions[t], or selected
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
    slot[i] = key_slot(a.keys, b, first, t, warp * P + i, n);
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
    for (int i = 0; i < P; ++i) slot[i] = key_slot(a.keys, b, first, t, j0 + kStep + i, n);

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

// ---- mla_attention on tensor cores ----------------------------------------------------------

constexpr int kTcWarps = 8;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcHeads = 32;        // query rows per block: two m-tiles of 16 heads
constexpr int kKeyTile = 32;        // split boundaries round to whole tiles of 32 cached rows
constexpr int kTcMaxLatent = 512;   // Dl: a warp's [16 heads, Dl / 4] latent sums in registers
constexpr int kTcPairs = kTcMaxLatent / 16 / 4;  // 16-column output pieces per warp
constexpr int kMaxSplits = 32;      // the combine kernel merges a row's splits in one warp
constexpr int kMinSplitKeys = 64;   // fewer keys per split would cost more in partials than keys
// Floats per row of the shared score tile of KT keys: KT + 8, so that the float2 stores of a
// half warp (rows g, pairs q) fall in distinct banks.
constexpr int score_stride(int KT) { return KT + 8; }

bool tc_attention_shape(const MlaShape& s) { return s.kv_lora <= kTcMaxLatent && s.row() % 8 == 0; }

// Columns of a row the score loop covers: the row rounded up to whole pairs of k-steps (32).
int tc_kpad(int row) { return (row + 31) / 32 * 32; }
// Elements per shared row: kpad + 8, i.e. an odd number of 16-byte pieces, so the 8 rows one
// ldmatrix phase reads fall in distinct bank groups.
int tc_stride(int row) { return tc_kpad(row) + 8; }
// The queries, two key tiles of KT rows (one layout of 32 + 2 KT rows) and the score tile.
size_t tc_smem_bytes(int row, int KT) {
  return size_t(kTcHeads + 2 * KT) * tc_stride(row) * 2 +
         size_t(kTcHeads) * score_stride(KT) * sizeof(float);
}

// Cached rows per step: 64 where two such tiles fit beside the queries (GLM-5 and DeepSeek-V3's
// 576-element rows: 196 KB of the H100/H200's 227), so each step has twice the bytes in flight
// and the per-step barriers, softmax and query reads serve twice the keys; 32 otherwise.
// TETRA_MLA_KEY_TILE=32 forces 32 (A/B measurements).
int tc_key_tile(int row) {
  static const bool forced_32 = [] {
    const char* e = std::getenv("TETRA_MLA_KEY_TILE");
    return e != nullptr && std::atoi(e) == 32;
  }();
  return !forced_32 && tc_smem_bytes(row, 64) <= size_t(current_device_smem_optin_per_block()) ? 64 : 32;
}

int tc_groups(int H) { return (H + kTcHeads - 1) / kTcHeads; }

// Key splits for T tokens: enough blocks for every SM (one block fits an SM) when T * groups
// is below the SM count, at most kMaxSplits; 1 otherwise.
int tc_splits(int T, int H) {
  const int64_t blocks = int64_t(T) * tc_groups(H);
  const int sms = current_device_sm_count();
  return blocks >= sms ? 1 : int(std::min<int64_t>(kMaxSplits, sms / blocks));
}

size_t tc_partial_bytes(int splits, int T, const MlaShape& s) {
  return size_t(splits) * T * s.n_heads * (size_t(s.kv_lora) * sizeof(float) + sizeof(float2));
}

// Keys per split for n keys in `splits` splits: whole key tiles, at least kMinSplitKeys. Split
// s takes keys [s * kps, min(n, (s + 1) * kps)); splits from ceil(n / kps) on have none.
__device__ __forceinline__ int split_keys(int n, int splits) {
  const int per = (n + splits - 1) / splits;
  return max(kMinSplitKeys, (per + kKeyTile - 1) / kKeyTile * kKeyTile);
}

// Token t's sequence: the last b with cu_seqlens[b] <= t.
__device__ __forceinline__ int sequence_of(const int32_t* cu_seqlens, int S, int t) {
  int lo = 0, hi = S - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu_seqlens[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

struct TcAttnArgs : AttnArgs {
  int T, kpad, stride, groups, splits;
  float* part_o;    // [splits, T, H, Dl] unnormalised latent sums (splits > 1)
  float2* part_ml;  // [splits, T, H] (max, sum) in base 2 (splits > 1)
};

// blockIdx.x = (T - 1 - t) * groups + group (long prefill rows start first), blockIdx.y = split.
// Warp w: m-tile mt = w / 4 (heads h0 + 16 mt ..), quarter qd = w % 4. Per key tile of KT (32 or
// 64; NB = KT / 32 key groups of 8 per warp):
//   scores: warp (mt, qd) computes S [16 heads, keys 8 NB qd .. + 8 NB - 1] = Q K^T over the row
//           (A: q_s by ldmatrix, B: the key rows by ldmatrix, k = row dims; two mma chains per
//           key group), masks keys past the split's end, and stores them (base 2, scaled) to s_s;
//   softmax: every warp of m-tile mt reads its 16 rows x KT keys in A-fragment order, updates
//           the running max / sum (all four warps compute the same numbers from the same data)
//           and rescales its latent sums;
//   latents: warp (mt, qd) adds P [16, KT keys] . V [KT keys, its columns] (B: the key rows'
//           first Dl dims by ldmatrix.trans); its columns are the 16-wide pieces qd, qd + 4, ...
// P is rounded to bf16 for the mma; the running sum adds the rounded values, so the weights
// the latents see sum exactly to the divisor.
template <int KT>
__global__ void __launch_bounds__(kTcThreads, 1) attention_tc_kernel(TcAttnArgs a) {
  static_assert(KT == 32 || KT == 64, "key tiles of 32 or 64 rows");
  constexpr int NB = KT / 32;               // 8-key groups per warp in the score step
  constexpr int KS = KT / 16;               // k-steps of the P V mma per tile
  constexpr int SS = score_stride(KT);
  extern __shared__ __align__(16) unsigned char tc_smem[];
  // q_s [32, stride] the queries, then k_s [2, KT, stride] two key tiles: one layout of rows.
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(tc_smem);
  __nv_bfloat16* k_s = q_s + kTcHeads * a.stride;
  float* s_s = reinterpret_cast<float*>(k_s + 2 * KT * a.stride);  // [32, SS]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int mt = warp / 4, qd = warp % 4;
  const int t = a.T - 1 - int(blockIdx.x) / a.groups;
  const int h0 = int(blockIdx.x) % a.groups * kTcHeads;
  const int b = sequence_of(a.cu_seqlens, a.S, t), first = a.cu_seqlens[b];
  const int n = key_count(a.keys, a.positions[t]);  // keys 0 .. positions[t], or selected
  const int kps = split_keys(n, a.splits);
  const int start = int(blockIdx.y) * kps;
  if (start >= n) return;  // a split past the keys (block-uniform): the combine skips it
  const int end = min(n, start + kps);
  const int n_tiles = (end - start + KT - 1) / KT;
  const int chunks = a.row / 8;  // 16-byte pieces per row

  // Pad columns [row, kpad) of all 32 + 2 KT rows: zero (cp.async never writes them).
  const int pad_chunks = (a.kpad - a.row) / 8;
  for (int i = threadIdx.x; i < (kTcHeads + 2 * KT) * pad_chunks; i += kTcThreads) {
    const int r = i / pad_chunks, c = chunks + i % pad_chunks;
    *reinterpret_cast<uint4*>(q_s + r * a.stride + c * 8) = make_uint4(0u, 0u, 0u, 0u);
  }
  for (int i = threadIdx.x; i < kTcHeads * chunks; i += kTcThreads) {  // queries, 0 past H
    const int r = i / chunks, c = i - r * chunks, h = h0 + r;
    const __nv_bfloat16* src = a.q_abs + (int64_t(t) * a.H + min(h, a.H - 1)) * a.row + c * 8;
    cp_async_16(smem_u32(q_s + r * a.stride + c * 8), src, h < a.H);
  }
  // Key tile it -> buffer it % 2: thread -> key rows tid / 8 + 32 r, pieces tid % 8 + 8 i; keys
  // past the split's end become zero rows (their scores are masked, their P is 0: no NaN meets
  // it).
  const int lr = threadIdx.x / 8, lc = threadIdx.x % 8;
  const auto load_tile = [&](int it) {
#pragma unroll
    for (int r = 0; r < NB; ++r) {
      const int j = start + it * KT + 32 * r + lr;
      const int64_t slot = j < end ? key_slot(a.keys, b, first, t, j, n) : -1;
      const __nv_bfloat16* src = a.cache + (slot < 0 ? 0 : slot) * a.row;
      const __nv_bfloat16* dst = k_s + ((it & 1) * KT + 32 * r + lr) * a.stride;
      for (int c = lc; c < chunks; c += 8) cp_async_16(smem_u32(dst + c * 8), src + c * 8, slot >= 0);
    }
  };
  load_tile(0);
  cp_async_commit();

  float o[kTcPairs][2][4] = {};  // latent sums: [piece][8-column half][c0..c3]
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // rows g, g + 8
  const int pieces = a.Dl / 16;
  // ldmatrix row addresses. Scores, A (queries): rows mt*16 + l % 16, k + 8 (l / 16); B (keys of
  // group nb): key rows 8 (NB qd + nb) + l % 8, k + 8 (l / 8) (two k-steps per x4). Latents, B
  // (values, trans): key rows kk*16 + l % 8 + 8 ((l / 8) % 2), columns 16 piece + 8 (l / 16).
  const uint32_t q_addr = smem_u32(q_s + (mt * 16 + lane % 16) * a.stride + lane / 16 * 8);
  const int k_off = (NB * qd * 8 + lane % 8) * a.stride + lane / 8 * 8;
  const int v_off = (lane % 8 + (lane / 8) % 2 * 8) * a.stride + lane / 16 * 8;
  const int k2_steps = a.kpad / 32;
  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait_all();
    __syncthreads();  // tile it is in; every warp is done with tile it - 1 and the scores
    if (it + 1 < n_tiles) load_tile(it + 1);
    cp_async_commit();
    const __nv_bfloat16* kt = k_s + (it & 1) * KT * a.stride;

    // [key group][even / odd k-steps]: 2 NB independent mma chains
    float sc[NB][2][4] = {};
    const uint32_t k_addr = smem_u32(kt + k_off);
    for (int k2 = 0; k2 < k2_steps; ++k2) {
      uint32_t qa[4], qb[4];
      ldsm_x4(qa, q_addr + k2 * 64);       // k-step 2 k2 (32 columns = 64 bytes per k2)
      ldsm_x4(qb, q_addr + k2 * 64 + 32);  // k-step 2 k2 + 1
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        uint32_t kb[4];  // keys of group nb: b0 b1 of step 2 k2, then of step 2 k2 + 1
        ldsm_x4(kb, k_addr + nb * 8 * a.stride * 2 + k2 * 64);
        mma_bf16(sc[nb][0], qa[0], qa[1], qa[2], qa[3], kb[0], kb[1]);
        mma_bf16(sc[nb][1], qb[0], qb[1], qb[2], qb[3], kb[2], kb[3]);
      }
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      const int col = (NB * qd + nb) * 8 + 2 * q;  // tile key of c0, c2 (c1, c3: col + 1)
      const int j = start + it * KT + col;
      float s4[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) s4[e] = (sc[nb][0][e] + sc[nb][1][e]) * a.scale_log2;
      if (j >= end) s4[0] = s4[2] = -INFINITY;
      if (j + 1 >= end) s4[1] = s4[3] = -INFINITY;
      float* srow = s_s + (mt * 16 + g) * SS + col;
      *reinterpret_cast<float2*>(srow) = make_float2(s4[0], s4[1]);
      *reinterpret_cast<float2*>(srow + 8 * SS) = make_float2(s4[2], s4[3]);
    }
    __syncthreads();  // all 32 x KT scores of the tile are in

    // sv[rr][kk][hh]: scores of row g + 8 rr at keys 16 kk + 8 hh + 2q, + 1 (A-fragment order).
    float2 sv[2][KS][2];
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int rr = 0; rr < 2; ++rr)
#pragma unroll
      for (int kk = 0; kk < KS; ++kk)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          sv[rr][kk][hh] = *reinterpret_cast<const float2*>(
              s_s + (mt * 16 + g + 8 * rr) * SS + kk * 16 + hh * 8 + 2 * q);
          mx[rr] = fmaxf(mx[rr], fmaxf(sv[rr][kk][hh].x, sv[rr][kk][hh].y));
        }
    uint32_t pa[KS][4];  // P as the A fragments of the tile's k-steps (16 keys each)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      // Finite: every tile holds a key below `end` (rows past H score 0 there).
      const float m_new = fmaxf(m_run[rr], quad_max(mx[rr]));
      const float corr = exp2f(m_run[rr] - m_new);  // 0 on the first tile (m_run = -inf)
      m_run[rr] = m_new;
      l_run[rr] *= corr;
#pragma unroll
      for (int i = 0; i < kTcPairs; ++i)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          o[i][hf][2 * rr] *= corr;
          o[i][hf][2 * rr + 1] *= corr;
        }
#pragma unroll
      for (int kk = 0; kk < KS; ++kk)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const __nv_bfloat162 p = __floats2bfloat162_rn(exp2f(sv[rr][kk][hh].x - m_new),
                                                         exp2f(sv[rr][kk][hh].y - m_new));
          l_run[rr] += __low2float(p) + __high2float(p);
          pa[kk][rr + 2 * hh] = *reinterpret_cast<const uint32_t*>(&p);  // a0..a3 order
        }
    }
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      const uint32_t v_addr = smem_u32(kt + kk * 16 * a.stride + v_off);
#pragma unroll
      for (int i = 0; i < kTcPairs; ++i) {
        const int piece = qd + 4 * i;
        if (piece < pieces) {
          uint32_t vb[4];  // b0 b1 of columns 16 piece .. + 7, then of + 8 .. + 15
          ldsm_x4_trans(vb, v_addr + piece * 32);
          mma_bf16(o[i][0], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], vb[0], vb[1]);
          mma_bf16(o[i][1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], vb[2], vb[3]);
        }
      }
    }
  }

  // Each lane summed its own key columns: the row sums are quad sums.
  l_run[0] = quad_sum(l_run[0]);
  l_run[1] = quad_sum(l_run[1]);
  const int ha = h0 + mt * 16 + g, hb = ha + 8;
  if (a.splits == 1) {
    const float ia = 1.0f / l_run[0], ib = 1.0f / l_run[1];
#pragma unroll
    for (int i = 0; i < kTcPairs; ++i) {
      const int piece = qd + 4 * i;
      if (piece >= pieces) continue;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int d = piece * 16 + hf * 8 + 2 * q;
        if (ha < a.H)
          *reinterpret_cast<uint32_t*>(a.out_lat + (int64_t(t) * a.H + ha) * a.Dl + d) =
              bf16x2_bits(o[i][hf][0] * ia, o[i][hf][1] * ia);
        if (hb < a.H)
          *reinterpret_cast<uint32_t*>(a.out_lat + (int64_t(t) * a.H + hb) * a.Dl + d) =
              bf16x2_bits(o[i][hf][2] * ib, o[i][hf][3] * ib);
      }
    }
    return;
  }
  const int64_t ra = (int64_t(blockIdx.y) * a.T + t) * a.H + ha, rb = ra + 8;  // partial rows
#pragma unroll
  for (int i = 0; i < kTcPairs; ++i) {
    const int piece = qd + 4 * i;
    if (piece >= pieces) continue;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int d = piece * 16 + hf * 8 + 2 * q;
      if (ha < a.H)
        *reinterpret_cast<float2*>(a.part_o + ra * a.Dl + d) = make_float2(o[i][hf][0], o[i][hf][1]);
      if (hb < a.H)
        *reinterpret_cast<float2*>(a.part_o + rb * a.Dl + d) = make_float2(o[i][hf][2], o[i][hf][3]);
    }
  }
  if (qd == 0 && q == 0) {
    if (ha < a.H) a.part_ml[ra] = make_float2(m_run[0], l_run[0]);
    if (hb < a.H) a.part_ml[rb] = make_float2(m_run[1], l_run[1]);
  }
}

// Merges the key splits of row (t, h) = blockIdx.x (t * H + h), columns 64 blockIdx.y .. + 63
// (a column pair per lane): out = sum_s o_s 2^(m_s - M) / sum_s l_s 2^(m_s - M), M = max_s m_s,
// over the splits that had keys (split_keys, as the attention kernel counted them), in split
// order. Lane s holds split s's weight; the sums run in a fixed order.
__global__ void __launch_bounds__(32) attention_combine_kernel(TcAttnArgs a) {
  const int th = blockIdx.x, t = th / a.H, lane = threadIdx.x;
  const int n = key_count(a.keys, a.positions[t]);
  const int kps = split_keys(n, a.splits);
  const int used = (n + kps - 1) / kps;  // >= 1
  const int64_t split_rows = int64_t(a.T) * a.H;  // rows per split in part_o / part_ml
  float m = -INFINITY, l = 0.0f;
  if (lane < used) {
    const float2 ml = a.part_ml[lane * split_rows + th];
    m = ml.x;
    l = ml.y;
  }
  const float M = warp_max(m);  // finite: split 0 has keys
  const float wgt = lane < used ? exp2f(m - M) : 0.0f;
  const float f = wgt / warp_sum(l * wgt);  // split `lane`'s factor
  const int d = (int(blockIdx.y) * 32 + lane) * 2;
  const bool ok = d < a.Dl;
  float x = 0.0f, y = 0.0f;
#pragma unroll 4
  for (int s = 0; s < used; ++s) {
    const float fs = __shfl_sync(0xffffffffu, f, s);
    if (ok) {
      const float2 v = *reinterpret_cast<const float2*>(a.part_o + (s * split_rows + th) * a.Dl + d);
      x += v.x * fs;
      y += v.y * fs;
    }
  }
  if (ok)
    *reinterpret_cast<uint32_t*>(a.out_lat + int64_t(th) * a.Dl + d) = bf16x2_bits(x, y);
}
static_assert(kMaxSplits <= 32, "a split per lane in the combine kernel");

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
  // Chunks of 8 (16 bytes) never straddle the latent's end; the CUDA-core attention kernel's
  // registers per lane bound the row; the absorb kernel's q tile lives in shared memory; heads
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

size_t mla_attention_workspace_bytes(const MlaShape& s, int max_tokens) {
  if (max_tokens <= 0 || s.n_heads <= 0 || !tc_attention_shape(s) ||
      !mla_unsupported_reason(s).empty())
    return 0;
  // Splits stop at T * groups >= the SM count, so only T below it can need partials.
  const int last = std::min(max_tokens, current_device_sm_count());
  size_t bytes = 0;
  for (int T = 1; T <= last; ++T) {
    const int splits = tc_splits(T, s.n_heads);
    if (splits > 1) bytes = std::max(bytes, tc_partial_bytes(splits, T, s));
  }
  return bytes;
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
                          void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  (void)num_slots;  // slots are trusted on the device (mla_cuda.h)
  check_cuda_shape(s, "mla attention");
  TETRA_CHECK(T >= 0 && (S >= 1 || T == 0), "mla attention (cuda): ", S, " sequences, ", T,
              " tokens");
  TETRA_CHECK(keys.step_slots != nullptr ||
                  (keys.block_tables != nullptr && keys.block_size > 0 &&
                   keys.max_blocks_per_seq > 0),
              "mla attention (cuda): keys need step slots or block tables");
  TETRA_CHECK(keys.selected == nullptr || keys.selected_stride > 0,
              "mla attention (cuda): a DSA selection needs its stride");
  TETRA_CHECK(int64_t(T) * s.n_heads < (int64_t(1) << 31), "mla attention (cuda): ", T,
              " tokens x ", s.n_heads, " heads");
  TETRA_CHECK(aligned(q_abs, 4) && aligned(cache, 4) && aligned(out_lat, 4),
              "mla attention (cuda): q_abs, cache and out_lat must be 4-byte aligned");
  if (T == 0) return cudaSuccess;
  AttnArgs base;
  base.q_abs = reinterpret_cast<const __nv_bfloat16*>(q_abs);
  base.cache = reinterpret_cast<const __nv_bfloat16*>(cache);
  base.cu_seqlens = cu_seqlens;
  base.positions = positions;
  base.keys = keys;
  base.S = S;
  base.H = s.n_heads;
  base.Dl = s.kv_lora;
  base.row = s.row();
  base.scale_log2 = s.scale * 1.4426950408889634f;
  base.out_lat = reinterpret_cast<__nv_bfloat16*>(out_lat);
  if (tc_attention_shape(s) && aligned(q_abs, 16) && aligned(cache, 16)) {
    TcAttnArgs a;
    static_cast<AttnArgs&>(a) = base;
    a.T = T;
    a.kpad = tc_kpad(s.row());
    a.stride = tc_stride(s.row());
    a.groups = tc_groups(s.n_heads);
    a.splits = workspace != nullptr ? tc_splits(T, s.n_heads) : 1;
    a.part_o = nullptr;
    a.part_ml = nullptr;
    if (a.splits > 1) {
      const size_t need = tc_partial_bytes(a.splits, T, s);
      TETRA_CHECK(workspace_bytes >= need && aligned(workspace, 16), "mla attention (cuda): ",
                  a.splits, " key splits of ", T, " tokens need a 16-byte aligned workspace of ",
                  need, " bytes, got ", workspace_bytes, " (mla_attention_workspace_bytes)");
      a.part_o = static_cast<float*>(workspace);
      a.part_ml = reinterpret_cast<float2*>(a.part_o + size_t(a.splits) * T * a.H * a.Dl);
    }
    const int64_t blocks = int64_t(T) * a.groups;  // <= T * H < 2^31
    const dim3 grid(unsigned(blocks), unsigned(a.splits));
    const auto go = [&]<int KT>() {
      // Opted in once per GPU for the largest row that takes this tile (tc_key_tile).
      const size_t most =
          KT == 64 ? size_t(current_device_smem_optin_per_block()) : tc_smem_bytes(kMaxRow, 32);
      const cudaError_t e = ensure_max_dynamic_smem<attention_tc_kernel<KT>>(int(most));
      if (e != cudaSuccess) return e;
      attention_tc_kernel<KT><<<grid, kTcThreads, tc_smem_bytes(s.row(), KT), stream>>>(a);
      return cudaGetLastError();
    };
    const cudaError_t e = tc_key_tile(s.row()) == 64 ? go.template operator()<64>()
                                                     : go.template operator()<32>();
    if (e != cudaSuccess) return e;
    if (a.splits > 1)
      attention_combine_kernel<<<dim3(unsigned(int64_t(T) * a.H), unsigned((a.Dl + 63) / 64)), 32,
                                 0, stream>>>(a);
    return cudaGetLastError();
  }

  const unsigned blocks = unsigned(int64_t(T) * s.n_heads);
  // 16-byte chunks where rows and pointers allow.
  if (s.row() % 8 == 0 && aligned(q_abs, 16) && aligned(cache, 16)) {
    const int K = (s.row() / 8 + 31) / 32;
    // Few blocks (decode, T * H < 2 SMs' worth): 16 warps of 2 keys a step instead of 8 of 4,
    // the same loads in flight in chains half as long; the [16, Dl] merge buffer stays within
    // 48 KB and the registers within the 128 a thread that 512 threads allow.
    const bool wide = int64_t(blocks) < 2 * int64_t(current_device_sm_count()) && K <= 3 &&
                      s.kv_lora <= 512;
    switch (K) {
      case 1: return wide ? launch_attention<8, 1, 16, 2>(base, blocks, stream)
                          : launch_attention<8, 1, 8, 4>(base, blocks, stream);
      case 2: return wide ? launch_attention<8, 2, 16, 2>(base, blocks, stream)
                          : launch_attention<8, 2, 8, 4>(base, blocks, stream);
      case 3: return wide ? launch_attention<8, 3, 16, 2>(base, blocks, stream)
                          : launch_attention<8, 3, 8, 4>(base, blocks, stream);
      default: return launch_attention<8, 4, 8, 4>(base, blocks, stream);
    }
  }
  return launch_attention<2, kMaxRow / 2 / 32, 8, 4>(base, blocks, stream);  // 4-byte chunks
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
