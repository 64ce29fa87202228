// BF16 grouped MoE GEMM kernel (see bf16_moe.h). Swap-AB orientation: the weight tile is the MMA's
// A operand (16 weight rows per m16 tile), the expert's token rows are B (8 tokens per n8 tile), so
// small token counts waste only B-side work while the weights stream once.
#include "core/kernel_smem_attr.h"
#include "ops/moe/bf16_moe.h"

#include <algorithm>

#include "core/error.h"
#include "ops/moe/w4a16_fragment.cuh"

namespace tetra {
namespace {

using moe_detail::cp_async_16;
using moe_detail::cp_async_commit;
using moe_detail::cp_async_wait;
using moe_detail::f32_to_bf16_bits;
using moe_detail::mma_bf16_16816;
using moe_detail::silu;

constexpr int kWRows = 128;   // weight rows per block (gated: 64 gate + 64 up)
constexpr int kTRows = 64;    // token rows per block tile
constexpr int kK = 64;        // k per pipeline stage
constexpr int kStages = 3;
constexpr int kLd = kK + 8;   // smem row pitch in bf16: 144 B keeps ldmatrix rows conflict-free
constexpr int kThreads = 128;  // 4 warps: 2 along weight rows x 2 along tokens
constexpr int kStageElems = (kWRows + kTRows) * kLd;
static_assert(kStages * kStageElems * 2 == kMoeBf16SmemBytes, "declared smem must match");

struct Bf16GemmArgs {
  const uint16_t* w = nullptr;  // [E, n_w, k] bf16
  const uint16_t* x = nullptr;  // [.., k] bf16
  void* out = nullptr;          // [total_rows, n_out]
  MoeRows rows;
  int n_out = 0;  // output columns: I (gated) or H
  int n_w = 0;    // weight rows per expert: 2I (gated) or H
  int k = 0;
  bool use_gather = false;
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const uint16_t* smem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// First smem weight row of m16 tile t (0..3) of warp column wn. Gated: tiles 0,1 are gate rows and
// tiles 2,3 the up rows of the same outputs, so acc[t] and acc[t + 2] pair up in the epilogue.
template <bool GATED>
__device__ __forceinline__ int weight_tile_row(int t, int wn) {
  if constexpr (GATED) return (t / 2) * (kWRows / 2) + wn * 32 + (t % 2) * 16;
  return wn * 64 + t * 16;
}

template <bool GATED, bool OUT_F32>
__global__ void __launch_bounds__(kThreads, 2) bf16_moe_kernel(Bf16GemmArgs a) {
  extern __shared__ __align__(16) uint16_t smem[];  // [kStages][(kWRows + kTRows) * kLd]
  const int e = a.rows.expert_ids ? a.rows.expert_ids[blockIdx.y] : int(blockIdx.y);
  if (e < 0) return;
  const int count = a.rows.row_count[e];
  if (int(blockIdx.z) * kTRows >= count) return;
  const int start = a.rows.row_start[e];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wn = warp % 2, wt = warp / 2;
  const int g = lane / 4, tq = lane % 4;
  const int n0 = blockIdx.x * (GATED ? kWRows / 2 : kWRows);  // first output column
  const int ktiles = (a.k + kK - 1) / kK;

  // Each thread copies 16-byte chunk column kc of smem rows r0 + 16q.
  const int kc = tid % 8, r0 = tid / 8;
  const uint16_t* w_expert = a.w + size_t(e) * a.n_w * a.k;
  const uint16_t* w_row[kWRows / 16];
  bool w_ok[kWRows / 16];
#pragma unroll
  for (int q = 0; q < kWRows / 16; ++q) {
    const int j = r0 + 16 * q;
    int row, col;
    if constexpr (GATED) {
      col = n0 + j % (kWRows / 2);
      row = j < kWRows / 2 ? col : a.n_out + col;
    } else {
      col = n0 + j;
      row = col;
    }
    w_ok[q] = col < a.n_out;
    w_row[q] = w_expert + size_t(w_ok[q] ? row : 0) * a.k;
  }

  for (int mt = blockIdx.z; mt * kTRows < count; mt += gridDim.z) {
    const int m0 = mt * kTRows;
    const uint16_t* x_row[kTRows / 16];
    bool x_ok[kTRows / 16];
#pragma unroll
    for (int q = 0; q < kTRows / 16; ++q) {
      const int i = m0 + r0 + 16 * q;
      x_ok[q] = i < count;
      const int dst = start + (x_ok[q] ? i : 0);
      const int src = a.use_gather ? a.rows.gather[dst] : dst;
      x_row[q] = a.x + size_t(src) * a.k;
    }
    auto load_stage = [&](int kt, int stage) {
      const int k = kt * kK + kc * 8;
      const bool k_ok = k < a.k;  // k % 8 == 0: a chunk is all in or all out
      const int koff = k_ok ? k : 0;
      uint16_t* sa = smem + stage * kStageElems;
      uint16_t* sb = sa + kWRows * kLd;
#pragma unroll
      for (int q = 0; q < kWRows / 16; ++q)
        cp_async_16(sa + (r0 + 16 * q) * kLd + kc * 8, w_row[q] + koff, w_ok[q] && k_ok ? 16 : 0);
#pragma unroll
      for (int q = 0; q < kTRows / 16; ++q)
        cp_async_16(sb + (r0 + 16 * q) * kLd + kc * 8, x_row[q] + koff, x_ok[q] && k_ok ? 16 : 0);
    };

    float acc[4][4][4];  // [weight m16 tile][token n8 tile][mma C register]
#pragma unroll
    for (int t = 0; t < 4; ++t)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[t][j][r] = 0.0f;

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < ktiles) load_stage(s, s);
      cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      const int next = kt + kStages - 1;
      if (next < ktiles) load_stage(next, next % kStages);
      cp_async_commit();

      const uint16_t* sa = smem + (kt % kStages) * kStageElems;
      const uint16_t* sb = sa + kWRows * kLd;
#pragma unroll
      for (int ks = 0; ks < kK / 16; ++ks) {
        uint32_t A[4][4];
#pragma unroll
        for (int t = 0; t < 4; ++t)
          ldmatrix_x4(A[t], sa + (weight_tile_row<GATED>(t, wn) + lane % 16) * kLd + ks * 16 +
                                (lane / 16) * 8);
        uint32_t B[4][2];
#pragma unroll
        for (int jp = 0; jp < 2; ++jp) {
          uint32_t r[4];
          const int tok = wt * 32 + jp * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(r, sb + tok * kLd + ks * 16 + ((lane >> 3) & 1) * 8);
          B[2 * jp][0] = r[0];
          B[2 * jp][1] = r[1];
          B[2 * jp + 1][0] = r[2];
          B[2 * jp + 1][1] = r[3];
        }
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_bf16_16816(acc[t][j], A[t], B[j][0], B[j][1]);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the next token tile refills these stages

    // C register r of tile (t, j): weight row g (+8 for r >= 2), token 2*tq + (r & 1).
    if constexpr (GATED) {
      uint16_t* out = static_cast<uint16_t*>(a.out);
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int n = n0 + wn * 32 + t * 16 + g + (r >= 2 ? 8 : 0);
            const int tok = m0 + wt * 32 + j * 8 + 2 * tq + (r & 1);
            if (n < a.n_out && tok < count)
              out[size_t(start + tok) * a.n_out + n] =
                  f32_to_bf16_bits(silu(acc[t][j][r]) * acc[t + 2][j][r]);
          }
    } else {
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const int n = n0 + wn * 64 + t * 16 + g + (r >= 2 ? 8 : 0);
            const int tok = m0 + wt * 32 + j * 8 + 2 * tq + (r & 1);
            if (n < a.n_out && tok < count) {
              const size_t o = size_t(start + tok) * a.n_out + n;
              if constexpr (OUT_F32)
                static_cast<float*>(a.out)[o] = acc[t][j][r];
              else
                static_cast<uint16_t*>(a.out)[o] = f32_to_bf16_bits(acc[t][j][r]);
            }
          }
    }
  }
}

int slots_of(const MoeGemmProblem& p, const MoeRows& rows) {
  return rows.expert_ids && p.num_slots > 0 ? p.num_slots : p.num_experts;
}

template <bool GATED, bool OUT_F32>
cudaError_t launch(const MoeGemmProblem& p, const Bf16GemmArgs& a, cudaStream_t stream) {
  const cudaError_t attr = ensure_max_dynamic_smem<bf16_moe_kernel<GATED, OUT_F32>>(int(kMoeBf16SmemBytes));
  if (attr != cudaSuccess) return attr;
  const int slots = slots_of(p, a.rows);
  const int hint = p.max_rows_hint > 0 ? p.max_rows_hint : (p.total_rows + slots - 1) / slots;
  // Token tiles per expert in parallel; experts with more rows loop over grid.z.
  const int z = std::clamp((hint + kTRows - 1) / kTRows, 1, 64);
  const int cols_per_block = GATED ? kWRows / 2 : kWRows;
  const dim3 grid{unsigned((a.n_out + cols_per_block - 1) / cols_per_block), unsigned(slots),
                  unsigned(z)};
  bf16_moe_kernel<GATED, OUT_F32><<<grid, kThreads, kMoeBf16SmemBytes, stream>>>(a);
  return cudaGetLastError();
}

bool args_ok(const MoeGemmProblem& p, const MoeRows& rows, const void* w, const void* in,
             const void* out) {
  return moe_bf16_unsupported_reason(p).empty() && rows.row_start && rows.row_count && w && in &&
         out;
}

}  // namespace

std::string moe_bf16_unsupported_reason(const MoeGemmProblem& p) {
  if (p.num_experts <= 0) return str("num_experts must be positive, got ", p.num_experts);
  if (p.hidden <= 0 || p.hidden % 8 != 0)
    return str("hidden size ", p.hidden, " is not a positive multiple of 8 (16-byte bf16 rows)");
  if (p.inter <= 0 || p.inter % 8 != 0)
    return str("intermediate size ", p.inter,
               " is not a positive multiple of 8 (16-byte bf16 rows)");
  if (p.total_rows < 0) return str("total_rows must be >= 0, got ", p.total_rows);
  if (p.num_slots < 0 || p.num_slots > 65535)
    return str("num_slots must be in [0, 65535], got ", p.num_slots);
  if (p.num_slots == 0 && p.num_experts > 65535)
    return str("num_experts must be <= 65535, got ", p.num_experts);
  return "";
}

cudaError_t moe_bf16_gemm1(const MoeGemmProblem& p, const MoeBf16WeightsDevice& w,
                           const MoeRows& rows, const uint16_t* x, uint16_t* act,
                           cudaStream_t stream) {
  if (!args_ok(p, rows, w.w13, x, act)) return cudaErrorInvalidValue;
  if (p.total_rows == 0) return cudaSuccess;
  Bf16GemmArgs a;
  a.w = w.w13;
  a.x = x;
  a.out = act;
  a.rows = rows;
  a.n_out = p.inter;
  a.n_w = 2 * p.inter;
  a.k = p.hidden;
  a.use_gather = rows.gather != nullptr;
  return launch<true, false>(p, a, stream);
}

cudaError_t moe_bf16_gemm2(const MoeGemmProblem& p, const MoeBf16WeightsDevice& w,
                           const MoeRows& rows, const uint16_t* act, void* y, bool y_f32,
                           cudaStream_t stream) {
  if (!args_ok(p, rows, w.w2, act, y)) return cudaErrorInvalidValue;
  if (p.total_rows == 0) return cudaSuccess;
  Bf16GemmArgs a;
  a.w = w.w2;
  a.x = act;
  a.out = y;
  a.rows = rows;
  a.rows.gather = nullptr;  // GEMM2 reads act rows in place
  a.n_out = p.hidden;
  a.n_w = p.hidden;
  a.k = p.inter;
  a.use_gather = false;
  return y_f32 ? launch<false, true>(p, a, stream) : launch<false, false>(p, a, stream);
}

}  // namespace tetra
