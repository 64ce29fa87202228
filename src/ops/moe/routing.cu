// Routing kernel: one warp per token, scores in shared memory, top-k by repeated warp argmax.
// Mirrors route_cpu operation for operation (moe/routing_math.h), so ids and weights match bit
// for bit: softmax sums in the warp-reduction order the CPU emulates, weights summed sequentially.
#include <climits>

#include "core/error.h"
#include "moe/routing_math.h"
#include "ops/moe/moe_ops_cuda.h"

namespace tetra::moe::cuda {

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFullMask = 0xffffffffu;

// Warp-wide best (key, idx) under ranks_before; every lane ends with the winner.
__device__ __forceinline__ void warp_best(float& key, int& idx) {
  for (int off = 16; off >= 1; off /= 2) {
    const float other_key = __shfl_xor_sync(kFullMask, key, off);
    const int other_idx = __shfl_xor_sync(kFullMask, idx, off);
    if (math::ranks_before(other_key, other_idx, key, idx)) {
      key = other_key;
      idx = other_idx;
    }
  }
}

// Bitmask of the topk_group best groups (group score = sum of the two best keys in the group).
__device__ uint32_t kept_groups(const float* sel, const RouterParams& p, int lane) {
  if (p.n_group == 1) return 1u;
  const int group_size = p.num_experts / p.n_group;
  float gkey = -INFINITY;
  int gidx = INT_MAX;  // lanes without a group hold the sentinel, which never wins
  if (lane < p.n_group) {
    float t1 = -INFINITY, t2 = -INFINITY;
    for (int e = lane * group_size; e < (lane + 1) * group_size; ++e) {
      const float v = sel[e];
      if (v > t1) {
        t2 = t1;
        t1 = v;
      } else if (v > t2) {
        t2 = v;
      }
    }
    gkey = math::selection_key(t1 + t2);
    gidx = lane;
  }
  uint32_t kept = 0;
  for (int j = 0; j < p.topk_group; ++j) {
    float k = gkey;
    int i = gidx;
    warp_best(k, i);
    kept |= 1u << i;
    if (gidx == i) {  // this lane's group is taken: step out of later rounds
      gkey = -INFINITY;
      gidx = INT_MAX;
    }
  }
  return kept;
}

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
  const float* lg = logits + size_t(t) * E;

  if (kSoftmax) {
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, lg[e]);
    for (int off = 16; off >= 1; off /= 2) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, off));
    float part = 0.0f;
    for (int e = lane; e < E; e += 32) {
      const float v = math::exp_f32(lg[e] - m);
      s[e] = v;
      part = part + v;
    }
    for (int off = 16; off >= 1; off /= 2) part = part + __shfl_xor_sync(kFullMask, part, off);
    for (int e = lane; e < E; e += 32) s[e] = math::div_rn(s[e], part);
  } else {
    for (int e = lane; e < E; e += 32) s[e] = math::sigmoid_f32(lg[e]);
  }
  for (int e = lane; e < E; e += 32) sel[e] = math::selection_key(bias ? s[e] + bias[e] : s[e]);
  __syncwarp();

  const uint32_t kept = kept_groups(sel, p, lane);
  const int group_size = E / p.n_group;
  uint32_t taken = 0;  // bit i: expert lane + 32*i already chosen
  int my_id = -1;      // lane j keeps the j-th choice
  float my_w = 0.0f;
  for (int j = 0; j < K; ++j) {
    float bk = -INFINITY;
    int bi = INT_MAX;
    for (int i = 0, e = lane; e < E; ++i, e += 32) {
      if ((taken >> i) & 1u) continue;
      if (!((kept >> (e / group_size)) & 1u)) continue;
      if (math::ranks_before(sel[e], e, bk, bi)) {
        bk = sel[e];
        bi = e;
      }
    }
    warp_best(bk, bi);
    if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
    if (lane == j) {
      my_id = bi;
      my_w = s[bi];
    }
  }
  float sum = 0.0f;  // sequential over j, as the CPU
  for (int j = 0; j < K; ++j) sum = sum + __shfl_sync(kFullMask, my_w, j);
  if (lane < K) {
    const float v = p.norm_topk_prob ? math::div_rn(my_w, sum + 1e-20f) : my_w;
    ids[size_t(t) * K + lane] = my_id;
    weights[size_t(t) * K + lane] = math::mul_rn(v, p.routed_scaling_factor);
  }
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
