// Decode W4A16 MoE kernel, bulk-copy variant: each warp's whole weight slice is requested at once
// with cp.async.bulk (the copy engine, completion on an mbarrier), so a block has all of its
// weights (2 tiles x K: 110 KB for K = 6144) in flight from its first cycle, far more than the
// register-staged kernel can hold. Pieces of 4 chunks complete on their own mbarrier, so the MMAs
// start on the first piece while the rest still streams. Activations (a few rows) come through
// L1/L2 into registers one piece ahead. The weights stay in shared memory, so a block with more
// than 8 rows reuses them for every 8-row pass instead of reading HBM again.
#include <cuda_runtime.h>

#include "ops/moe/w4a16_fragment.cuh"
#include "ops/moe/w4a16_launch.h"

namespace tetra::moe_detail {
namespace {

constexpr int kPieceChunks = 4;  // chunks per mbarrier
constexpr int kMaxPieces = 8;    // per warp: k <= 64 * 4 * 8 * k_warps
constexpr int kChunkSmem = 2 * (kTileChunkBytes + kTileChunkScales);  // 2 tiles: 1152 B per chunk

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@!P1 bra WAIT_LOOP;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

template <int KW, bool GATED, bool OUT_F32>
__global__ void __launch_bounds__(KW * 32, 16 / KW) moe_decode_bulk_kernel(const GroupedGemmArgs a, int cpw_max) {
  extern __shared__ __align__(128) uint8_t smem[];  // [KW][w tile0 | w tile1 | s tile0 | s tile1]
  __shared__ __align__(8) uint64_t bars[KW][kMaxPieces];
  __shared__ float red[KW][2][4][32];  // per-warp partial sums, lane fastest

  const int slot = blockIdx.y;
  const int e = a.rows.expert_ids ? a.rows.expert_ids[slot] : slot;
  if (e < 0) return;
  const int cnt = a.rows.row_count[e];
  if (cnt <= 0) return;
  const int start = a.rows.row_start[e];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = a.k / kChunkK;
  const int c_begin = warp * chunks / KW, c_end = (warp + 1) * chunks / KW;
  const int n_chunks = c_end - c_begin;
  const int pieces = (n_chunks + kPieceChunks - 1) / kPieceChunks;
  const size_t tiles = size_t(a.n) / 16;
  const size_t tile0 = 2 * size_t(blockIdx.x);

  uint8_t* my = smem + size_t(warp) * cpw_max * kChunkSmem;
  uint8_t* sw0 = my;                                    // [cpw_max][32][16] tile 0 weights
  uint8_t* sw1 = my + size_t(cpw_max) * kTileChunkBytes;  // tile 1 weights
  uint8_t* ss0 = my + size_t(cpw_max) * 2 * kTileChunkBytes;  // [cpw_max][32][2] tile 0 scales
  uint8_t* ss1 = ss0 + size_t(cpw_max) * kTileChunkScales;

  if (lane == 0) {
    for (int p = 0; p < pieces; ++p) mbar_init(&bars[warp][p], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const uint8_t* gw0 = a.w + ((size_t(e) * tiles + tile0) * chunks + c_begin) * kTileChunkBytes;
    const uint8_t* gw1 = gw0 + size_t(chunks) * kTileChunkBytes;
    const uint8_t* gs0 = a.s + ((size_t(e) * tiles + tile0) * chunks + c_begin) * kTileChunkScales;
    const uint8_t* gs1 = gs0 + size_t(chunks) * kTileChunkScales;
    for (int p = 0; p < pieces; ++p) {
      const int c0 = p * kPieceChunks;
      const int nc = min(kPieceChunks, n_chunks - c0);
      mbar_expect_tx(&bars[warp][p], uint32_t(nc * kChunkSmem));
      bulk_g2s(sw0 + c0 * kTileChunkBytes, gw0 + size_t(c0) * kTileChunkBytes, nc * kTileChunkBytes, &bars[warp][p]);
      bulk_g2s(sw1 + c0 * kTileChunkBytes, gw1 + size_t(c0) * kTileChunkBytes, nc * kTileChunkBytes, &bars[warp][p]);
      bulk_g2s(ss0 + c0 * kTileChunkScales, gs0 + size_t(c0) * kTileChunkScales, nc * kTileChunkScales, &bars[warp][p]);
      bulk_g2s(ss1 + c0 * kTileChunkScales, gs1 + size_t(c0) * kTileChunkScales, nc * kTileChunkScales, &bars[warp][p]);
    }
  }
  __syncwarp();

  for (int tok0 = 0; tok0 < cnt; tok0 += 8) {
    const int token = tok0 + lane / 4;
    const int r = start + min(token, cnt - 1);  // past the count: any valid row, result dropped
    const int src = a.rows.gather ? a.rows.gather[r] : r;
    const uint16_t* xp = a.x + size_t(src) * a.k + size_t(c_begin) * kChunkK + 16 * (lane % 4);

    float acc[2][4] = {};
    uint4 xc[kPieceChunks][2], xn[kPieceChunks][2];
#pragma unroll
    for (int u = 0; u < kPieceChunks; ++u)
      if (u < n_chunks) {
        xc[u][0] = ld_cached_u4(xp + u * kChunkK);
        xc[u][1] = ld_cached_u4(xp + u * kChunkK + 8);
      }
    for (int p = 0; p < pieces; ++p) {
      const int c0 = p * kPieceChunks;
#pragma unroll
      for (int u = 0; u < kPieceChunks; ++u)
        if (c0 + kPieceChunks + u < n_chunks) {
          xn[u][0] = ld_cached_u4(xp + (c0 + kPieceChunks + u) * kChunkK);
          xn[u][1] = ld_cached_u4(xp + (c0 + kPieceChunks + u) * kChunkK + 8);
        }
      mbar_wait(&bars[warp][p], 0);
#pragma unroll
      for (int u = 0; u < kPieceChunks; ++u) {
        const int c = c0 + u;
        if (c < n_chunks) {
          uint4 wv[2];
          uint32_t sg[2], sg8[2];
          wv[0] = *reinterpret_cast<const uint4*>(sw0 + c * kTileChunkBytes + lane * 16);
          wv[1] = *reinterpret_cast<const uint4*>(sw1 + c * kTileChunkBytes + lane * 16);
          scale_pair_to_bf16x2(*reinterpret_cast<const uint16_t*>(ss0 + c * kTileChunkScales + lane * 2), sg[0], sg8[0]);
          scale_pair_to_bf16x2(*reinterpret_cast<const uint16_t*>(ss1 + c * kTileChunkScales + lane * 2), sg[1], sg8[1]);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint4& xh = xc[u][j >> 1];
            const uint32_t b0 = (j & 1) ? xh.z : xh.x;
            const uint32_t b1 = (j & 1) ? xh.w : xh.y;
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              const uint32_t w = j == 0 ? wv[mt].x : j == 1 ? wv[mt].y : j == 2 ? wv[mt].z : wv[mt].w;
              uint32_t A[4];
              dequant_word(w, sg[mt], sg8[mt], A);
              mma_bf16_16816(acc[mt], A, b0, b1);
            }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kPieceChunks; ++u) xc[u][0] = xn[u][0], xc[u][1] = xn[u][1];
    }

#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int q = 0; q < 4; ++q) red[warp][mt][q][lane] = acc[mt][q];
    __syncthreads();
    if constexpr (GATED) {
      const float ag = a.alpha0[e], au = a.alpha1[e];
      const int out_ld = a.n / 2;
      for (int idx = threadIdx.x; idx < 4 * 32; idx += KW * 32) {
        const int q = idx / 32, l = idx % 32;
        float gs = 0.0f, us = 0.0f;
#pragma unroll
        for (int w = 0; w < KW; ++w) gs += red[w][0][q][l], us += red[w][1][q][l];
        const int tk = tok0 + 2 * (l % 4) + (q & 1);
        if (tk < cnt) {
          const int n = blockIdx.x * 16 + l / 4 + (q >= 2 ? 8 : 0);
          static_cast<uint16_t*>(a.out)[size_t(start + tk) * out_ld + n] =
              f32_to_bf16_bits(silu(gs * ag) * (us * au));
        }
      }
    } else {
      const float ad = a.alpha0[e];
      for (int idx = threadIdx.x; idx < 2 * 4 * 32; idx += KW * 32) {
        const int mt = idx / 128, q = (idx / 32) % 4, l = idx % 32;
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < KW; ++w) s += red[w][mt][q][l];
        const int tk = tok0 + 2 * (l % 4) + (q & 1);
        if (tk < cnt) {
          const int n = blockIdx.x * 32 + mt * 16 + l / 4 + (q >= 2 ? 8 : 0);
          const size_t o = size_t(start + tk) * a.n + n;
          if constexpr (OUT_F32)
            static_cast<float*>(a.out)[o] = s * ad;
          else
            static_cast<uint16_t*>(a.out)[o] = f32_to_bf16_bits(s * ad);
        }
      }
    }
    __syncthreads();  // red is reused by the next pass
  }
}

template <int KW, bool GATED, bool OUT_F32>
cudaError_t launch_bulk_t(const GroupedGemmArgs& a, int cpw_max, size_t smem, cudaStream_t stream) {
  auto kernel = moe_decode_bulk_kernel<KW, GATED, OUT_F32>;
  static size_t smem_allowed = 0;  // per instantiation: raise the dynamic limit once per size
  if (smem > smem_allowed) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return err;
    smem_allowed = smem;
  }
  const dim3 grid{unsigned(a.n / 32), unsigned(a.num_slots), 1u};
  kernel<<<grid, KW * 32, smem, stream>>>(a, cpw_max);
  return cudaGetLastError();
}

template <int KW>
cudaError_t launch_bulk_kw(const GroupedGemmArgs& a, cudaStream_t stream) {
  const int chunks = a.k / kChunkK;
  const int cpw_max = (chunks + KW - 1) / KW;
  const size_t smem = size_t(KW) * cpw_max * kChunkSmem;
  if (cpw_max > kPieceChunks * kMaxPieces || smem > 200 * 1024) return cudaErrorInvalidValue;
  if (a.gated) return launch_bulk_t<KW, true, false>(a, cpw_max, smem, stream);
  if (a.out_f32) return launch_bulk_t<KW, false, true>(a, cpw_max, smem, stream);
  return launch_bulk_t<KW, false, false>(a, cpw_max, smem, stream);
}

}  // namespace

bool decode_bulk_supported(int k, int k_warps) {
  const int chunks = k / kChunkK;
  const int cpw_max = (chunks + k_warps - 1) / k_warps;
  return cpw_max <= kPieceChunks * kMaxPieces && size_t(k_warps) * cpw_max * kChunkSmem <= 200 * 1024;
}

cudaError_t launch_decode_bulk(const GroupedGemmArgs& a, int k_warps, cudaStream_t stream) {
  if (a.num_slots <= 0 || a.n <= 0) return cudaSuccess;
  switch (k_warps) {
    case 4: return launch_bulk_kw<4>(a, stream);
    case 8: return launch_bulk_kw<8>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace tetra::moe_detail
