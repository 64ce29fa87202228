// See split_decode_plan.h.
#include "model/cuda/split_decode_plan.h"

#include <cstring>

#include "core/error.h"
#include "model/cuda/split_decode_attention.h"

namespace tetra::model::cuda {

size_t split_decode_plan_ints(int num_seqs, int splits) {
  return size_t(num_seqs < 0 ? 0 : num_seqs) * size_t(splits < 0 ? 0 : splits) * kSplitPlanInts;
}

void build_split_decode_plan(const int32_t* lens, const int32_t* tables, int max_blocks,
                             int block_size, int num_seqs, int splits, int32_t* plan) {
  TETRA_CHECK(splits >= 1 && splits <= kMaxSplits && block_size > 0 && max_blocks > 0 &&
                  num_seqs >= 0,
              "split decode plan: splits ", splits, ", block_size ", block_size, ", max_blocks ",
              max_blocks, ", seqs ", num_seqs);
  for (int s = 0; s < num_seqs; ++s) {
    const int len = lens[s];
    TETRA_CHECK(len >= 0 && int64_t(len) <= int64_t(max_blocks) * block_size,
                "split decode plan: sequence ", s, " has ", len, " tokens; its table holds ",
                int64_t(max_blocks) * block_size);
    const int32_t* table = tables + size_t(s) * max_blocks;
    for (int r = 0; r < splits; ++r) {
      const SplitRange range = split_range(len, splits, r);
      int32_t* p = plan + (size_t(s) * splits + r) * kSplitPlanInts;
      const SplitPlanHeader header{range.begin, range.end, len, 0};
      std::memcpy(p, &header, sizeof(header));  // the caller's array may be only 4-byte aligned
      // Token tok = begin + j sits at offset `off` of table entry `b` (no division per token:
      // at batch 64 a step plans ~12k rows on the host between its launches).
      int b = range.begin / block_size, off = range.begin % block_size;
      for (int j = 0; j < kSplitPlanRows; ++j, ++off) {
        if (off == block_size) ++b, off = 0;
        int32_t row = -1;
        if (range.begin + j < range.end) {
          TETRA_CHECK(table[b] >= 0, "split decode plan: sequence ", s, " token ",
                      range.begin + j, " has no cache block");
          row = table[b] * block_size + off;
        }
        p[kSplitPlanHeader + j] = row;
      }
    }
  }
}

}  // namespace tetra::model::cuda
