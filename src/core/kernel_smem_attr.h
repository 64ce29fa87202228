// Kernel attributes set once per GPU (more than 48 KB of dynamic shared memory, large clusters).
// cudaFuncSetAttribute acts on the device that is current when it is called, so a per-process
// "done" flag leaves every other GPU without the opt-in (its launches then fail): remember it
// per device instead.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace tetra {

// Sets a function attribute of Kernel once per GPU (the attribute belongs to the device current
// when it is set, so a second GPU needs its own call). Kernel is the kernel itself (a template
// argument, so every kernel keeps its own flags: kernels of one signature share a function type,
// and a flag per type would skip all but the first). The first value set on a device stays.
template <auto Kernel, cudaFuncAttribute kAttr>
cudaError_t ensure_func_attribute(int value) {
  static std::atomic<uint64_t> done_devices{0};  // bit d: set on device d
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (done_devices.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  err = cudaFuncSetAttribute(Kernel, kAttr, value);
  if (err == cudaSuccess && bit != 0) done_devices.fetch_or(bit, std::memory_order_acq_rel);
  return err;
}

// Dynamic shared memory above 48 KB needs an opt-in per kernel and GPU.
template <auto Kernel>
cudaError_t ensure_max_dynamic_smem(int bytes) {
  return ensure_func_attribute<Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize>(bytes);
}

}  // namespace tetra
