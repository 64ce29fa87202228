// Atomics with explicit memory-order semantics (PTX), for hand-offs between the blocks of a grid.
#pragma once
#include <cstdint>

namespace tetra {

// *p += v at GPU scope with acquire and release semantics; returns the old value. As a "last
// block" count: the release publishes the stores the calling thread has observed (a block's
// stores, once a __syncthreads orders them before it: release is cumulative), and the acquire
// lets the thread that counts last (and, after a __syncthreads, its block) see every counted
// block's stores. It replaces a __threadfence by each writer and one by the last block.
__device__ __forceinline__ uint32_t atomic_add_acq_rel_gpu(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(p), "r"(v)
               : "memory");
  return old;
}

}  // namespace tetra
