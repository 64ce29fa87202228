// Every CUDA runtime call is checked; launchers return cudaError_t, callers turn it into Error.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "core/error.h"

#define TETRA_CUDA_CHECK(expr)                                                          \
  do {                                                                                  \
    cudaError_t tetra_err_ = (expr);                                                    \
    if (tetra_err_ != cudaSuccess)                                                      \
      ::tetra::detail::throw_error(__FILE__, __LINE__,                                  \
                                   ::tetra::str("CUDA error in " #expr ": ",            \
                                                cudaGetErrorString(tetra_err_)));       \
  } while (0)

// cudaMalloc(ptr, bytes), throwing tetra::Error with the size asked for and, when the device is
// out of memory, how much it has free: "which allocation, and how far off" from the message alone.
#define TETRA_CUDA_MALLOC(ptr, bytes) \
  ::tetra::detail::cuda_malloc(reinterpret_cast<void**>(ptr), (bytes), #ptr, __FILE__, __LINE__)

namespace tetra {
namespace detail {
void cuda_malloc(void** ptr, size_t bytes, const char* what, const char* file, int line);
// The message of a failed cudaMalloc(what, bytes); free / total: the device's memory
// (cudaMemGetInfo), or total == 0 where it could not be read.
std::string cuda_malloc_error(const char* what, size_t bytes, cudaError_t err, size_t free,
                              size_t total);
}  // namespace detail

// True when a CUDA device is present and usable; never throws (CPU-only machines answer false).
bool cuda_available();
// Multiprocessors of the current device, read once per device (launch shapes ask on every
// launch); throws tetra::Error when CUDA cannot say.
int current_device_sm_count();
// Shared memory per multiprocessor of the current device in bytes (228 KB on the H100/H200), read
// once per device; throws tetra::Error when CUDA cannot say.
int current_device_smem_per_sm();
// The most dynamic shared memory one block of the current device may opt in to, in bytes (227 KB
// on the H100/H200), read once per device; throws tetra::Error when CUDA cannot say.
int current_device_smem_optin_per_block();
// Compute capability of the current device as major * 10 + minor (90 = SM 9.0), read once per
// device (kernel choices ask on every launch); 0 when there is no usable device. Never throws.
int current_device_compute_capability();
}  // namespace tetra
