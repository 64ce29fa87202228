// Routing of one token by one warp, shared by the route kernel (routing.cu) and the small-T token
// path (token_path.cu). Mirrors route_cpu operation for operation (moe/routing_math.h), so ids and
// weights match bit for bit: softmax sums in the warp-reduction order the CPU emulates, weights
// summed sequentially.
#pragma once
#include <climits>

#include "moe/router.h"
#include "moe/routing_math.h"

namespace tetra::moe::cuda::detail {

inline constexpr unsigned kRouteFullMask = 0xffffffffu;

// Warp-wide best (key, idx) under ranks_before; every lane ends with the winner.
__device__ __forceinline__ void warp_best(float& key, int& idx) {
  for (int off = 16; off >= 1; off /= 2) {
    const float other_key = __shfl_xor_sync(kRouteFullMask, key, off);
    const int other_idx = __shfl_xor_sync(kRouteFullMask, idx, off);
    if (math::ranks_before(other_key, other_idx, key, idx)) {
      key = other_key;
      idx = other_idx;
    }
  }
}

// Bitmask of the topk_group best groups (group score = sum of the two best keys in the group).
__device__ __forceinline__ uint32_t kept_groups(const float* sel, const RouterParams& p, int lane) {
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

// Routes one token with the whole warp (all 32 lanes call it).
//   lg [E] f32 logits (read through L2: another block may have written them), bias [E] or null,
//   s / sel [E] f32 scratch of this warp (shared memory), ids / weights [top_k] of this token.
// The caller must __syncwarp() before reusing s / sel for another token.
template <bool kSoftmax>
__device__ __forceinline__ void route_token(const float* lg, const float* __restrict__ bias,
                                            const RouterParams& p, float* s, float* sel,
                                            int32_t* ids, float* weights, int lane) {
  const int E = p.num_experts, K = p.top_k;
  if (kSoftmax) {
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, __ldcg(lg + e));
    for (int off = 16; off >= 1; off /= 2) m = fmaxf(m, __shfl_xor_sync(kRouteFullMask, m, off));
    float part = 0.0f;
    for (int e = lane; e < E; e += 32) {
      const float v = math::exp_f32(__ldcg(lg + e) - m);
      s[e] = v;
      part = part + v;
    }
    for (int off = 16; off >= 1; off /= 2) part = part + __shfl_xor_sync(kRouteFullMask, part, off);
    for (int e = lane; e < E; e += 32) s[e] = math::div_rn(s[e], part);
  } else {
    for (int e = lane; e < E; e += 32) s[e] = math::sigmoid_f32(__ldcg(lg + e));
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
  for (int j = 0; j < K; ++j) sum = sum + __shfl_sync(kRouteFullMask, my_w, j);
  if (lane < K) {
    const float v = p.norm_topk_prob ? math::div_rn(my_w, sum + 1e-20f) : my_w;
    ids[lane] = my_id;
    weights[lane] = math::mul_rn(v, p.routed_scaling_factor);
  }
}

}  // namespace tetra::moe::cuda::detail
