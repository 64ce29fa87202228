// Host conversions of checkpoint tensors for the CPU backend: high-precision tensors to float32
// or bf16, NVFP4 linears dequantized to float32. Non-finite values are refused, naming the tensor.
#pragma once
#include <cstdint>
#include <vector>

#include "format/tensor_view.h"
#include "model/model_weights.h"

namespace tetra::model {

// [numel] float32 of a BF16/F16/F32 tensor.
std::vector<float> tensor_to_float(const TensorView& t);
// [numel] bf16 bits (RNE) of a BF16/F16/F32 tensor.
std::vector<uint16_t> tensor_to_bf16(const TensorView& t);
// [N, K] float32 weight of a linear (dequantized when NVFP4).
std::vector<float> linear_to_float(const LinearWeight& w);

}  // namespace tetra::model
