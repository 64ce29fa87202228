// The CUDA MoE layer's token path between routing and the expert GEMMs:
//  - prepare_rows: the row bookkeeping the grouped GEMMs read (MoeRows) from a layout, in one
//    tiny launch; optionally with the shared expert as one more expert slot (local expert E, one
//    row per token), so that it runs inside the routed GEMM launches;
//  - small_token_path: for few tokens, router logits + routing + layout + prepare_rows in ONE
//    launch (they are four dependent launches otherwise, each mostly launch latency at decode
//    sizes). Many blocks compute the router logits (one warp per dot product); the last block to
//    finish (atomic counter) routes every token, builds the layout and the bookkeeping. Up to
//    kTinyThreads pairs (and H % 8 == 0) this is the tiny kernel of token_path_tiny.h (gate rows
//    staged in shared memory, a small-T layout without global round trips); past that, a general
//    one-launch kernel with the layout builders' 1024-thread block code.
// Both are bit-identical to the separate ops (router_logits, route, build_contiguous /
// build_masked): the same device code. Neither allocates or synchronises (graph-capturable).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "moe/router.h"

namespace tetra::moe::cuda {

// What prepare_rows reads and writes. E = local experts.
struct RowsPrep {
  int E = 0;
  int num_slots = 0;  // routed slots: min(E, T*top_k)
  int max_m = 0;      // masked layout: rows per expert; 0 = contiguous
  // ("[E] = T": the shared slot's entry, written when shared_slot)
  const int32_t* offsets = nullptr;  // contiguous [E + 1] from the layout builder
  int32_t* masked_m = nullptr;       // masked [E (+1)] from the layout builder; [E] = T
  int32_t* row_count = nullptr;      // contiguous [E (+1)] written: offsets diff; [E] = T
  int32_t* slots = nullptr;          // [num_slots (+1)] active experts ascending, then -1; then E
  int32_t* row_token = nullptr;      // [rows] source token of each row: the shared slot's written
  int32_t* sh_rows = nullptr;        // [2] {0, T}: the shared expert as its own problem, or nullptr
  bool shared_slot = false;          // the shared expert is local expert E with T rows, placed at
                                     // offsets[E] (contiguous) or E * max_m (masked)
};
// pdl: as cuda::router_logits's (moe_ops_cuda.h).
cudaError_t prepare_rows(const RowsPrep& r, int T, cudaStream_t stream, bool pdl = false);

struct SmallTokenPath {
  const uint16_t* x = nullptr;     // [T, H] bf16
  const uint16_t* gate = nullptr;  // [E_global, H] bf16 router weight
  const float* bias = nullptr;     // [E_global] or nullptr
  int H = 0;
  RouterParams router;             // num_experts = E_global
  float* logits = nullptr;         // [T, E_global]
  int32_t* ids = nullptr;          // [T, top_k] global ids
  float* weights = nullptr;        // [T, top_k]
  int expert_begin = 0;            // local experts [expert_begin, expert_begin + rows.E)
  // Layout outputs (as ContiguousLayoutView / MaskedLayoutView, max_m = rows.max_m). Unlike the
  // builders, rows past an expert's count are left as they were (the GEMMs never read them).
  int32_t* offsets = nullptr;      // contiguous [E + 1]
  int32_t* masked_m = nullptr;     // masked [E (+1)]
  int32_t* row_token = nullptr;    // [rows]
  int32_t* slot_of = nullptr;      // [T*top_k], -1 for other ranks' pairs
  int32_t* dropped = nullptr;      // [1] zeroed here, then pairs not placed (bad id / over max_m)
  RowsPrep rows;                   // offsets / masked_m / row_token as above
  uint32_t* counter = nullptr;     // [1] zero before the first launch; each launch leaves it zero
  // Programmatic dependent launch (the tiny kernel only): its gate-row loads overlap the previous
  // kernel's tail; it reads x and writes its outputs only after that kernel is complete.
  bool pdl = false;
  // The router logits only (the tiny kernel): no routing, layout or bookkeeping, which GEMM1
  // then does itself (moe_w4a16_gemm1_routed, ops/moe/gemm1_routing.h). A hint: the general
  // kernel, past the tiny kernel's limits, still routes and writes the (same) layout.
  bool logits_only = false;
  // Weights the next kernels read whatever the routing (the shared expert): the tiny kernel's
  // blocks ask the L2 for an equal share of them each (cp.async.bulk.prefetch.L2) before they
  // start on the logits, so they arrive while routing leaves HBM idle. A hint: no result
  // depends on it; the general kernel ignores it. Empty ranges are skipped.
  static constexpr int kMaxWarm = 4;
  const void* warm[kMaxWarm] = {};
  size_t warm_bytes[kMaxWarm] = {};
  // The RMSNorm before the layer folded in (the tiny kernel at T = 1 only:
  // small_token_path_takes_pre_norm): x is then the un-normalised row h, every block normalises
  // its staged copy as the add + RMSNorm kernel does (bf16(h * rsqrt(mean(h^2) + eps) * weight))
  // and block 0 stores it to pre_norm_out, the GEMMs' input. Saves the norm's launch between
  // o_proj and this kernel (whose epilogue then adds the residual: Nvfp4GemvOutput::residual).
  const uint16_t* pre_norm_weight = nullptr;  // [H] bf16, or null: x is normalised already
  float pre_norm_eps = 0.0f;
  uint16_t* pre_norm_out = nullptr;           // [1, H] bf16
};

// Largest T the one-launch path takes (T*top_k pairs must fit the one-block layout builder).
bool small_token_path_fits(int T, int top_k);
// Whether small_token_path takes a.pre_norm_* at T tokens (a's other fields as for the launch).
bool small_token_path_takes_pre_norm(const SmallTokenPath& a, int T);
// Raises the kernel's dynamic shared memory limit (one value for every shape) on the current
// device; call before the first launch, outside stream capture. Throws tetra::Error when
// E_global / E_local are out of range.
void small_token_path_setup(int E_global, int E_local);
cudaError_t small_token_path(const SmallTokenPath& a, int T, cudaStream_t stream);

}  // namespace tetra::moe::cuda
