// A plain owned device allocation (cudaMalloc), movable, freed on destruction.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "core/cuda_check.h"

namespace tetra::model::cuda {

class DeviceMem {
 public:
  DeviceMem() = default;
  explicit DeviceMem(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) TETRA_CUDA_MALLOC(&p_, bytes);
  }
  ~DeviceMem() { cudaFree(p_); }
  DeviceMem(DeviceMem&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    if (this != &o) {
      cudaFree(p_);
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;

  template <typename T = void>
  T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }
  bool empty() const { return p_ == nullptr; }
  void upload(const void* src, size_t n) {
    TETRA_CHECK_LE(n, bytes_);
    TETRA_CUDA_CHECK(cudaMemcpy(p_, src, n, cudaMemcpyHostToDevice));
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tetra::model::cuda
