// Which (expert, token tile) a grid row of the large-M W4A16 kernels computes (tiled, wgmma): the
// grid has an upper bound of rows (total rows / tile + slots) and each block finds its own tile by
// a block-wide scan over the slots' tile counts, so the launch needs no host sync and can be
// captured in a CUDA graph.
#pragma once
#include <cub/block/block_scan.cuh>

#include "ops/moe/w4a16_launch.h"

namespace tetra::moe_detail {

template <int kThreads>
struct GridRowTile {
  using Scan = cub::BlockScan<int, kThreads>;
  struct Shared {
    typename Scan::TempStorage scan;
    int expert, tok0;
  };

  // Grid row y's expert (-1: no tile; the block has nothing to do) and first token, for token
  // tiles of kRows rows. Every thread of the block calls it; the answer is in s.expert / s.tok0
  // after it returns.
  template <int kRows>
  __device__ static void find(const GroupedGemmArgs& a, int y, Shared& s) {
    const int tid = int(threadIdx.x);
    if (tid == 0) s.expert = -1;
    int carry = 0;
    for (int base = 0; base < a.num_slots; base += kThreads) {
      const int slot = base + tid;
      int e = -1, n = 0;
      if (slot < a.num_slots) {
        e = a.rows.expert_ids ? a.rows.expert_ids[slot] : slot;
        if (e >= 0) n = (a.rows.row_count[e] + kRows - 1) / kRows;
      }
      int off, total;
      Scan(s.scan).ExclusiveSum(n, off, total);
      if (n > 0 && y >= carry + off && y < carry + off + n) {
        s.expert = e;
        s.tok0 = (y - carry - off) * kRows;
      }
      carry += total;
      __syncthreads();  // scan storage reuse; also publishes s.expert
      if (carry > y) break;
    }
    __syncthreads();
  }
};

}  // namespace tetra::moe_detail
