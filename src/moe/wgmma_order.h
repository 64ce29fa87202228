// "wgmma order" of an activation row: the column order in which the warpgroup-MMA W4A16 kernel
// (ops/moe/w4a16_wgmma.cu) reads activations with plain 16-byte copies.
//
// The packed weights (moe/expert_weights.h, fragment order) give lane t of k-step j the k values
// 64c + 16t + 4j + {0..3} of chunk c; the mma.m16n8k16 fragment calls them logical k 2t + {0,1}
// (p = 0, 1) and 2t + 8 + {0,1} (p = 2, 3) of that k-step. wgmma reads its B operand (the
// activations) from shared memory in 8-column groups, logical k 0..7 then 8..15 of each k-step,
// so the kernel wants each 64-column chunk stored as the k-steps' logical columns in order:
// physical column e = 16t + 4j + 2h + b (h: second register pair, b: low bit) sits at
// position 16j + 8h + 2t + b. Equivalently the 4-byte unit u = e / 2 moves to unit
// 4 (u % 8) + u / 8, so 16-byte group g of a reordered chunk holds the units u with u % 8 == g.
#pragma once
#include "core/host_device.h"

namespace tetra {

inline constexpr int kWgmmaOrderChunk = 64;  // columns per reordered chunk (the k of one chunk)

// Position in wgmma order of natural column e of a row (columns permute within 64-chunks).
TETRA_HD constexpr int wgmma_order_column(int e) {
  const int c = e / kWgmmaOrderChunk, u = (e % kWgmmaOrderChunk) / 2;
  return c * kWgmmaOrderChunk + 2 * (4 * (u % 8) + u / 8) + (e & 1);
}

// The 4-byte unit (bf16 pair) of a wgmma-ordered row that holds elements 2j and 2j + 1 of the
// row's 16-element block b (natural columns 16b + 2j, +1): what an NVFP4 block quantizer reads
// and writes when the row is in wgmma order.
TETRA_HD constexpr int wgmma_order_block_unit(int b, int j) {
  return wgmma_order_column(16 * b + 2 * j) / 2;
}

}  // namespace tetra
