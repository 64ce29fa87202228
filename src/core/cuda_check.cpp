#include "core/cuda_check.h"

#include <atomic>
#include <cstdio>

namespace tetra {

namespace detail {

namespace {
std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / (1024.0 * 1024.0));
  return buf;
}
}  // namespace

std::string cuda_malloc_error(const char* what, size_t bytes, cudaError_t err, size_t free,
                              size_t total) {
  std::string msg = str("CUDA error in cudaMalloc(", what, ", ", mib(bytes), "): ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation && total > 0)
    msg += str(" (the device has ", mib(free), " free of ", mib(total), ")");
  return msg;
}

void cuda_malloc(void** ptr, size_t bytes, const char* what, const char* file, int line) {
  const cudaError_t err = cudaMalloc(ptr, bytes);
  if (err == cudaSuccess) return;
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    total = 0;
  }
  throw_error(file, line, cuda_malloc_error(what, bytes, err, free, total));
}

}  // namespace detail

bool cuda_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

namespace {

// cache[dev] (0 = not read yet) or, the first time, read() stored there when it is > 0.
template <typename Read>
int read_once(std::atomic<int> (&cache)[64], int dev, Read read) {
  const bool cached = dev >= 0 && dev < 64;
  if (cached) {
    const int c = cache[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  const int v = read();
  if (cached && v > 0) cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

}  // namespace

namespace {
// Attribute `kAttr` of the current device, read once per device; throws when CUDA cannot say.
template <cudaDeviceAttr kAttr>
int current_device_attribute() {
  static std::atomic<int> cache[64] = {};  // per device ordinal
  int dev = 0;
  TETRA_CUDA_CHECK(cudaGetDevice(&dev));
  return read_once(cache, dev, [dev] {
    int v = 0;
    TETRA_CUDA_CHECK(cudaDeviceGetAttribute(&v, kAttr, dev));
    return v;
  });
}
}  // namespace

int current_device_sm_count() {
  return current_device_attribute<cudaDevAttrMultiProcessorCount>();
}

int current_device_smem_per_sm() {
  return current_device_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>();
}

int current_device_smem_optin_per_block() {
  return current_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>();
}

int current_device_compute_capability() {
  static std::atomic<int> cache[64] = {};  // per device ordinal
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return read_once(cache, dev, [dev] {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return major * 10 + minor;
  });
}

}  // namespace tetra
