#include "ops/nvfp4/gpu_quantizer.h"

#include "core/cuda_check.h"
#include "core/error.h"
#include "format/nvfp4.h"
#include "ops/nvfp4/nvfp4_cuda.h"

namespace tetra::nvfp4 {

GpuWeightQuantizer::GpuWeightQuantizer() {
  if (!cuda_available()) TETRA_FAIL("GPU NVFP4 quantizer: no usable CUDA device");
  TETRA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  TETRA_CUDA_MALLOC(&d_amax_, sizeof(float));
  TETRA_CUDA_MALLOC(&d_nonfinite_, sizeof(int));
  TETRA_CUDA_CHECK(cudaMallocHost(&h_amax_, sizeof(float)));
  TETRA_CUDA_CHECK(cudaMallocHost(&h_nonfinite_, sizeof(int)));
}

GpuWeightQuantizer::~GpuWeightQuantizer() {
  // Errors are ignored: a destructor must not throw, and the process may be tearing down CUDA.
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  cudaFree(d_src_);
  cudaFree(d_packed_);
  cudaFree(d_scales_);
  cudaFree(d_amax_);
  cudaFree(d_nonfinite_);
  cudaFreeHost(h_amax_);
  cudaFreeHost(h_nonfinite_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void GpuWeightQuantizer::reserve(void** buf, size_t* capacity, size_t bytes) {
  if (bytes <= *capacity) return;
  // The stream may still read the old buffer; cudaFree waits for the device, but be explicit.
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  TETRA_CUDA_CHECK(cudaFree(*buf));
  *buf = nullptr;
  *capacity = 0;
  const size_t grown = bytes + bytes / 4;  // headroom: the next tensor is often a bit larger
  TETRA_CUDA_MALLOC(buf, grown);
  *capacity = grown;
}

float GpuWeightQuantizer::amax(const void* host_src, DType dtype, size_t n,
                               std::string_view tensor_name) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16)
    return nvfp4::amax(host_src, dtype, n, tensor_name);  // throws the CPU path's dtype error
  if (n == 0) return 0.0f;
  const size_t bytes = n * dtype_size(dtype);
  reserve(&d_src_, &src_capacity_, bytes);
  TETRA_CUDA_CHECK(cudaMemcpyAsync(d_src_, host_src, bytes, cudaMemcpyHostToDevice, stream_));
  TETRA_CUDA_CHECK(cuda::amax(d_src_, dtype, int64_t(n), d_amax_, d_nonfinite_, stream_));
  TETRA_CUDA_CHECK(
      cudaMemcpyAsync(h_amax_, d_amax_, sizeof(float), cudaMemcpyDeviceToHost, stream_));
  TETRA_CUDA_CHECK(
      cudaMemcpyAsync(h_nonfinite_, d_nonfinite_, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (*h_nonfinite_ != 0) {
    // Rare path: let the CPU scan find the element, so the error reads exactly as on the CPU.
    nvfp4::amax(host_src, dtype, n, tensor_name);
    TETRA_FAIL("tensor '", tensor_name,
               "' holds NaN or Inf; NVFP4 quantization needs finite weights");
  }
  return *h_amax_;
}

void GpuWeightQuantizer::quantize(const void* host_src, DType dtype, int64_t rows, int64_t cols,
                                  float s2, uint8_t* host_packed, uint8_t* host_scales) {
  check_quant_input(dtype, rows, cols, "quantize_weight");
  check_positive_scale(s2, "weight_scale_2", "quantize_weight");
  const size_t n = size_t(rows) * size_t(cols);
  if (n == 0) return;
  const size_t src_bytes = n * dtype_size(dtype);
  const size_t packed_bytes = n / 2;
  const size_t scale_bytes = n / kBlock;
  reserve(&d_src_, &src_capacity_, src_bytes);
  reserve(&d_packed_, &packed_capacity_, packed_bytes);
  reserve(&d_scales_, &scales_capacity_, scale_bytes);
  auto* d_packed = static_cast<uint8_t*>(d_packed_);
  auto* d_scales = static_cast<uint8_t*>(d_scales_);
  TETRA_CUDA_CHECK(cudaMemsetAsync(d_nonfinite_, 0, sizeof(int), stream_));
  TETRA_CUDA_CHECK(cudaMemcpyAsync(d_src_, host_src, src_bytes, cudaMemcpyHostToDevice, stream_));
  TETRA_CUDA_CHECK(cuda::quantize_weight(d_src_, dtype, rows, cols, s2, d_packed, d_scales, stream_,
                                         d_nonfinite_));
  TETRA_CUDA_CHECK(
      cudaMemcpyAsync(h_nonfinite_, d_nonfinite_, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  TETRA_CUDA_CHECK(
      cudaMemcpyAsync(host_packed, d_packed, packed_bytes, cudaMemcpyDeviceToHost, stream_));
  TETRA_CUDA_CHECK(
      cudaMemcpyAsync(host_scales, d_scales, scale_bytes, cudaMemcpyDeviceToHost, stream_));
  TETRA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (*h_nonfinite_ != 0) {
    // Rare path: the CPU reference names the row and column in its error.
    nvfp4::quantize_weight(host_src, dtype, rows, cols, s2, host_packed, host_scales);
    TETRA_FAIL("quantize_weight: the input holds NaN or Inf");
  }
}

}  // namespace tetra::nvfp4
