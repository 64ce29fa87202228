// Large-M W4A16 MoE kernel: a block computes 128 weight rows x 128 rows (tokens) of one expert.
//
// Weights (fragment order), their scales and the activation tile go through a 4-stage cp.async
// pipeline in shared memory; 8 warps as 4 (weight rows) x 2 (tokens), each 32 weight rows x 64
// tokens, so every dequantized A fragment feeds 8 MMAs. Tiles of a grid column (blockIdx.y) are
// found in-kernel by a block scan over the experts' row counts (no host sync, graph-capturable);
// grid.x walks the weight-row blocks so blocks sharing one token tile run together and the
// activation tile is read from HBM once.
#include <cuda_runtime.h>

#include "core/kernel_smem_attr.h"
#include "ops/moe/moe_kernel_smem.h"
#include "ops/moe/w4a16_fragment.cuh"
#include "ops/moe/w4a16_grid_rows.cuh"
#include "ops/moe/w4a16_launch.h"

namespace tetra::moe_detail {
namespace {

constexpr int kThreads = 256;
constexpr int kTilesM = 8;       // 16-row weight tiles per block (128 rows)
constexpr int kRowsN = 128;      // tokens per block
constexpr int kStages = 4;
constexpr int kXStride = 144;    // bytes per token row in shared memory: 128 + 16 pad (no conflicts)
constexpr int kWBytes = kTilesM * kTileChunkBytes;   // 4096
constexpr int kSBytes = kTilesM * kTileChunkScales;  // 512
constexpr int kXBytes = kRowsN * kXStride;           // 18432
constexpr int kStageBytes = kWBytes + kSBytes + kXBytes;
constexpr int kSmemBytes = kStages * kStageBytes;
static_assert(kSmemBytes == moe_smem::kTiled, "moe_kernel_smem.h quotes this layout");
static_assert(kThreads == kTilesM * 32, "one weight cp.async per thread per stage");
static_assert(kRowsN * 8 == 4 * kThreads, "four activation cp.async per thread per stage");

template <bool GATED, bool OUT_F32, int MIN_BLOCKS>
__global__ void __launch_bounds__(kThreads, MIN_BLOCKS) moe_tiled_kernel(const GroupedGemmArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];  // [kStages][W | S | X]
  using Tile = GridRowTile<kThreads>;
  __shared__ typename Tile::Shared tile_s;

  const int tid = threadIdx.x;
  Tile::find<kRowsN>(a, int(blockIdx.y), tile_s);
  const int e = tile_s.expert;
  if (e < 0) return;
  const int tok0 = tile_s.tok0;
  const int cnt = a.rows.row_count[e];
  const int start = a.rows.row_start[e];

  const int chunks = a.k / kChunkK;
  const int tiles_total = a.n / 16;
  const int tile0 = int(blockIdx.x) * kTilesM;
  const uint8_t* wbase = a.w + size_t(e) * tiles_total * chunks * kTileChunkBytes;
  const uint8_t* sbase = a.s + size_t(e) * tiles_total * chunks * kTileChunkScales;

  // ---- this thread's copy sources
  const int my_tile = tile0 + tid / 32;  // weight copy: one 16 B lane piece of one tile
  const bool w_ok = my_tile < tiles_total;
  const uint8_t* wsrc = wbase + size_t(w_ok ? my_tile : 0) * chunks * kTileChunkBytes + (tid % 32) * 16;
  const int s_tile = tile0 + tid / 4;  // scale copy (tid < 32): 16 B of one tile's 64
  const bool s_ok = tid < 32 && s_tile < tiles_total;
  const uint8_t* ssrc = sbase + size_t(s_ok ? s_tile : 0) * chunks * kTileChunkScales + (tid % 4) * 16;
  const uint16_t* xsrc[4];  // [4] token rows tid/8 + 32q, at element 8 * (tid % 8)
  int xbytes[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int token = tok0 + tid / 8 + 32 * q;
    const bool ok = token < cnt;
    const int r = start + (ok ? token : 0);
    const int src = a.rows.gather ? a.rows.gather[r] : r;
    xsrc[q] = a.x + size_t(src) * a.k + 8 * (tid % 8);
    xbytes[q] = ok ? 16 : 0;
  }

  auto load_stage = [&](int stage, int c) {
    uint8_t* st = smem + stage * kStageBytes;
    if (w_ok) cp_async_16(st + tid * 16, wsrc + size_t(c) * kTileChunkBytes, 16);
    if (s_ok) cp_async_16(st + kWBytes + tid * 16, ssrc + size_t(c) * kTileChunkScales, 16);
#pragma unroll
    for (int q = 0; q < 4; ++q)
      cp_async_16(st + kWBytes + kSBytes + (tid / 8 + 32 * q) * kXStride + (tid % 8) * 16,
                  xsrc[q] + size_t(c) * kChunkK, xbytes[q]);
  };

  const int warp = tid / 32, lane = tid % 32;
  const int wm = warp % 4, wn = warp / 4;
  const bool warp_rows_ok = tile0 + 2 * wm < tiles_total;  // n % 32 == 0: both tiles or none
  const int tok_warp = tok0 + 64 * wn;
  const int n8_valid = min(8, max(0, (cnt - tok_warp + 7) / 8));  // n8 tiles with a real token
  const bool warp_ok = warp_rows_ok && n8_valid > 0;

  float acc[2][8][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mt][nt][r] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < chunks) load_stage(s, s);
    cp_async_commit();
  }

  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = c + kStages - 1;
    if (next < chunks) load_stage(next % kStages, next);
    cp_async_commit();

    if (warp_ok) {
      const uint8_t* st = smem + (c % kStages) * kStageBytes;
      uint4 wa[2];
      uint32_t sg[2], sg8[2];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        wa[mt] = *reinterpret_cast<const uint4*>(st + (2 * wm + mt) * kTileChunkBytes + lane * 16);
        const uint32_t sv =
            *reinterpret_cast<const uint16_t*>(st + kWBytes + (2 * wm + mt) * kTileChunkScales + lane * 2);
        scale_pair_to_bf16x2(sv, sg[mt], sg8[mt]);
      }
      const uint8_t* xs = st + kWBytes + kSBytes + (64 * wn + lane / 4) * kXStride + (lane % 4) * 32;
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // halves of the lane's 32 bytes: k-steps 2h, 2h+1
        uint4 bx[8];  // [n8 tile]: token row 64wn + 8nt + g, k 16t+8h .. +7
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          bx[nt] = *reinterpret_cast<const uint4*>(xs + nt * 8 * kXStride + 16 * h);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int j = 2 * h + jj;
          uint32_t A[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            dequant_word(word_of(wa[mt], j), sg[mt], sg8[mt], A[mt]);
          }
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) {
            if (nt < n8_valid) {
              const uint32_t b0 = jj ? bx[nt].z : bx[nt].x;
              const uint32_t b1 = jj ? bx[nt].w : bx[nt].y;
              mma_bf16_16816(acc[0][nt], A[0], b0, b1);
              mma_bf16_16816(acc[1][nt], A[1], b0, b1);
            }
          }
        }
      }
    }
  }
  cp_async_wait<0>();

  if (!warp_ok) return;
  const int g = lane / 4, t = lane % 4;
  if constexpr (GATED) {
    const float ag = a.alpha0[e], au = a.alpha1[e];
    const int out_ld = a.n / 2;
    uint16_t* out = static_cast<uint16_t*>(a.out);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int token = tok_warp + 8 * nt + 2 * t + (r & 1);
        if (token < cnt) {
          const int n = (tile0 / 2 + wm) * 16 + g + (r >= 2 ? 8 : 0);
          out[size_t(start + token) * out_ld + n] =
              f32_to_bf16_bits(silu(acc[0][nt][r] * ag) * (acc[1][nt][r] * au));
        }
      }
  } else {
    const float ad = a.alpha0[e];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int token = tok_warp + 8 * nt + 2 * t + (r & 1);
          if (token < cnt) {
            const int n = (tile0 + 2 * wm + mt) * 16 + g + (r >= 2 ? 8 : 0);
            const size_t o = size_t(start + token) * a.n + n;
            if constexpr (OUT_F32)
              static_cast<float*>(a.out)[o] = acc[mt][nt][r] * ad;
            else
              static_cast<uint16_t*>(a.out)[o] = f32_to_bf16_bits(acc[mt][nt][r] * ad);
          }
        }
  }
}

template <bool GATED, bool OUT_F32, int MIN_BLOCKS>
cudaError_t launch_tiled_t(const GroupedGemmArgs& a, cudaStream_t stream) {
  const cudaError_t attr =
      ensure_max_dynamic_smem<moe_tiled_kernel<GATED, OUT_F32, MIN_BLOCKS>>(int(kSmemBytes));
  if (attr != cudaSuccess) return attr;
  const int col_blocks = (a.n + kTilesM * 16 - 1) / (kTilesM * 16);
  const int row_blocks = (a.total_rows + kRowsN - 1) / kRowsN + a.num_slots;  // upper bound
  const dim3 grid{unsigned(col_blocks), unsigned(row_blocks), 1u};
  moe_tiled_kernel<GATED, OUT_F32, MIN_BLOCKS><<<grid, kThreads, kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_tiled(const GroupedGemmArgs& a, int blocks_per_sm, cudaStream_t stream) {
  if (a.num_slots <= 0 || a.n <= 0 || a.total_rows <= 0) return cudaSuccess;
  if (blocks_per_sm == 2) {
    if (a.gated) return launch_tiled_t<true, false, 2>(a, stream);
    if (a.out_f32) return launch_tiled_t<false, true, 2>(a, stream);
    return launch_tiled_t<false, false, 2>(a, stream);
  }
  if (a.gated) return launch_tiled_t<true, false, 1>(a, stream);
  if (a.out_f32) return launch_tiled_t<false, true, 1>(a, stream);
  return launch_tiled_t<false, false, 1>(a, stream);
}

}  // namespace tetra::moe_detail
