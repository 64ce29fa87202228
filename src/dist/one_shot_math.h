// The arithmetic of the one-shot all-reduce, shared by the CUDA kernel and its CPU twin so both
// give the same bits: inputs summed in float32 in rank order 0..N-1, rounded once to bf16.
#pragma once
#include <cstdint>

#include "core/float_rn.h"

namespace tetra::dist {

constexpr int kMaxPeerRanks = 8;      // GPUs in one one-shot group (one NVLink host)
constexpr int kMaxOneShotBlocks = 64;  // fixed grid of the kernel; flags are kept per block

// Epochs are 32-bit counters that wrap. A flag "has reached" epoch e when it equals e or is at
// most 2^31 ahead of it; a peer is never more than one call ahead, so this stays correct across
// the wrap from 0xFFFFFFFF to 0.
TETRA_HD bool epoch_reached(uint32_t flag, uint32_t epoch) {
  return static_cast<int32_t>(flag - epoch) >= 0;
}

// Which of the two data halves a call with this epoch writes: consecutive calls alternate, so a
// rank may start call e+1 while a slow peer still reads call e's half.
TETRA_HD uint32_t epoch_half(uint32_t epoch) { return epoch & 1u; }

}  // namespace tetra::dist
