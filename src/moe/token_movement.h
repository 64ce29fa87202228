// Moving tokens into a layout's rows and back (CPU reference of ops/moe/permute.cu, combine.cu).
// Both layouts are addressed through slot_of [T*top_k] (row of pair p = t*top_k + k, -1 = none),
// so one permute and one combine serve contiguous and masked alike.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace tetra::moe {

// rows[slot_of[p]] = x[p / top_k] for every pair with slot_of[p] >= 0; other rows are untouched.
//   x    [T, H]               activations
//   rows [num_rows, H]        contiguous [S, H] or masked [E * max_m, H]
void permute_rows_cpu(const uint16_t* x_bf16, int T, int H, int top_k, const int32_t* slot_of,
                      uint16_t* rows_bf16);
void permute_rows_cpu(const float* x, int T, int H, int top_k, const int32_t* slot_of,
                      float* rows);

// Weighted gather-combine, deterministic (fixed order, no atomics). Per element, in float32:
//   acc = 0; for j in 0..top_k-1 with slot_of[t,j] >= 0: acc = fmaf(w[t,j], rows[slot_of[t,j]], acc)
//   acc = acc + shared[t] (if given); acc = acc + residual[t] (if given); out = bf16(acc) (RNE)
//   rows     [num_rows, H] bf16 or f32 (rows_dtype)   expert outputs in layout order
//   weights  [T, top_k] f32, or nullptr for weight 1
//   shared   [T, H] bf16 or nullptr    shared-expert output, added unweighted
//   residual [T, H] bf16 or nullptr
//   out      [T, H] bf16
void combine_bf16_cpu(const void* rows, DType rows_dtype, int T, int H, int top_k,
                      const int32_t* slot_of, const float* weights, const uint16_t* shared_bf16,
                      const uint16_t* residual_bf16, uint16_t* out_bf16);

// Same sum with float output and no extras: out [T, H] f32 (the float reference pipeline).
void combine_f32_cpu(const float* rows, int T, int H, int top_k, const int32_t* slot_of,
                     const float* weights, float* out);

}  // namespace tetra::moe
