#include "model/tensor_to_float.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "format/nvfp4.h"

namespace tetra::model {

std::vector<float> tensor_to_float(const TensorView& t) {
  const size_t n = size_t(t.numel());
  std::vector<float> out(n);  // [numel]
  for (size_t i = 0; i < n; ++i) {
    float f;
    switch (t.dtype) {
      case DType::BF16: {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        f = bf16_to_float(h);
        break;
      }
      case DType::F16: {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        f = f16_to_float(h);
        break;
      }
      case DType::F32: std::memcpy(&f, t.data + 4 * i, 4); break;
      default: TETRA_FAIL("tensor ", t.name, " has dtype ", dtype_name(t.dtype), ", expected BF16, F16 or F32");
    }
    if (!std::isfinite(f)) TETRA_FAIL("tensor ", t.name, " holds a non-finite value at element ", i);
    out[i] = f;
  }
  return out;
}

std::vector<uint16_t> tensor_to_bf16(const TensorView& t) {
  const std::vector<float> f = tensor_to_float(t);
  std::vector<uint16_t> out(f.size());  // [numel] bf16
  for (size_t i = 0; i < f.size(); ++i) out[i] = float_to_bf16(f[i]);
  return out;
}

std::vector<float> linear_to_float(const LinearWeight& w) {
  if (!w.quantized) {
    TETRA_CHECK_EQ(w.weight.numel(), w.out_features * w.in_features, "tensor ", w.weight.name);
    return tensor_to_float(w.weight);
  }
  std::vector<float> out(size_t(w.out_features * w.in_features));  // [N, K]
  nvfp4::dequantize_weight(w.weight.data, w.weight_scale->data, w.weight_scale_2, w.out_features,
                           w.in_features, out.data());
  return out;
}

}  // namespace tetra::model
