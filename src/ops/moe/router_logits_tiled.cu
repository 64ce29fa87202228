// Router logits for many tokens. A block computes a tile of tokens x experts: k runs in slices of
// 256 values (32 pieces of 8, lane l owns piece l), and every slice of the tile's x rows and gate
// rows is copied to shared memory (cp.async, up to kStages - 1 slices in flight) by the whole
// block, so x and the gate weights come from L2 once per block rather than once per warp. Each
// warp then runs its warp tile from shared memory. Each shape keeps as many slices in flight as
// fit 96 KB (two blocks per SM); deeper rings for the small tiles measured no faster (session 26),
// what bounds a block is its instructions.
// Every dot product keeps router_dot's order exactly (lane l owns the 8-element blocks
// b % 32 == l, FMAs in ascending k, then the xor butterfly 16, 8, 4, 2, 1), so the logits stay
// bit-identical to router_logits_cpu.
#include "ops/moe/router_logits_tiled.h"

#include <algorithm>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/kernel_smem_attr.h"
#include "ops/moe/moe_kernel_smem.h"
#include "ops/moe/router_dot.cuh"
#include "ops/moe/w4a16_fragment.cuh"

namespace tetra::moe::cuda {

namespace {

using moe_detail::cp_async_16;
using moe_detail::cp_async_commit;
using moe_detail::cp_async_wait;

constexpr int kWarpsT = 2, kWarpsE = 4;  // warps per block along tokens x experts
constexpr int kThreads = kWarpsT * kWarpsE * 32;

template <typename X, int kTT, int kTE, int kStages>
struct Tile {
  static constexpr int kBT = kWarpsT * kTT, kBE = kWarpsE * kTE;  // block tile
  static constexpr int kXChunks = int(sizeof(X)) / 2;  // 16-byte chunks per 8 x values
  // One stage: x pieces [kBT][32][kXChunks * 16 B], then gate pieces [kBE][32][16 B].
  static constexpr int kStageChunks = 32 * (kBT * kXChunks + kBE);
  static constexpr int kSmemBytes = kStages * kStageChunks * 16;
  static_assert(kSmemBytes == moe_smem::router_tiled(int(sizeof(X)), kTT, kTE, kStages),
                "moe_kernel_smem.h quotes this layout");
};

// grid (ceil(E / kBE), ceil(T / kBT)). x [T, H], w [E, H] bf16, logits [T, E]; H % 8 == 0.
template <typename X, int kTT, int kTE, int kStages>
__global__ void __launch_bounds__(kThreads)
    router_logits_tiled_kernel(const X* __restrict__ x, const uint16_t* __restrict__ w, int T,
                               int H, int E, float* __restrict__ logits) {
  using L = Tile<X, kTT, kTE, kStages>;
  extern __shared__ __align__(16) uint4 smem[];  // [kStages][kStageChunks]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t0 = blockIdx.y * L::kBT, e0 = blockIdx.x * L::kBE;
  const int pieces = H / 8;                             // 8-value blocks along k
  const int slices = (pieces + 31) / 32;

  // This thread's 16-byte chunks of every stage, resolved once: chunk i is c = threadIdx.x +
  // i * kThreads of the stage, copied from src[i] + s * stride[i] at slice s; in_slice[i] is its
  // 8-value piece within the slice. Rows past T or E re-read the last row (their sums are
  // dropped); pieces past H are zero-filled and never multiplied.
  constexpr int kRowChunks = 32 * L::kXChunks;  // chunks of one x row's slice
  constexpr int kChunks = (L::kStageChunks + kThreads - 1) / kThreads;
  const char* src[kChunks];
  int stride[kChunks], in_slice[kChunks];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = min(int(threadIdx.x) + i * kThreads, L::kStageChunks - 1);
    if (c < L::kBT * kRowChunks) {
      const int row = c / kRowChunks, in_row = c % kRowChunks;
      in_slice[i] = in_row / L::kXChunks;
      src[i] = reinterpret_cast<const char*>(x + size_t(min(t0 + row, T - 1)) * H) +
               in_row * 16;
      stride[i] = 256 * int(sizeof(X));
    } else {
      const int row = (c - L::kBT * kRowChunks) / 32;
      in_slice[i] = c % 32;
      src[i] = reinterpret_cast<const char*>(w + size_t(min(e0 + row, E - 1)) * H) +
               in_slice[i] * 16;
      stride[i] = 512;
    }
  }
  // Copies slice s into stage slot s % kStages.
  auto stage = [&](int s) {
    uint4* dst = smem + (s % kStages) * L::kStageChunks + threadIdx.x;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      if (threadIdx.x + i * kThreads >= L::kStageChunks) break;
      const bool valid = s * 32 + in_slice[i] < pieces;
      cp_async_16(dst + i * kThreads, valid ? src[i] + size_t(s) * stride[i] : src[i],
                  valid ? 16 : 0);
    }
  };

  const int wt = warp / kWarpsE, we = warp % kWarpsE;  // this warp's tile in the block
  float acc[kTT][kTE];
#pragma unroll
  for (int a = 0; a < kTT; ++a)
#pragma unroll
    for (int j = 0; j < kTE; ++j) acc[a][j] = 0.0f;

  for (int s = 0; s < kStages - 1; ++s) {
    if (s < slices) stage(s);
    cp_async_commit();
  }
  for (int s = 0; s < slices; ++s) {
    cp_async_wait<kStages - 2>();  // this thread's copies of slice s have landed
    __syncthreads();               // everyone's have, and slot (s - 1) % kStages is free
    if (s + kStages - 1 < slices) stage(s + kStages - 1);
    cp_async_commit();
    if (s * 32 + lane >= pieces) continue;  // this lane has no piece in the last slice
    const uint4* slot = smem + (s % kStages) * L::kStageChunks;
    float xv[kTT][8];
#pragma unroll
    for (int a = 0; a < kTT; ++a) {
      const int row = wt * kTT + a;
      detail::router_load8(reinterpret_cast<const X*>(slot + (row * 32 + lane) * L::kXChunks),
                           xv[a]);
    }
#pragma unroll
    for (int j = 0; j < kTE; ++j) {
      const int row = we * kTE + j;
      float wv[8];
      detail::router_load8(
          reinterpret_cast<const uint16_t*>(slot + L::kBT * 32 * L::kXChunks + row * 32 + lane), wv);
#pragma unroll
      for (int a = 0; a < kTT; ++a)
#pragma unroll
        for (int q = 0; q < 8; ++q) acc[a][j] = fmaf(xv[a][q], wv[q], acc[a][j]);
    }
  }
  cp_async_wait<0>();  // no copy may outlive the block (the trailing groups are empty)

  // Butterfly every sum; lane a * kTE + j then stores logit (t, e) of the warp tile.
  float mine = 0.0f;
#pragma unroll
  for (int a = 0; a < kTT; ++a)
#pragma unroll
    for (int j = 0; j < kTE; ++j) {
      float v = acc[a][j];
      for (int off = 16; off >= 1; off /= 2) v = v + __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == a * kTE + j) mine = v;
    }
  const int t = t0 + wt * kTT + lane / kTE, e = e0 + we * kTE + lane % kTE;
  if (lane < kTT * kTE && t < T && e < E) logits[size_t(t) * E + e] = mine;
}

template <typename X, int kTT, int kTE, int kStages>
cudaError_t launch_shape(const X* x, const uint16_t* w, int T, int H, int E, float* logits,
                         cudaStream_t stream) {
  static_assert(kTT * kTE <= 32, "one lane stores each logit of the warp tile");
  using L = Tile<X, kTT, kTE, kStages>;
  static_assert(L::kSmemBytes <= 96 * 1024, "two blocks per SM");
  constexpr auto kernel = router_logits_tiled_kernel<X, kTT, kTE, kStages>;
  const cudaError_t attr = ensure_max_dynamic_smem<kernel>(L::kSmemBytes);
  if (attr != cudaSuccess) return attr;
  // Expert groups vary fastest, so the few blocks that read one token tile run together and x
  // comes from HBM once.
  const int expert_groups = (E + L::kBE - 1) / L::kBE;
  constexpr int kMaxTokens = 65535 * L::kBT;  // grid.y limit: longer batches go in pieces
  for (int t = 0; t < T; t += kMaxTokens) {
    const int n = std::min(kMaxTokens, T - t);
    const dim3 grid(unsigned(expert_groups), unsigned((n + L::kBT - 1) / L::kBT));
    kernel<<<grid, kThreads, L::kSmemBytes, stream>>>(x + size_t(t) * H, w, n, H, E,
                                                       logits + size_t(t) * E);
  }
  return cudaGetLastError();
}

template <typename X>
cudaError_t launch(const X* x, const uint16_t* w, int T, int H, int E, float* logits,
                   cudaStream_t stream, int shape) {
  static_assert(kRouterTileShapes[0].warp_tokens == 2 && kRouterTileShapes[0].warp_experts == 2 &&
                kRouterTileShapes[1].warp_tokens == 2 && kRouterTileShapes[1].warp_experts == 4 &&
                kRouterTileShapes[2].warp_tokens == 4 && kRouterTileShapes[2].warp_experts == 4 &&
                kRouterTileShapes[3].warp_tokens == 4 && kRouterTileShapes[3].warp_experts == 8,
                "the list below follows kRouterTileShapes");
  switch (shape) {
    case 0: return launch_shape<X, 2, 2, 12>(x, w, T, H, E, logits, stream);
    case 1: return launch_shape<X, 2, 4, 8>(x, w, T, H, E, logits, stream);
    case 2: return launch_shape<X, 4, 4, 6>(x, w, T, H, E, logits, stream);
    case 3: return launch_shape<X, 4, 8, 4>(x, w, T, H, E, logits, stream);
  }
  TETRA_FAIL("cuda router_logits_tiled: no tile shape ", shape);
}

}  // namespace

int router_tile_for(int T, int E, int sms) {
  for (int i = kRouterTileShapeCount - 1; i > 0; --i) {
    const RouterTileShape s = kRouterTileShapes[i];
    const long blocks = long((E + s.block_experts() - 1) / s.block_experts()) *
                        ((T + s.block_tokens() - 1) / s.block_tokens());
    if (3 * blocks >= 2 * long(sms)) return i;
  }
  return 0;
}

std::string router_logits_tiled_unsupported_reason(const void* x, const uint16_t* w_gate, int H) {
  if (H < 8 || H % 8 != 0) return str("hidden size ", H, " is not a multiple of 8");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(w_gate) % 16 != 0)
    return "x or the gate weight is not 16-byte aligned";
  return "";
}

cudaError_t router_logits_tiled(const void* x, DType x_dtype, const uint16_t* w_gate_bf16, int T,
                                int H, int E, float* logits, cudaStream_t stream, int shape) {
  if (T < 0 || H < 1 || E < 1)
    TETRA_FAIL("cuda router_logits_tiled: bad sizes T=", T, " H=", H, " E=", E);
  const std::string why = router_logits_tiled_unsupported_reason(x, w_gate_bf16, H);
  if (!why.empty()) TETRA_FAIL("cuda router_logits_tiled: ", why);
  if (shape < -1 || shape >= kRouterTileShapeCount)
    TETRA_FAIL("cuda router_logits_tiled: no tile shape ", shape);
  if (T == 0) return cudaSuccess;
  if (shape < 0) shape = router_tile_for(T, E, current_device_sm_count());
  if (x_dtype == DType::BF16)
    return launch(static_cast<const uint16_t*>(x), w_gate_bf16, T, H, E, logits, stream, shape);
  if (x_dtype == DType::F32)
    return launch(static_cast<const float*>(x), w_gate_bf16, T, H, E, logits, stream, shape);
  TETRA_FAIL("cuda router_logits_tiled: activations must be BF16 or F32, got ",
             dtype_name(x_dtype));
}

}  // namespace tetra::moe::cuda
