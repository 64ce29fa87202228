#include "tools/weight_quantizer.h"

#include <algorithm>
#include <mutex>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/parallel.h"
#include "format/nvfp4.h"
#include "ops/nvfp4/gpu_quantizer.h"

namespace tetra {
namespace {

class CpuQuantizer : public WeightQuantizer {
 public:
  std::string device() const override { return str("cpu (", hardware_threads(), " threads)"); }

  float amax(const void* src, DType dtype, size_t n, std::string_view tensor) override {
    float result = 0.0f;
    std::mutex m;
    const size_t esize = dtype_size(dtype);
    parallel_for(int64_t(n), 1 << 20, [&](int64_t begin, int64_t end) {
      const auto* p = static_cast<const uint8_t*>(src) + begin * esize;
      const float local = nvfp4::amax(p, dtype, size_t(end - begin), tensor);
      std::lock_guard<std::mutex> lock(m);
      result = std::max(result, local);
    });
    return result;
  }

  void quantize(const void* src, DType dtype, int64_t rows, int64_t cols, float s2,
                uint8_t* packed, uint8_t* scales) override {
    const size_t esize = dtype_size(dtype);
    parallel_for(rows, std::max<int64_t>(1, (1 << 18) / std::max<int64_t>(cols, 1)),
                 [&](int64_t r0, int64_t r1) {
                   nvfp4::quantize_weight(static_cast<const uint8_t*>(src) + r0 * cols * esize,
                                          dtype, r1 - r0, cols, s2, packed + r0 * cols / 2,
                                          scales + r0 * cols / nvfp4::kBlock);
                 });
  }
};

class CudaQuantizer : public WeightQuantizer {
 public:
  std::string device() const override {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "cuda";
    return str("cuda (", prop.name, ")");
  }
  float amax(const void* src, DType dtype, size_t n, std::string_view tensor) override {
    return impl_.amax(src, dtype, n, tensor);
  }
  void quantize(const void* src, DType dtype, int64_t rows, int64_t cols, float s2,
                uint8_t* packed, uint8_t* scales) override {
    impl_.quantize(src, dtype, rows, cols, s2, packed, scales);
  }

 private:
  nvfp4::GpuWeightQuantizer impl_;
};

}  // namespace

std::unique_ptr<WeightQuantizer> make_weight_quantizer(std::string_view device) {
  if (device == "cpu") return std::make_unique<CpuQuantizer>();
  if (device == "cuda" || device == "auto") {
    if (cuda_available()) return std::make_unique<CudaQuantizer>();
    if (device == "cuda") TETRA_FAIL("--device cuda: no CUDA GPU is available on this machine");
    return std::make_unique<CpuQuantizer>();
  }
  TETRA_FAIL("unknown device '", device, "' (expected auto, cpu or cuda)");
}

}  // namespace tetra
