// NVFP4 weight quantization on the GPU for `tetra quantize`: same bytes as the CPU reference
// (format/nvfp4.h), much faster. Host buffers in, host buffers out; device buffers are kept and
// grown as tensors get larger, and all work runs on one private stream.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace tetra::nvfp4 {

class GpuWeightQuantizer {
 public:
  GpuWeightQuantizer();  // Error when no CUDA device is usable
  ~GpuWeightQuantizer();
  GpuWeightQuantizer(const GpuWeightQuantizer&) = delete;
  GpuWeightQuantizer& operator=(const GpuWeightQuantizer&) = delete;

  // Max |x| of host_src: [n] F32/F16/BF16. Error naming `tensor_name` on NaN/Inf (the same
  // message as the CPU amax) or on an unsupported dtype.
  float amax(const void* host_src, DType dtype, size_t n, std::string_view tensor_name);

  // host_src: [rows, cols] F32/F16/BF16, cols % 16 == 0; s2 > 0 finite.
  // host_packed: [rows, cols/2] e2m1 pairs (low nibble = even column); host_scales: [rows, cols/16]
  // e4m3 plain. Error on NaN/Inf input (the same message as the CPU quantize_weight).
  void quantize(const void* host_src, DType dtype, int64_t rows, int64_t cols, float s2,
                uint8_t* host_packed, uint8_t* host_scales);

 private:
  // Makes *buf hold at least `bytes` device bytes (contents are not kept).
  void reserve(void** buf, size_t* capacity, size_t bytes);

  cudaStream_t stream_ = nullptr;
  void* d_src_ = nullptr;  // [src_capacity_] bytes of input
  size_t src_capacity_ = 0;
  void* d_packed_ = nullptr;  // [packed_capacity_] bytes: e2m1 pairs
  size_t packed_capacity_ = 0;
  void* d_scales_ = nullptr;  // [scales_capacity_] bytes: e4m3 block scales
  size_t scales_capacity_ = 0;
  float* d_amax_ = nullptr;     // [1]
  int* d_nonfinite_ = nullptr;  // [1]
  float* h_amax_ = nullptr;     // [1] pinned
  int* h_nonfinite_ = nullptr;  // [1] pinned
};

}  // namespace tetra::nvfp4
