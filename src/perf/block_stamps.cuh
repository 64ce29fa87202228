// Device side of perf/block_stamps.h.
#pragma once
#include <cstdint>

#include "core/global_timer.cuh"
#include "perf/block_stamps.h"

namespace tetra::perf {

// A phase time for block_stamp: the global timer in stamp builds, 0 (and no instruction) else.
__device__ __forceinline__ uint64_t stamp_time() {
#ifdef TETRA_BLOCK_STAMPS
  return global_timer_ns();
#else
  return 0;
#endif
}

// One record for this block (call from one thread); nothing when buf is null or stamps are not
// compiled in.
__device__ __forceinline__ void block_stamp(unsigned long long* buf, int kind, int launch,
                                            uint64_t t0, uint64_t t1, uint64_t t2 = 0,
                                            uint64_t t3 = 0, uint64_t t4 = 0, uint64_t t5 = 0,
                                            uint64_t t6 = 0, uint64_t t7 = 0) {
#ifdef TETRA_BLOCK_STAMPS
  if (buf == nullptr) return;
  const unsigned long long i = atomicAdd(buf, 1ull);
  if (i >= kBlockStampCapacity) return;
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const unsigned long long block =
      blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * static_cast<unsigned long long>(blockIdx.z));
  unsigned long long* r = buf + 8 + i * kBlockStampWords;  // buf[0]: the record count
  r[0] = (static_cast<unsigned long long>(kind) << 56) |
         (static_cast<unsigned long long>(launch & 0xffffff) << 32) | (block & 0xffffffffull);
  r[1] = sm;
  r[2] = t0, r[3] = t1, r[4] = t2, r[5] = t3, r[6] = t4, r[7] = t5, r[8] = t6, r[9] = t7;
#else
  (void)buf, (void)kind, (void)launch, (void)t0, (void)t1, (void)t2, (void)t3, (void)t4, (void)t5,
      (void)t6, (void)t7;
#endif
}

}  // namespace tetra::perf
