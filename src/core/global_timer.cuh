// The GPU's global nanosecond timer (%globaltimer), comparable across SMs: for in-kernel phase
// stamps and timeouts.
#pragma once
#include <cstdint>

namespace tetra {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace tetra
