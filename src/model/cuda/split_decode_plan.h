// The split decode attention's per-step plan (the plan / run split of FlashInfer's decode):
// where each block of split_decode_attention works and which cache rows its first chunks are.
// Read by the kernel itself, that is two dependent memory round trips at the head of every
// layer's attention (the sequence length, then the block-table rows), issued while the q/k/v
// projection before it still streams its weights. The host has both at hand and one plan
// serves every layer of a decode step, so CudaModelOps::stage writes it with the step's arrays
// and the kernel's prologue needs one round trip (H200, GLM-4.5-Air batch 1: the same step with
// the table lookups left out was 1.1% faster, batch 2 2%;
// bench/results/2026-12-01-session23-h200.md).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/host_device.h"

namespace tetra::model::cuda {

inline constexpr int kSplitAlign = 16;      // split ranges start on a warp's 16 tokens
inline constexpr int kSplitPlanRows = 192;  // the first three 64-token chunks of a block

// A block's entry starts with its range and its sequence's length (one 16-byte load).
struct alignas(16) SplitPlanHeader {
  int32_t begin, end, len, unused;
};
inline constexpr int kSplitPlanHeader = int(sizeof(SplitPlanHeader) / sizeof(int32_t));
inline constexpr int kSplitPlanInts = kSplitPlanHeader + kSplitPlanRows;  // per block

// Tokens [begin, end) of split `split` of `splits` over a sequence of `len` tokens: equal ranges
// rounded up to kSplitAlign tokens, so the last splits of a short sequence are empty.
struct SplitRange {
  int begin, end;
};
TETRA_HD SplitRange split_range(int len, int splits, int split) {
  const int per = (len + splits - 1) / splits;
  const int span = (per + kSplitAlign - 1) / kSplitAlign * kSplitAlign;
  const int begin = split * span < len ? split * span : len;
  return {begin, begin + span < len ? begin + span : len};
}

// Ints of the plan of num_seqs sequences at `splits` splits.
size_t split_decode_plan_ints(int num_seqs, int splits);

// plan [num_seqs][splits][kSplitPlanInts], block (s, r): its SplitPlanHeader (the range of
// split_range(lens[s], splits, r)), then the cache row (tables[s][tok / block_size] * block_size +
// tok % block_size) of tokens begin .. begin + kSplitPlanRows - 1, -1 from `end` on.
// tables [num_seqs][max_blocks]. Throws tetra::Error on a length or table entry out of range.
void build_split_decode_plan(const int32_t* lens, const int32_t* tables, int max_blocks,
                             int block_size, int num_seqs, int splits, int32_t* plan);

}  // namespace tetra::model::cuda
