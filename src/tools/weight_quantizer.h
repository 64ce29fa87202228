// NVFP4 weight quantization of whole tensors, on the GPU when there is one, else on all CPU
// cores. Both produce identical bytes (the CUDA kernels are tested byte-exact against the CPU).
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace tetra {

class WeightQuantizer {
 public:
  virtual ~WeightQuantizer() = default;
  virtual std::string device() const = 0;
  // max |x|; Error naming the tensor on NaN/Inf
  virtual float amax(const void* src, DType dtype, size_t n, std::string_view tensor) = 0;
  // src [rows, cols] -> packed [rows, cols/2] e2m1 pairs, scales [rows, cols/16] e4m3
  virtual void quantize(const void* src, DType dtype, int64_t rows, int64_t cols, float s2,
                        uint8_t* packed, uint8_t* scales) = 0;
};

// device: "auto" (CUDA when available), "cpu" or "cuda" (Error when no GPU).
std::unique_ptr<WeightQuantizer> make_weight_quantizer(std::string_view device);

}  // namespace tetra
