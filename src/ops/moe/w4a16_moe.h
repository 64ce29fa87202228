// W4A16 grouped MoE GEMMs for SM90: NVFP4 expert weights (fragment order, moe/expert_weights.h)
// times bf16 activations, fp32 accumulation.
//   GEMM1: act[r, :] = silu(x[r] . gate_e^T) * (x[r] . up_e^T)     bf16 [rows, I]
//   GEMM2: y[r, :]   = act[r] . down_e^T                             f32 or bf16 [rows, H]
// for every row r of expert e, r in [row_start[e], row_start[e] + row_count[e]). Both the
// contiguous layout (row_start = offsets) and the masked layout (row_start[e] = e * max_m,
// row_count = masked_m) are this. GEMM1 may read x through a gather index (row -> source row).
//
// Three kernels, picked by a heuristic on rows per expert (moe_pick_kernel in w4a16_moe.cu):
//   decode: weights stream straight into registers, k split over the warps of a block;
//   tiled:  128 weight rows x 128 rows per block, cp.async multistage, mma.sync m16n8k16;
//   wgmma:  the same tiles on warpgroup MMA (SM90a): A dequantized in registers, B from shared memory.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <ostream>
#include <string>

namespace tetra {

// Plain, trivially copyable description of one grouped GEMM launch (host values only).
struct MoeGemmProblem {
  int num_experts = 0;   // E: experts in the weight tensors
  int hidden = 0;        // H
  int inter = 0;         // I (per expert; gate and up each have I rows)
  int total_rows = 0;    // rows of the activation/output buffers (upper bound on used rows)
  int num_slots = 0;     // entries of expert_ids (0: every expert 0..E-1 is a slot)
  int max_rows_hint = 0; // expected max rows per expert (0: derived from total_rows / slots)
  // GEMM2 only: launch with programmatic dependent launch so its weight prefetch overlaps the
  // previous kernel (GEMM1). Only valid when that previous kernel writes nothing GEMM2 reads
  // before its wait: the row mapping and weights (act is waited for). Decode kernel only; the
  // tiled kernel ignores it.
  bool gemm2_pdl = false;
  // GEMM2 with gemm2_pdl on the default decode configuration: 3-warp blocks where only they fit
  // the grid in one wave on this GPU (moe_detail::one_wave_late_config). Their k split differs
  // from the 4-warp blocks', so the sums round differently; false keeps 4 warps (the persistent
  // layer's split: tests compare the two bit for bit).
  bool gemm2_one_wave = true;
  // With gemm2_one_wave: 8-warp blocks (4 per SM) where the grid fits 4 blocks per SM, the late
  // kernel's wide shape (moe_detail::late_grid_takes_wide_shape), as the routed GEMM1 takes it.
  bool gemm2_wide = false;
  // GEMM1 (decode kernel, or the pair launch) as a programmatic dependent of the kernel that writes
  // the row mapping: every block waits for it before reading anything. Valid only when that kernel
  // triggers no dependents before it ends (else blocks would sit waiting in SM slots); the other
  // kernels launch normally.
  bool gemm1_pdl = false;
  // GEMM1's x is in wgmma order (moe/wgmma_order.h, moe_w4a16_to_wgmma_order): lets kAuto pick the
  // wgmma kernel, which needs it. That kernel's GEMM1 then writes act in wgmma order and its GEMM2
  // reads it so: run both GEMMs of a layer with the same problem and kernel.
  bool x_wgmma_order = false;
};
std::ostream& operator<<(std::ostream& os, const MoeGemmProblem& p);

enum class MoeKernel : int { kAuto = 0, kDecode = 1, kTiled = 2, kWgmma = 3 };
const char* moe_kernel_name(MoeKernel k);

// Device pointers of one packed layer (see PackedMoeLayer for layouts).
struct MoeWeightsDevice {
  const uint8_t* w13 = nullptr;       // [E][2I/16][H/64][32][16] fragment words
  const uint8_t* s13 = nullptr;       // [E][2I/16][H/64][32][2] ue5m3 scales
  const uint8_t* w2 = nullptr;        // [E][H/16][I/64][32][16]
  const uint8_t* s2 = nullptr;        // [E][H/16][I/64][32][2]
  const float* alpha_gate = nullptr;  // [E]
  const float* alpha_up = nullptr;    // [E]
  const float* alpha_down = nullptr;  // [E]
};

// Row mapping shared by both GEMMs.
struct MoeRows {
  const int* row_start = nullptr;   // [E] first row of expert e in x/act/y
  const int* row_count = nullptr;   // [E] rows of expert e (0 allowed)
  const int* expert_ids = nullptr;  // [num_slots] experts to run, -1 = skip; null: all experts
  const int* gather = nullptr;      // [total_rows] GEMM1 source row of x per row; null: identity
};

// Empty string when the launch can run, else why not (shape, sizes).
std::string moe_gemm_unsupported_reason(const MoeGemmProblem& p);

// Which kernel kAuto picks for this problem (on the current device).
MoeKernel moe_pick_kernel(const MoeGemmProblem& p);
// Whether the wgmma kernel runs on the current device (SM 9.0; the build targets sm_90a).
bool moe_wgmma_available();

// out [rows, k] = x [rows, k] with every 64-column chunk in wgmma order (k % 64 == 0).
cudaError_t moe_w4a16_to_wgmma_order(const uint16_t* x, int rows, int k, uint16_t* out,
                                     cudaStream_t stream);

// GEMM1 + SiLU*up. x: [.., H] bf16 rows (via gather if given); act: [total_rows, I] bf16.
cudaError_t moe_w4a16_gemm1(const MoeGemmProblem& p, const MoeWeightsDevice& w,
                            const MoeRows& rows, const uint16_t* x, uint16_t* act,
                            cudaStream_t stream,
                            MoeKernel kernel = MoeKernel::kAuto);

// GEMM2. act: [total_rows, I] bf16; y: [total_rows, H], f32 when y_f32 else bf16.
cudaError_t moe_w4a16_gemm2(const MoeGemmProblem& p, const MoeWeightsDevice& w,
                            const MoeRows& rows, const uint16_t* act, void* y, bool y_f32,
                            cudaStream_t stream,
                            MoeKernel kernel = MoeKernel::kAuto);

// GEMM1 and GEMM2 in one launch at decode sizes (both on the decode kernel's default
// configuration): GEMM2's blocks wait per expert for GEMM1's instead of for its whole grid.
// Same results as moe_w4a16_gemm1 + moe_w4a16_gemm2 (y f32), bit for bit. p1 / p2: the two
// problems as for the separate calls; done [2 * slots] device counters, zero before the first
// launch (each launch leaves them zero).
bool moe_gemm_pair_fits(const MoeGemmProblem& p1, const MoeGemmProblem& p2);
// Whether the pair launch is expected to beat GEMM1 + GEMM2 (PDL) for `active_slots` experts with
// rows: when GEMM1's blocks need more than one wave and at most two (8 blocks per SM), GEMM2's
// early experts run during GEMM1's last wave instead of after it. Measured on the H200
// (bench/results/2026-12-01-session13-h200.md): GLM-5 1 token (1.09 waves) -8% for the layer,
// GLM-4.5-Air 2 tokens (1.3 waves) -3% per decode step; within one wave (Air 1 token) +6%, from
// 2.4 waves on (4-8 tokens) even to +1.5%.
bool moe_gemm_pair_preferred(const MoeGemmProblem& p1, int active_slots);
cudaError_t moe_w4a16_gemm_pair(const MoeGemmProblem& p1, const MoeGemmProblem& p2,
                                const MoeWeightsDevice& w, const MoeRows& rows,
                                const uint16_t* x, uint16_t* act, float* y, uint32_t* done,
                                cudaStream_t stream);

}  // namespace tetra
