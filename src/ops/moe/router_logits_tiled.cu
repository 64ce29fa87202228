// Router logits for many tokens: each warp computes a tile of kTok tokens x kExp experts, so a
// 16-byte load of x feeds kExp dot products and one of the gate weight feeds kTok, instead of
// each (token, expert) pair reading both rows again (router_logits.cu: one warp per pair, which
// at 4096 tokens of GLM-5 moves ~25 GB through L1/L2 for 3 MB of weights).
// Every dot product keeps router_dot's order exactly (lane l owns the 8-element blocks
// b % 32 == l, FMAs in ascending k, then the xor butterfly 16, 8, 4, 2, 1), so the logits stay
// bit-identical to router_logits_cpu.
#include "ops/moe/router_logits_tiled.h"

#include <algorithm>

#include "core/error.h"
#include "ops/moe/router_dot.cuh"

namespace tetra::moe::cuda {

namespace {

constexpr int kTok = 4;    // tokens per warp tile
constexpr int kExp = 8;    // experts per warp tile
constexpr int kWarps = 8;  // warps per block, side by side over experts

// grid (ceil(E / (kWarps * kExp)), ceil(T / kTok)). x [T, H], w [E, H] bf16, logits [T, E].
template <typename X>
__global__ void __launch_bounds__(kWarps * 32)
    router_logits_tiled_kernel(const X* __restrict__ x, const uint16_t* __restrict__ w, int T,
                               int H, int E, float* __restrict__ logits) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t0 = blockIdx.y * kTok;
  const int e0 = (blockIdx.x * kWarps + warp) * kExp;
  if (e0 >= E) return;
  const X* xr[kTok];          // rows past T re-read row T - 1; their sums are dropped
  const uint16_t* wr[kExp];   // rows past E re-read row E - 1
#pragma unroll
  for (int i = 0; i < kTok; ++i) xr[i] = x + size_t(min(t0 + i, T - 1)) * H;
#pragma unroll
  for (int j = 0; j < kExp; ++j) wr[j] = w + size_t(min(e0 + j, E - 1)) * H;

  float acc[kTok][kExp];
#pragma unroll
  for (int i = 0; i < kTok; ++i)
#pragma unroll
    for (int j = 0; j < kExp; ++j) acc[i][j] = 0.0f;
  for (int k0 = lane * 8; k0 < H; k0 += 32 * 8) {
    float xv[kTok][8];
#pragma unroll
    for (int i = 0; i < kTok; ++i) detail::router_load8(xr[i] + k0, xv[i]);
#pragma unroll
    for (int j = 0; j < kExp; ++j) {
      float wv[8];
      detail::router_load8(wr[j] + k0, wv);
#pragma unroll
      for (int i = 0; i < kTok; ++i)
#pragma unroll
        for (int q = 0; q < 8; ++q) acc[i][j] = fmaf(xv[i][q], wv[q], acc[i][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < kTok; ++i)
#pragma unroll
    for (int j = 0; j < kExp; ++j) {
      float v = acc[i][j];
      for (int off = 16; off >= 1; off /= 2) v = v + __shfl_xor_sync(0xffffffffu, v, off);
      acc[i][j] = v;
    }
  // Lane i * kExp + j writes logit (t0 + i, e0 + j): every lane holds every sum.
  const int i = lane / kExp, j = lane % kExp;
  float mine = 0.0f;
#pragma unroll
  for (int a = 0; a < kTok; ++a)
#pragma unroll
    for (int b = 0; b < kExp; ++b)
      if (a == i && b == j) mine = acc[a][b];
  if (t0 + i < T && e0 + j < E) logits[size_t(t0 + i) * E + e0 + j] = mine;
}
static_assert(kTok * kExp == 32, "one lane stores each logit of the warp's tile");

template <typename X>
cudaError_t launch(const X* x, const uint16_t* w, int T, int H, int E, float* logits,
                   cudaStream_t stream) {
  // Expert groups vary fastest, so the few blocks that read one token tile run together and x
  // comes from HBM once (tokens fastest re-read all of x per expert group: 4 x 50 MB at GLM-5's
  // 4096 tokens, 483 us on the H200).
  const int expert_groups = (E + kWarps * kExp - 1) / (kWarps * kExp);
  constexpr int kMaxTokens = 65535 * kTok;  // grid.y limit: longer batches go in pieces
  for (int t = 0; t < T; t += kMaxTokens) {
    const int n = std::min(kMaxTokens, T - t);
    const dim3 grid(unsigned(expert_groups), unsigned((n + kTok - 1) / kTok));
    router_logits_tiled_kernel<X><<<grid, kWarps * 32, 0, stream>>>(x + size_t(t) * H, w, n, H, E,
                                                                      logits + size_t(t) * E);
  }
  return cudaGetLastError();
}

}  // namespace

std::string router_logits_tiled_unsupported_reason(const void* x, const uint16_t* w_gate, int H) {
  if (H < 8 || H % 8 != 0) return str("hidden size ", H, " is not a multiple of 8");
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(w_gate) % 16 != 0)
    return "x or the gate weight is not 16-byte aligned";
  return "";
}

cudaError_t router_logits_tiled(const void* x, DType x_dtype, const uint16_t* w_gate_bf16, int T,
                                int H, int E, float* logits, cudaStream_t stream) {
  if (T < 0 || H < 1 || E < 1)
    TETRA_FAIL("cuda router_logits_tiled: bad sizes T=", T, " H=", H, " E=", E);
  const std::string why = router_logits_tiled_unsupported_reason(x, w_gate_bf16, H);
  if (!why.empty()) TETRA_FAIL("cuda router_logits_tiled: ", why);
  if (T == 0) return cudaSuccess;
  if (x_dtype == DType::BF16)
    return launch(static_cast<const uint16_t*>(x), w_gate_bf16, T, H, E, logits, stream);
  if (x_dtype == DType::F32)
    return launch(static_cast<const float*>(x), w_gate_bf16, T, H, E, logits, stream);
  TETRA_FAIL("cuda router_logits_tiled: activations must be BF16 or F32, got ",
             dtype_name(x_dtype));
}

}  // namespace tetra::moe::cuda
