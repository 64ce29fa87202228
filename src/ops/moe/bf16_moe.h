// BF16 grouped MoE GEMMs for SM90 (unquantized checkpoints): bf16 expert weights times bf16
// activations, fp32 accumulation, mma.sync m16n8k16 tensor cores.
//   GEMM1: act[r, :] = silu(x[r] . gate_e^T) * (x[r] . up_e^T)     bf16 [rows, I]
//   GEMM2: y[r, :]   = act[r] . down_e^T                             f32 or bf16 [rows, H]
// Same problem description and row mapping as the W4A16 GEMMs (ops/moe/w4a16_moe.h: MoeGemmProblem,
// MoeRows): rows of expert e are [row_start[e], row_start[e] + row_count[e]), counts are read on
// the device (no host sync: the masked layout's launch is static, CUDA-graph capturable; the
// contiguous layout too, given a row bound). GEMM1 may read x through rows.gather.
//
// Kernel: one block = 128 weight rows (GEMM1: 64 gate + the same 64 up rows, so SiLU*up happens in
// registers) x 64 token rows, k in steps of 64 through a 3-stage cp.async pipeline, 4 warps.
// Token tiles of an expert are strided over grid.z, so any row count runs without a host sync.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/moe/w4a16_moe.h"

namespace tetra {

struct MoeBf16WeightsDevice {
  const uint16_t* w13 = nullptr;  // [E, 2I, H] bf16: rows 0..I-1 gate_proj, I..2I-1 up_proj
  const uint16_t* w2 = nullptr;   // [E, H, I] bf16 down_proj
};

// Dynamic shared memory of one block (the backend declaration quotes it).
inline constexpr int kMoeBf16SmemBytes = 3 * (128 + 64) * (64 + 8) * 2;  // 82,944 B

// Empty when the launch can run, else why not: H and I must be multiples of 8 (16-byte rows).
std::string moe_bf16_unsupported_reason(const MoeGemmProblem& p);

// x: [.., H] bf16 rows (via rows.gather if set); act: [total_rows, I] bf16.
cudaError_t moe_bf16_gemm1(const MoeGemmProblem& p, const MoeBf16WeightsDevice& w,
                           const MoeRows& rows, const uint16_t* x, uint16_t* act,
                           cudaStream_t stream);

// act: [total_rows, I] bf16; y: [total_rows, H], f32 when y_f32 else bf16.
cudaError_t moe_bf16_gemm2(const MoeGemmProblem& p, const MoeBf16WeightsDevice& w,
                           const MoeRows& rows, const uint16_t* act, void* y, bool y_f32,
                           cudaStream_t stream);

}  // namespace tetra
