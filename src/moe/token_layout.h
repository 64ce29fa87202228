// Token layouts for the expert GEMMs: which (token, k) pair lands in which row of the GEMM input.
//
// A "pair" p = t * top_k + k is token t's k-th chosen expert ids[p]. Two layouts:
//  - contiguous: rows sorted by expert, S = T*top_k rows in total; expert e owns rows
//    [offsets[e], offsets[e+1]). Compact; shapes depend on the routing (good for prefill).
//  - masked: a [E, max_m, H] buffer; expert e owns rows e*max_m .. e*max_m + masked_m[e] - 1.
//    Static shapes that a CUDA graph can capture, as DeepEP low-latency dispatch produces.
// Within an expert, rows follow the pair order (token, then k): the sort is stable, so the CPU
// and the GPU builders agree row for row.
//
// Grouped GEMMs read both layouts through ONE mechanism: a RowRange per expert.
//   contiguous -> {offsets[e], offsets[e+1] - offsets[e]};  masked -> {e * max_m, masked_m[e]}
#pragma once
#include <cstdint>
#include <vector>

namespace tetra::moe {

// Rows [start, start + count) of the layout buffer belong to one expert. Trivially copyable, so a
// device array of them ([E] RowRange = [E, 2] int32) is what GPU builders write.
struct RowRange {
  int32_t start;
  int32_t count;
};
static_assert(sizeof(RowRange) == 8, "RowRange must be two packed int32 ([E, 2] on the device)");

struct ContiguousLayout {
  int num_tokens = 0, top_k = 0, num_experts = 0;
  std::vector<int32_t> expert_offsets;  // [E + 1] expert e owns rows [offsets[e], offsets[e+1])
  std::vector<int32_t> slot_token;      // [S = T*top_k] token whose activation row r holds
  std::vector<int32_t> slot_of;         // [T*top_k] row of pair p = t*top_k + k
  int num_rows() const { return expert_offsets.empty() ? 0 : expert_offsets.back(); }
  std::vector<RowRange> expert_rows() const;  // [E]
};

struct MaskedLayout {
  int num_tokens = 0, top_k = 0, num_experts = 0;
  int max_m = 0;                    // rows reserved per expert
  std::vector<int32_t> masked_m;    // [E] rows used by expert e (<= max_m)
  std::vector<int32_t> row_token;   // [E * max_m] token of each row, -1 where the row is empty
  std::vector<int32_t> slot_of;     // [T*top_k] row e*max_m + r of pair p = t*top_k + k
  int num_rows() const { return num_experts * max_m; }
  std::vector<RowRange> expert_rows() const;  // [E]
};

// ids [T, top_k] int32, each in [0, E) (anything else is an Error naming token and slot).
ContiguousLayout build_contiguous_cpu(const int32_t* ids, int T, int top_k, int E);
// Error if any expert receives more than max_m pairs (the GPU builder drops and counts them).
MaskedLayout build_masked_cpu(const int32_t* ids, int T, int top_k, int E, int max_m);

}  // namespace tetra::moe
