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

// Polls for a count without ordering (served by L2): an acquire per poll would order, and on
// SM90 invalidate the SM's L1, every time. Follow the poll that succeeds with one fence_acq_rel_gpu.
__device__ __forceinline__ uint32_t ld_relaxed_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
// *p += v at GPU scope with release semantics, no result (an arrival).
__device__ __forceinline__ void red_add_release_gpu(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

}  // namespace tetra
