// Router GEMM logits = x @ W_gate^T: small (E <= a few hundred), so one warp per (token, expert)
// dot product (router_dot.cuh), float accumulation in router_logits_cpu's order.
#include "core/error.h"
#include "core/kernel_launch.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/pdl_chain.cuh"
#include "ops/moe/router_dot.cuh"

namespace tetra::moe::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;  // experts per block

// grid (T, ceil(E / kWarpsPerBlock)); warp w of block (t, y) computes logits[t, y*8 + w].
template <typename X, bool kVec>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    router_logits_kernel(const X* __restrict__ x, const uint16_t* __restrict__ w, int H, int E,
                         float* __restrict__ logits) {
  detail::pdl_chain_entry();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x;
  const int e = blockIdx.y * kWarpsPerBlock + warp;
  if (e >= E) return;
  const float acc = detail::router_dot<X, kVec>(x + size_t(t) * H, w + size_t(e) * H, H, lane);
  if (lane == 0) logits[size_t(t) * E + e] = acc;
}

template <typename X>
cudaError_t launch(const X* x, const uint16_t* w, int T, int H, int E, float* logits,
                   cudaStream_t stream, bool pdl) {
  const dim3 grid(T, (E + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const bool vec = H % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(w) % 16 == 0;
  const KernelLaunch launch(grid, dim3(kWarpsPerBlock * 32), stream, pdl);
  return launch(vec ? router_logits_kernel<X, true> : router_logits_kernel<X, false>, x, w, H, E,
                logits);
}

}  // namespace

cudaError_t router_logits(const void* x, DType x_dtype, const uint16_t* w_gate_bf16, int T, int H,
                          int E, float* logits, cudaStream_t stream, bool pdl) {
  if (T < 0 || H < 1 || E < 1)
    TETRA_FAIL("cuda router_logits: bad sizes T=", T, " H=", H, " E=", E);
  if (E > 65535 * kWarpsPerBlock) TETRA_FAIL("cuda router_logits: too many experts ", E);
  if (T == 0) return cudaSuccess;
  if (x_dtype == DType::BF16)
    return launch(static_cast<const uint16_t*>(x), w_gate_bf16, T, H, E, logits, stream, pdl);
  if (x_dtype == DType::F32)
    return launch(static_cast<const float*>(x), w_gate_bf16, T, H, E, logits, stream, pdl);
  TETRA_FAIL("cuda router_logits: activations must be BF16 or F32, got ", dtype_name(x_dtype));
}

}  // namespace tetra::moe::cuda
