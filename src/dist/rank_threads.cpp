#include "dist/rank_threads.h"

#include <cuda_runtime.h>

#include <exception>
#include <thread>

#include "core/cuda_check.h"

namespace tetra::dist {

void run_on_ranks(const std::vector<int>& devices, const std::function<void(int rank)>& fn) {
  const int n = int(devices.size());
  std::vector<std::exception_ptr> errors(devices.size());
  std::vector<std::thread> threads;
  threads.reserve(size_t(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        TETRA_CUDA_CHECK(cudaSetDevice(devices[size_t(r)]));
        fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

int visible_gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the "no device" error
    return 0;
  }
  return count;
}

std::vector<int> first_devices(int n) {
  std::vector<int> d;
  for (int i = 0; i < n; ++i) d.push_back(i);
  return d;
}

}  // namespace tetra::dist
