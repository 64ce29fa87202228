// CUDA MoE token path: router logits, routing, layout building, permute and combine.
// Device pointers, one stream, each returns the launch's cudaError_t. Bad sizes or parameters are
// refused with a tetra::Error before anything is launched. Every op is bit-identical to its CPU
// twin (moe/router.h, moe/token_layout.h, moe/token_movement.h), which the gpu tests check.
// bf16 tensors are passed as uint16_t bits. No op allocates or synchronises: all are capturable in
// a CUDA graph (the layouts' shapes depend only on T, top_k, E, max_m).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "moe/add_rms_norm_step.h"
#include "moe/router.h"
#include "moe/token_layout.h"

namespace tetra::moe::cuda {

// Routing keeps a per-lane bitmask of E/32 experts; layouts keep ~40*E bytes of shared memory.
inline constexpr int kMaxExperts = 1024;

// logits [T, E] f32 = x [T, H] (x_dtype BF16 or F32) @ w_gate [E, H] bf16 ^T, float accumulation
// in router_logits_cpu's order (so the result is bit-identical).
// pdl: launched as a programmatic dependent of the kernel before it (core/kernel_launch.h): the
// grid is staged while that kernel ends and waits for it before reading anything; every kernel
// of the MoE routing chain also lets its own dependents launch at its start.
cudaError_t router_logits(const void* x, DType x_dtype, const uint16_t* w_gate_bf16, int T, int H,
                          int E, float* logits, cudaStream_t stream, bool pdl = false);

// One warp per token. logits [T, E] f32, bias [E] f32 or nullptr -> ids [T, top_k] int32,
// weights [T, top_k] f32; same ids and weights as route_cpu (bit for bit).
cudaError_t route(const float* logits, const float* bias, int T, const RouterParams& p,
                  int32_t* ids, float* weights, cudaStream_t stream, bool pdl = false);

// Scratch for the layout builders (0 when T*top_k is small enough for the one-block path).
size_t layout_workspace_bytes(int T, int top_k, int E);

// Expert parallelism: the builders' E is the number of LOCAL experts, the block
// [expert_begin, expert_begin + E) of global ids. A pair whose id lies in [0, global_experts)
// but outside the block belongs to another rank: slot_of = -1 and it is NOT counted as dropped.
// expert_begin = 0, global_experts = 0 (= E) is the whole layer.
struct ExpertBlock {
  int expert_begin = 0;
  int global_experts = 0;
};

// Where build_contiguous writes; pair p = t*top_k + k.
struct ContiguousLayoutView {
  int32_t* expert_offsets = nullptr;  // [E + 1]
  int32_t* slot_token = nullptr;      // [T*top_k] token of each row; -1 past the placed rows
  int32_t* slot_of = nullptr;         // [T*top_k] row of pair p, -1 if dropped
  RowRange* expert_rows = nullptr;    // [E] {offsets[e], count}, or nullptr
  int32_t* dropped = nullptr;         // [1] pairs not placed (id outside [0, E)), or nullptr
  ExpertBlock block;                  // which ids are rows here (see ExpertBlock)
};

// Where build_masked writes.
struct MaskedLayoutView {
  int max_m = 0;                    // rows per expert
  int32_t* masked_m = nullptr;      // [E] rows used, min(count, max_m)
  int32_t* row_token = nullptr;     // [E * max_m] token of each row, -1 where empty
  int32_t* slot_of = nullptr;       // [T*top_k] row e*max_m + r of pair p, -1 if dropped
  RowRange* expert_rows = nullptr;  // [E] {e*max_m, masked_m[e]}, or nullptr
  int32_t* dropped = nullptr;       // [1] pairs not placed (beyond max_m or bad id), or nullptr
  ExpertBlock block;                // which ids are rows here (see ExpertBlock)
};

// Stable counting sort of the pairs by expert; the same rows as build_contiguous_cpu /
// build_masked_cpu (for the whole layer; a block's rows are those of the ids it holds, shifted
// by -expert_begin). ids [T, top_k] int32 global ids. The CPU builders raise errors where these drop pairs
// (an expert over max_m, an id outside [0, E)): the device cannot throw, so it counts them in
// `dropped` for the caller to check, and never writes out of bounds. pdl (router_logits above)
// applies to the one-block path (no workspace); the larger path starts with memsets.
cudaError_t build_contiguous(const int32_t* ids, int T, int top_k, int E, void* workspace,
                             size_t workspace_bytes, const ContiguousLayoutView& out,
                             cudaStream_t stream, bool pdl = false);
cudaError_t build_masked(const int32_t* ids, int T, int top_k, int E, void* workspace,
                         size_t workspace_bytes, const MaskedLayoutView& out, cudaStream_t stream,
                         bool pdl = false);

// rows[slot_of[p]] = x[p / top_k] for slot_of[p] >= 0; other rows untouched (as permute_rows_cpu).
//   x [T, H] bf16, rows [num_rows, H] bf16 (contiguous [S, H] or masked [E*max_m, H])
cudaError_t permute_bf16(const uint16_t* x, int T, int H, int top_k, const int32_t* slot_of,
                         uint16_t* rows, cudaStream_t stream);

// out [T, H] bf16 = sum_j weights[t,j] * rows[slot_of[t,j]] (+ shared[t]) (+ residual[t]) as
// combine_bf16_cpu: float32 FMAs in j order, one rounding. Gather, no atomics: deterministic.
//   rows [num_rows, H] (rows_dtype BF16 or F32), weights [T, top_k] f32 or nullptr (= 1),
//   shared [T, H] bf16 or nullptr, residual [T, H] bf16 or nullptr
cudaError_t combine_bf16(const void* rows, DType rows_dtype, int T, int H, int top_k,
                         const int32_t* slot_of, const float* weights, const uint16_t* shared,
                         const uint16_t* residual, uint16_t* out, cudaStream_t stream);

// The decoder's add + RMSNorm after the MoE block done by the combine (moe/add_rms_norm_step.h):
// a cluster of blocks holds a token's row, their partial sums of squares meet in distributed
// shared memory. F32 rows, H % 4 == 0 and H <= 32768 (combine_add_rms_norm_fits), 16-byte aligned
// pointers.
bool combine_add_rms_norm_fits(int H, DType rows_dtype);
// With AddRmsNormStep::fold the combine runs this many blocks of 64 threads per token and writes
// one sum of squares per block (moe/add_rms_norm_step.h NormFold), no cluster: ceil(H / 256), or 0
// where H does not take the fold (H % 4 != 0, or more parts than 8 rows of them fit
// kNormFoldMaxSums: H > 8192).
int combine_norm_fold_parts(int H);

// What the layer runner adds to combine_bf16.
struct CombineOptions {
  // [1] device int: the shared expert's output is in the rows, rows[*shared_first_row + t] (F32
  // rows, `shared` null); it is rounded to bf16 before it is added, as a bf16 shared output.
  const int32_t* shared_first_row = nullptr;
  // Programmatic dependent launch: the kernel may start while the previous kernel in the stream
  // finishes and reads nothing before that kernel is complete.
  bool pdl = false;
  // With pdl: slot_of, weights, shared_first_row and residual were complete before the previous
  // kernel started (the routed GEMM1 ran between their writer and this combine, and it let its
  // dependents start only after that writer was complete), so they are read before the wait;
  // only the rows and `shared` after it.
  bool routing_ready = false;
  // Not null: the add + RMSNorm that follows the MoE block, fused. With routing_ready its
  // residual is read before the wait too.
  const AddRmsNormStep* add_norm = nullptr;
  // With add_norm: clear[0 .. clear_count) is zeroed after the wait, when every kernel before the
  // previous one is complete too (the router fold's sums, read by GEMM1: moe/router_fold.h).
  double* clear = nullptr;
  int clear_count = 0;
};
cudaError_t combine_bf16(const void* rows, DType rows_dtype, int T, int H, int top_k,
                         const int32_t* slot_of, const float* weights, const uint16_t* shared,
                         const uint16_t* residual, uint16_t* out, cudaStream_t stream,
                         const CombineOptions& opt);

}  // namespace tetra::moe::cuda
