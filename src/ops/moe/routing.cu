// Routing kernel: one warp per token, scores in registers, top-k by repeated warp argmax
// (routing_device.cuh, shared with the small-T token paths).
#include "core/error.h"
#include "core/kernel_launch.h"
#include "ops/moe/moe_kernel_smem.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/pdl_chain.cuh"
#include "ops/moe/routing_device.cuh"

namespace tetra::moe::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;
static_assert(moe_smem::route(1) == kWarpsPerBlock * sizeof(float), "one key row per warp");

// kPerLane: experts per lane (E <= 32 * kPerLane).
template <bool kSoftmax, int kPerLane>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int T,
                 RouterParams p, int32_t* __restrict__ ids, float* __restrict__ weights) {
  extern __shared__ float smem[];
  detail::pdl_chain_entry();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int E = p.num_experts, K = p.top_k;
  float* sel = smem + size_t(warp) * E;  // [E] selection keys (biased, NaN -> -Inf)
  const int t = blockIdx.x * kWarpsPerBlock + warp;
  if (t >= T) return;  // whole warps leave; no block-wide barrier follows
  detail::route_token_regs<kSoftmax, kPerLane>(logits + size_t(t) * E, bias, p, sel,
                                               ids + size_t(t) * K, weights + size_t(t) * K, lane);
}

}  // namespace

cudaError_t route(const float* logits, const float* bias, int T, const RouterParams& p,
                  int32_t* ids, float* weights, cudaStream_t stream, bool pdl) {
  validate_router_params(p);
  if (p.num_experts > kMaxExperts)
    TETRA_FAIL("cuda route: ", p.num_experts, " experts, at most ", kMaxExperts, " supported");
  if (T < 0) TETRA_FAIL("cuda route: token count ", T);
  if (T == 0) return cudaSuccess;
  const int blocks = (T + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const size_t smem = moe_smem::route(p.num_experts);
  const bool softmax = p.scoring == Scoring::Softmax, narrow = p.num_experts <= 32 * 8;
  const KernelLaunch launch(dim3(blocks), dim3(kWarpsPerBlock * 32), stream, pdl, smem);
  const auto kernel = softmax && narrow ? route_kernel<true, 8>
                      : softmax         ? route_kernel<true, 32>
                      : narrow          ? route_kernel<false, 8>
                                        : route_kernel<false, 32>;
  return launch(kernel, logits, bias, T, p, ids, weights);
}

}  // namespace tetra::moe::cuda
