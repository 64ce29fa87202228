// GEMM1 of one token that routes the token itself (the late decode kernel, w4a16_decode.cu).
//
// Why: at one token the MoE chain was logits -> the token path's last block routes and writes the
// layout -> that grid ends -> GEMM1 starts, reads its slot's expert, then its rows, then requests
// weights. Block stamps (bench/results/2026-12-02-session28-h200.md) put 7.9 us per layer
// between "routing known" and GEMM1's first multiplied weights on GLM-4.5-Air, while HBM idles.
// Here the token path computes the logits only; every GEMM1 block waits for them, routes the
// token (sigmoid: the block computes the scores and keys, warp 0 the top-k with
// route_token_scored; softmax: warp 0 with route_token_regs: the token path's device code, so
// the same ids and weights bit for bit), derives its slot's expert and rows in shared memory
// and requests its weights.
// The shared slot's blocks (sigmoid scoring) skip the routing: they request their first weights
// as soon as they start and wait for the logits kernel only before reading x, so the shared
// expert streams while the routed blocks route (gemm1_routed_starts_shared).
// Block (0, 0) also writes the layout the token path would have written for T = 1 (ids, weights,
// slot_of, slots, offsets, row_count, row_token of the selected experts and of the shared slot)
// before it lets GEMM2 launch, so GEMM2 and the combine read what they always read.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/host_device.h"
#include "moe/router.h"
#include "moe/router_fold.h"
#include "ops/moe/w4a16_moe.h"

namespace tetra {

struct Gemm1Routing {
  const float* logits = nullptr;  // [E] the token's router logits (the previous kernel's output)
  const float* bias = nullptr;    // [E] e_score_correction_bias, or nullptr
  moe::RouterParams router;       // num_experts = E: every expert is local (no expert parallel)
  bool shared_slot = false;       // the shared expert is expert E: slot top_k, row top_k
  // Written by block (0, 0), as the token path writes them at T = 1 (entries of experts that
  // were not selected are left as they were: nothing reads them).
  int32_t* ids = nullptr;        // [K] selected experts, in selection order
  float* weights = nullptr;      // [K]
  int32_t* slot_of = nullptr;    // [K] row of pair j (the rank of its expert)
  int32_t* slots = nullptr;      // [K (+1)] slot -> expert, ascending, then the shared expert E
  int32_t* offsets = nullptr;    // [E + 1] first row of each selected expert; [E] = K
  int32_t* row_count = nullptr;  // [E (+1)] 1 for each selected expert (and the shared one)
  int32_t* row_token = nullptr;  // [K (+1)] 0: every row is token 0's
  int32_t* dropped = nullptr;    // [1] 0, or nullptr
};

// The router folded into o_proj (moe/router_fold.h; sigmoid scoring): the logits are
// sum(e) * inv_rms with inv_rms = rsqrt(sum(E) / H + eps), sum(i) the copies' entries i added in
// order; block (0, 0) writes them to `logits` (a record; may be null); x is gx = bf16(g * h)
// and every block scales its sums by inv_rms. Its own argument (not fields of Gemm1Routing): a
// larger Gemm1Routing alone took the unfolded kernel's spills from 8 to 12 bytes.
struct Gemm1Fold {
  const double* sums = nullptr;  // [copies, E + 1]
  int copies = 1;
  float eps = 0.0f;
  float* logits = nullptr;       // [E] or nullptr
};

inline constexpr int kGemm1RoutingMaxExperts = 256;  // 8 scores per routing lane

// Empty when moe_w4a16_gemm1_routed takes p and r (and fold), else why not: one token on the
// default late decode configuration, num_slots = top_k (+1 with the shared slot), at most 256
// experts; with a fold, sigmoid scoring and 1..kRouterFoldMaxCopies copies.
const char* moe_gemm1_routed_unsupported(const MoeGemmProblem& p, const Gemm1Routing& r,
                                         const Gemm1Fold* fold = nullptr);
// Whether the shared slot's blocks request their weights before the routing (and the wait):
// then nothing needs to warm the shared expert in L2 for GEMM1. Sigmoid scoring only (under the
// softmax routing's registers the extra branch spilled). The kernel and the layer both ask.
TETRA_HD bool gemm1_routed_starts_shared(const Gemm1Routing& r) {
  return r.shared_slot && r.router.scoring != moe::Scoring::Softmax;
}
// GEMM1 + SiLU*up of one token routed in the kernel (p.gemm1_pdl: a programmatic dependent of
// the logits kernel, which must not trigger its dependents early). act [K (+1), I] bf16.
// With fold (not null): x is gx and the routing comes from the fold's sums.
cudaError_t moe_w4a16_gemm1_routed(const MoeGemmProblem& p, const MoeWeightsDevice& w,
                                   const Gemm1Routing& r, const uint16_t* x, uint16_t* act,
                                   cudaStream_t stream, const Gemm1Fold* fold = nullptr);

}  // namespace tetra
