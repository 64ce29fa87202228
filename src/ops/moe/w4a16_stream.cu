// MoE decode GEMMs on the weight-streaming kernel (w4a16_stream.cuh): work units are (slot,
// gate/up tile pair) for GEMM1 and (slot, 16-row tile) for GEMM2, the expert resolved from
// rows.expert_ids at run time (-1 or an empty expert: the unit is skipped). Opt-in
// (DecodeConfig::stream): on the H200 it lost to the late-activation decode kernel at every
// measured shape (bench/results/2026-11-30-stream-gemv-h200.md), so the heuristic keeps that one.
#include <cuda_runtime.h>

#include "ops/moe/w4a16_launch.h"
#include "ops/moe/w4a16_stream.cuh"

namespace tetra::moe_detail {

namespace {

template <bool GATED, bool OUT_F32>
struct MoeStreamWork {
  static constexpr int kTilesPerUnit = GATED ? 2 : 1;
  const uint8_t* w;       // [E][N/16][K/64][32][16]
  const uint8_t* s;       // [E][N/16][K/64][32][2]
  const float* alpha0;    // [E] gate or down
  const float* alpha1;    // [E] up (gated)
  const uint16_t* x;      // [.., K] bf16
  void* out;              // gated: bf16 [rows, N/2]; else [rows, N] f32 or bf16
  MoeRows rows;
  int n, k;               // packed rows, K
  int units_per_slot;     // N / 16 / kTilesPerUnit
  int total_units, chunks;

  struct Unit {
    const uint8_t* w;
    const uint8_t* s;
    int rows;   // rows of the expert (<= 0: skip)
    int e, start, j;  // expert, its first row, unit index inside the expert
  };
  __device__ Unit unit(int u) const {
    Unit un{nullptr, nullptr, 0, 0, 0, 0};
    const int slot = u / units_per_slot;
    const int e = rows.expert_ids ? rows.expert_ids[slot] : slot;
    if (e < 0) return un;
    un.rows = rows.row_count[e];
    if (un.rows <= 0) return un;
    un.e = e;
    un.start = rows.row_start[e];
    un.j = u % units_per_slot;
    const size_t tile = size_t(e) * (n / 16) + size_t(un.j) * kTilesPerUnit;
    un.w = w + tile * chunks * kTileChunkBytes;
    un.s = s + tile * chunks * kTileChunkScales;
    return un;
  }
  __device__ const uint16_t* x_row(const Unit& un, int row) const {
    const int r = un.start + row;
    return x + size_t(rows.gather ? rows.gather[r] : r) * k;
  }
  __device__ void store(const Unit& un, int row, int col, const float (&v)[kTilesPerUnit]) const {
    const size_t r = size_t(un.start + row);
    if constexpr (GATED) {
      const float g = v[0] * alpha0[un.e], up = v[kTilesPerUnit - 1] * alpha1[un.e];
      static_cast<uint16_t*>(out)[r * (n / 2) + un.j * 16 + col] = f32_to_bf16_bits(silu(g) * up);
    } else {
      const float y = v[0] * alpha0[un.e];
      const size_t o = r * n + un.j * 16 + col;
      if constexpr (OUT_F32)
        static_cast<float*>(out)[o] = y;
      else
        static_cast<uint16_t*>(out)[o] = f32_to_bf16_bits(y);
    }
  }
};

template <bool GATED, bool OUT_F32>
cudaError_t launch_work(const GroupedGemmArgs& a, const DecodeConfig& c, cudaStream_t stream) {
  MoeStreamWork<GATED, OUT_F32> w{};
  w.w = a.w;
  w.s = a.s;
  w.alpha0 = a.alpha0;
  w.alpha1 = a.alpha1;
  w.x = a.x;
  w.out = a.out;
  w.rows = a.rows;
  w.n = a.n;
  w.k = a.k;
  w.units_per_slot = a.n / 16 / (GATED ? 2 : 1);
  w.total_units = a.num_slots * w.units_per_slot;
  w.chunks = a.k / kChunkK;
  using W = decltype(w);
  const int st = c.stream_stages, b = c.stream_blocks_per_sm;
  switch (c.k_warps * 10 + c.stream_chunks_per_warp) {
    case 42: return launch_stream_work<W, 4, 2>(w, st, b, a.pdl, stream);
    case 82: return launch_stream_work<W, 8, 2>(w, st, b, a.pdl, stream);
    case 161: return launch_stream_work<W, 16, 1>(w, st, b, a.pdl, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_stream(const GroupedGemmArgs& a, const DecodeConfig& cfg, cudaStream_t stream) {
  if (a.num_slots <= 0 || a.n <= 0) return cudaSuccess;
  // Bulk copies need 16-byte aligned sources; the packed buffers are, but say so if not.
  if (reinterpret_cast<uintptr_t>(a.w) % 16 != 0 || reinterpret_cast<uintptr_t>(a.s) % 16 != 0 ||
      a.n % 32 != 0 || a.k % kChunkK != 0)
    return cudaErrorInvalidValue;
  if (a.gated) return launch_work<true, false>(a, cfg, stream);
  if (a.out_f32) return launch_work<false, true>(a, cfg, stream);
  return launch_work<false, false>(a, cfg, stream);
}

}  // namespace tetra::moe_detail
