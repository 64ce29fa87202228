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

// Folds v into a running (largest, second largest) pair; duplicates count twice.
__device__ __forceinline__ void top2_visit(float v, float& t1, float& t2) {
  if (v > t1) {
    t2 = t1;
    t1 = v;
  } else if (v > t2) {
    t2 = v;
  }
}

// A group's score as an order key: selection_key of the sum of its two best keys.
__device__ __forceinline__ uint32_t group_order_key(float t1, float t2) {
  return order_key(math::selection_key(t1 + t2));
}

// The topk_group best groups, ties to the lower group, as a bit mask (bit g: group g kept).
// genc: lane g offers group g's order key (0 on lanes >= n_group).
__device__ __forceinline__ uint32_t select_groups(uint32_t genc, int topk_group, int lane) {
  uint32_t kept = 0;
  for (int j = 0; j < topk_group; ++j) {
    const uint32_t g = warp_winner(genc, uint32_t(lane));
    kept |= 1u << g;
    if (g == uint32_t(lane)) genc = 0;  // taken: out of later rounds
  }
  return kept;
}

// kept_groups with the redux winner: the same groups (group score = selection_key of the sum of
// the two best keys, ties to the lower group). Lane g visits group g's keys (sel [E]) in turn.
__device__ __forceinline__ uint32_t kept_groups_redux(const float* sel, const RouterParams& p,
                                                      int lane) {
  if (p.n_group == 1) return 1u;
  const int group_size = p.num_experts / p.n_group;
  uint32_t genc = 0;
  if (lane < p.n_group) {
    // The two largest values come out the same in any visiting order, so 16-byte loads may
    // take them four at a time.
    float t1 = -INFINITY, t2 = -INFINITY;
    const float* g = sel + lane * group_size;
    if (group_size % 4 == 0 && reinterpret_cast<uintptr_t>(g) % 16 == 0) {
      for (int i = 0; i < group_size; i += 4) {
        const float4 v = *reinterpret_cast<const float4*>(g + i);
        top2_visit(v.x, t1, t2), top2_visit(v.y, t1, t2);
        top2_visit(v.z, t1, t2), top2_visit(v.w, t1, t2);
      }
    } else {
      for (int i = 0; i < group_size; ++i) top2_visit(g[i], t1, t2);
    }
    genc = group_order_key(t1, t2);
  }
  return select_groups(genc, p.topk_group, lane);
}

// One group's order key computed by a whole warp: lane-strided visits of keys [group_size], then
// a butterfly merge of the (largest, second) pairs. The two largest values of a multiset do not
// depend on the visiting order (a -0 / +0 swap cannot change the key: order_key takes -0 as +0),
// so this is kept_groups_redux's group score, bit for bit. Every lane gets the key.
__device__ __forceinline__ uint32_t group_order_key_warp(const float* keys, int group_size,
                                                         int lane) {
  float t1 = -INFINITY, t2 = -INFINITY;
  for (int i = lane; i < group_size; i += 32) top2_visit(keys[i], t1, t2);
  for (int off = 16; off >= 1; off /= 2) {
    const float o1 = __shfl_xor_sync(kRouteFullMask, t1, off);
    const float o2 = __shfl_xor_sync(kRouteFullMask, t2, off);
    // The top two of {t1 >= t2} and {o1 >= o2} (keys are never NaN).
    const float lower_first = fminf(t1, o1);
    t1 = fmaxf(t1, o1);
    t2 = fmaxf(lower_first, fmaxf(t2, o2));
  }
  return group_order_key(t1, t2);
}

// The selection key of expert e's score: score + bias (when there is one), NaN ranking as -Inf.
__device__ __forceinline__ float score_selection_key(float score, const float* __restrict__ bias,
                                                     int e) {
  return math::selection_key(bias ? score + bias[e] : score);
}

// Zeroes the order keys of the experts outside the kept groups (bit g of kept: group g).
template <int kPerLane>
__device__ __forceinline__ void drop_other_groups(uint32_t (&enc)[kPerLane], uint32_t kept,
                                                  const RouterParams& p, int lane) {
  const int group_size = p.num_experts / p.n_group;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (!((kept >> ((lane + 32 * i) / group_size)) & 1u)) enc[i] = 0;
}

// The top_k experts by order key (enc [kPerLane] of experts lane + 32*i; 0 = out; consumed),
// their scores s renormalised and scaled as route_cpu does: ids / weights [top_k].
template <int kPerLane>
__device__ __forceinline__ void top_k_and_weights(const float (&s)[kPerLane],
                                                  uint32_t (&enc)[kPerLane], const RouterParams& p,
                                                  int32_t* ids, float* weights, int lane) {
  const int K = p.top_k;
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

// route_token with each lane's scores in registers (experts lane + 32*i, i < kPerLane; needs
// E <= 32 * kPerLane) and redux winners: the same ids and weights bit for bit (the scores, sums
// and weights are the same float operations in the same order; only where they are kept and how
// the argmax is found change). sel [E] f32 scratch of this warp (shared memory; read by the group
// selection). ids / weights [top_k] of this token.
template <bool kSoftmax, int kPerLane>
__device__ __forceinline__ void route_token_regs(const float* lg, const float* __restrict__ bias,
                                                 const RouterParams& p, float* sel, int32_t* ids,
                                                 float* weights, int lane) {
  const int E = p.num_experts;
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
      const float k = score_selection_key(s[i], bias, e);
      sel[e] = k;
      enc[i] = order_key(k);
    }
  }
  __syncwarp();
  if (p.n_group != 1) drop_other_groups<kPerLane>(enc, kept_groups_redux(sel, p, lane), p, lane);
  top_k_and_weights<kPerLane>(s, enc, p, ids, weights, lane);
}

// route_token_regs for sigmoid scoring once the whole block has computed the token's scores,
// selection keys and group keys (sigmoid_f32, score_selection_key, group_order_key_warp: the
// same device code): scores / keys [E], group_keys [n_group] (unread when n_group == 1). The
// same ids and weights, bit for bit; it spares the one routing warp the serial chains of E/32
// sigmoids and of n_group / 32 lanes' group visits.
template <int kPerLane>
__device__ __forceinline__ void route_token_scored(const float* scores, const float* keys,
                                                   const uint32_t* group_keys,
                                                   const RouterParams& p, int32_t* ids,
                                                   float* weights, int lane) {
  float s[kPerLane];
  uint32_t enc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    s[i] = e < p.num_experts ? scores[e] : 0.0f;
    enc[i] = e < p.num_experts ? order_key(keys[e]) : 0u;
  }
  if (p.n_group != 1) {
    const uint32_t genc = lane < p.n_group ? group_keys[lane] : 0u;
    drop_other_groups<kPerLane>(enc, select_groups(genc, p.topk_group, lane), p, lane);
  }
  top_k_and_weights<kPerLane>(s, enc, p, ids, weights, lane);
}

}  // namespace tetra::moe::cuda::detail
