// Routing kernel: one warp per token, scores in shared memory, top-k by repeated warp argmax
// (routing_device.cuh, shared with the small-T token path).
#include "core/error.h"
#include "ops/moe/moe_ops_cuda.h"
#include "ops/moe/routing_device.cuh"

namespace tetra::moe::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;

template <bool kSoftmax>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int T,
                 RouterParams p, int32_t* __restrict__ ids, float* __restrict__ weights) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int E = p.num_experts, K = p.top_k;
  float* s = smem + size_t(warp) * 2 * E;  // [E] unbiased scores
  float* sel = s + E;                      // [E] selection keys (biased, NaN -> -Inf)
  const int t = blockIdx.x * kWarpsPerBlock + warp;
  if (t >= T) return;  // whole warps leave; no block-wide barrier follows
  detail::route_token<kSoftmax>(logits + size_t(t) * E, bias, p, s, sel, ids + size_t(t) * K,
                                weights + size_t(t) * K, lane);
}

}  // namespace

cudaError_t route(const float* logits, const float* bias, int T, const RouterParams& p,
                  int32_t* ids, float* weights, cudaStream_t stream) {
  validate_router_params(p);
  if (p.num_experts > kMaxExperts)
    TETRA_FAIL("cuda route: ", p.num_experts, " experts, at most ", kMaxExperts, " supported");
  if (T < 0) TETRA_FAIL("cuda route: token count ", T);
  if (T == 0) return cudaSuccess;
  const int blocks = (T + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const size_t smem = size_t(kWarpsPerBlock) * 2 * p.num_experts * sizeof(float);
  if (p.scoring == Scoring::Softmax) {
    route_kernel<true><<<blocks, kWarpsPerBlock * 32, smem, stream>>>(logits, bias, T, p, ids,
                                                                      weights);
  } else {
    route_kernel<false><<<blocks, kWarpsPerBlock * 32, smem, stream>>>(logits, bias, T, p, ids,
                                                                       weights);
  }
  return cudaGetLastError();
}

}  // namespace tetra::moe::cuda
