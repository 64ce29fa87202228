// Device array with guard elements on both sides, for gpu tests: a kernel that writes out of
// bounds changes the guard bytes, which guards_intact() checks after the launch.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"

namespace tetra::test {

inline constexpr unsigned char kGuardByte = 0xA5;

// Device array with guard elements on both sides (checked after every launch).
template <typename T>
class GuardedDeviceArray {
 public:
  static constexpr size_t kGuard = 64;  // elements per side; keeps ptr() 16-byte aligned
  explicit GuardedDeviceArray(size_t n) : n_(n) {
    TETRA_CUDA_CHECK(cudaMalloc(&base_, bytes_total()));
    TETRA_CUDA_CHECK(cudaMemset(base_, kGuardByte, bytes_total()));
  }
  explicit GuardedDeviceArray(const std::vector<T>& v) : GuardedDeviceArray(v.size()) { upload(v); }
  GuardedDeviceArray(const GuardedDeviceArray&) = delete;
  GuardedDeviceArray& operator=(const GuardedDeviceArray&) = delete;
  ~GuardedDeviceArray() { cudaFree(base_); }
  T* ptr() { return base_ + kGuard; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& v) {
    TETRA_CHECK_EQ(v.size(), n_);
    TETRA_CUDA_CHECK(cudaMemcpy(ptr(), v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  void poison() { TETRA_CUDA_CHECK(cudaMemset(ptr(), 0xFF, n_ * sizeof(T))); }
  std::vector<T> download() {
    std::vector<T> v(n_);
    TETRA_CUDA_CHECK(cudaMemcpy(v.data(), ptr(), n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  bool guards_intact() {
    std::vector<unsigned char> all(bytes_total());
    TETRA_CUDA_CHECK(cudaMemcpy(all.data(), base_, all.size(), cudaMemcpyDeviceToHost));
    const size_t g = kGuard * sizeof(T);
    for (size_t i = 0; i < g; ++i)
      if (all[i] != kGuardByte || all[all.size() - 1 - i] != kGuardByte) return false;
    return true;
  }

 private:
  size_t bytes_total() const { return (n_ + 2 * kGuard) * sizeof(T); }
  size_t n_;
  T* base_ = nullptr;
};

}  // namespace tetra::test
