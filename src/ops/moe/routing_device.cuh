// Routing of one token by one warp, shared by the route kernel (routing.cu) and the small-T token
// path (token_path.cu). Mirrors route_cpu operation for operation (moe/routing_math.h), so ids and
// weights match bit for bit: softmax sums in the warp-reduction order the CPU emulates, weights
// summed sequentially.
#pragma once
#include <climits>
#include <cstdint>

#include "moe/router.h"
#include "moe/routing_math.h"

namespace tetra::moe::cuda::detail {

inline constexpr unsigned kRouteFullMask = 0xffffffffu;


// A key's position in ranks_before's order as an unsigned int (bigger = ranks first), so that a
// warp's winner takes two redux instructions (max key, then min index among equal keys) instead
// of a 5-step shuffle butterfly. Keys are never NaN (selection_key); -0 is taken as +0, since the
// float compare finds them equal. 0 is below every key (-Inf maps to 0x007fffff): "no candidate".
__device__ __forceinline__ uint32_t order_key(float key) {
  uint32_t u = math::f32_bits(key);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The warp's best (key, index) by ranks_before among lanes offering enc != 0; every lane gets the
// index (0xffffffff when no lane offers one).
__device__ __forceinline__ uint32_t warp_winner(uint32_t enc, uint32_t idx) {
  const uint32_t best = __reduce_max_sync(kRouteFullMask, enc);
  return __reduce_min_sync(kRouteFullMask, enc == best && enc != 0 ? idx : 0xffffffffu);
}

// kept_groups with the redux winner: the same groups (group score = selection_key of the sum of
// the two best keys, ties to the lower group).
__device__ __forceinline__ uint32_t kept_groups_redux(const float* sel, const RouterParams& p,
                                                      int lane) {
  if (p.n_group == 1) return 1u;
  const int group_size = p.num_experts / p.n_group;
  uint32_t genc = 0;
  if (lane < p.n_group) {
    // The two largest values come out the same in any visiting order, so 16-byte loads may
    // take them four at a time.
    float t1 = -INFINITY, t2 = -INFINITY;
    auto visit = [&](float v) {
      if (v > t1) {
        t2 = t1;
        t1 = v;
      } else if (v > t2) {
        t2 = v;
      }
    };
    const float* g = sel + lane * group_size;
    if (group_size % 4 == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0) {
      for (int i = 0; i < group_size; i += 4) {
        const float4 v = *reinterpret_cast<const float4*>(g + i);
        visit(v.x), visit(v.y), visit(v.z), visit(v.w);
      }
    } else {
      for (int i = 0; i < group_size; ++i) visit(g[i]);
    }
    genc = order_key(math::selection_key(t1 + t2));
  }
  uint32_t kept = 0;
  for (int j = 0; j < p.topk_group; ++j) {
    const uint32_t g = warp_winner(genc, uint32_t(lane));
    kept |= 1u << g;
    if (g == uint32_t(lane)) genc = 0;  // taken: out of later rounds
  }
  return kept;
}

// route_token with each lane's scores in registers (experts lane + 32*i, i < kPerLane; needs
// E <= 32 * kPerLane) and redux winners: the same ids and weights bit for bit (the scores, sums
// and weights are the same float operations in the same order; only where they are kept and how
// the argmax is found change). sel [E] f32 scratch of this warp (shared memory; read by the group
// selection). ids / weights [top_k] of this token.
template <bool kSoftmax, int kPerLane>
__device__ __forceinline__ void route_token_regs(const float* lg, const float* __restrict__ bias,
                                                 const RouterParams& p, float* sel, int32_t* ids,
                                                 float* weights, int lane) {
  const int E = p.num_experts, K = p.top_k;
  float s[kPerLane];       // unbiased scores of experts lane + 32*i
  uint32_t enc[kPerLane];  // their order keys; 0 once taken, or outside E / the kept groups
  float l[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    l[i] = e < E ? __ldcg(lg + e) : 0.0f;
  }
  if (kSoftmax) {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i < E) m = fmaxf(m, l[i]);
    for (int off = 16; off >= 1; off /= 2) m = fmaxf(m, __shfl_xor_sync(kRouteFullMask, m, off));
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      s[i] = 0.0f;
      if (lane + 32 * i < E) {
        s[i] = math::exp_f32(l[i] - m);
        part = part + s[i];
      }
    }
    for (int off = 16; off >= 1; off /= 2) part = part + __shfl_xor_sync(kRouteFullMask, part, off);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) s[i] = math::div_rn(s[i], part);
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) s[i] = math::sigmoid_f32(l[i]);
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    enc[i] = 0;
    if (e < E) {
      const float k = math::selection_key(bias ? s[i] + bias[e] : s[i]);
      sel[e] = k;
      enc[i] = order_key(k);
    }
  }
  __syncwarp();
  const uint32_t kept = kept_groups_redux(sel, p, lane);
  if (p.n_group != 1) {
    const int group_size = E / p.n_group;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (!((kept >> ((lane + 32 * i) / group_size)) & 1u)) enc[i] = 0;
  }
  int my_id = -1;  // lane j keeps the j-th choice
  float my_w = 0.0f;
  for (int j = 0; j < K; ++j) {
    uint32_t be = 0;  // this lane's best: strict > in ascending e keeps the lowest index on ties
    float bs = 0.0f;
    uint32_t bi = 0xffffffffu;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (enc[i] > be) {
        be = enc[i];
        bs = s[i];
        bi = uint32_t(lane + 32 * i);
      }
    }
    const uint32_t win = warp_winner(be, bi);
    const float w = __shfl_sync(kRouteFullMask, bs, int(win & 31u));
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (uint32_t(lane + 32 * i) == win) enc[i] = 0;
    if (lane == j) {
      my_id = int(win);
      my_w = w;
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
