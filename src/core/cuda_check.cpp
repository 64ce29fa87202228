#include "core/cuda_check.h"

#include <atomic>

namespace tetra {

bool cuda_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return count > 0;
}

int current_device_sm_count() {
  static std::atomic<int> cache[64] = {};  // per device ordinal; 0 = not read yet
  int dev = 0;
  TETRA_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 0 && dev < 64) {
    const int c = cache[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int sms = 0;
  TETRA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (dev >= 0 && dev < 64) cache[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace tetra
