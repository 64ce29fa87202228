// Per-block time stamps of the decode step's kernels (the q/k/v Rolling GEMV, the split decode
// attention, the o_proj streaming GEMV, the tiny MoE token path and the MoE decode GEMMs): a
// diagnostic compiled in with
// -DTETRA_BLOCK_STAMPS=ON (the kernels' stamp calls are empty otherwise) and switched on by
// `tetra bench decode --block-stamps PATH`. Thread 0 of every block records, at kernel exit, the
// global timer at phases of its own (see each kernel's stamp call) with its SM; the step's
// records go to a file that scripts/gpu/block_stamps.py reads. What it showed first: the
// attention's batch-1 blocks pairing up on the SMs the q/k/v GEMV freed first, and o_proj's
// consumers issue-bound for ~7 us after the attention (bench/results/2026-12-01-session18-h200.md).
//
// Record layout (kBlockStampWords u64 each): [kind << 56 | launch << 32 | block, smid, t0..t7],
// times in ns of %globaltimer, 0 where a kernel has fewer phases.
#pragma once
#include <string>

namespace tetra::perf {

enum BlockStampKind : int {
  kStampQkvGemv = 1,
  kStampAttention = 2,
  kStampStreamGemv = 3,
  kStampTokenPath = 4,  // the tiny MoE token path (router logits, routing, layout)
  kStampMoeGemm1 = 5,   // the MoE decode kernel, gated (GEMM1)
  kStampMoeGemm2 = 6,   // the MoE decode kernel, down projection (GEMM2)
};
inline constexpr int kBlockStampWords = 10;
inline constexpr unsigned long long kBlockStampCapacity = 1ull << 20;  // records

// Whether this build records stamps (TETRA_BLOCK_STAMPS).
bool block_stamps_compiled();
// Allocates the device buffer (before any graph capture: captured launches keep its address);
// throws when the build has no stamps.
void enable_block_stamps();
// The buffer for a launch's arguments, nullptr when not enabled.
unsigned long long* block_stamp_buffer();
// A number for each recorded launch (the record's `launch` field).
int next_block_stamp_launch();
void reset_block_stamps();
// Writes the records since the last reset (raw u64, kBlockStampWords per record) to `path`.
void dump_block_stamps(const std::string& path);

}  // namespace tetra::perf
