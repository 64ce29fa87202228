// CUDA twins of the NVFP4 CPU reference (format/nvfp4.h, format/scale_layout.h).
// All pointers are device pointers; every launcher is asynchronous on `stream` and returns the
// launch error (cudaErrorInvalidValue for shapes or scales the CPU reference would refuse).
// Outputs are byte-identical to the CPU reference: both run the shared per-element math in
// format/nvfp4.h. 16-byte vector loads are used when the pointers are aligned (cudaMalloc'd
// buffers always are); otherwise a scalar path gives the same bytes.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace tetra::nvfp4::cuda {

// src: [n] F32/F16/BF16. Writes *d_amax = max |x| over the finite elements, *d_nonfinite = 1 if
// any element is NaN or Inf (else 0). Both outputs are reset on `stream` first.
cudaError_t amax(const void* src, DType dtype, int64_t n, float* d_amax, int* d_nonfinite,
                 cudaStream_t stream);

// src: [rows, cols] F32/F16/BF16, cols % 16 == 0; s2 > 0 finite.
// packed: [rows, cols/2] e2m1 pairs, low nibble = even column; scales: [rows, cols/16] e4m3 plain.
// When d_nonfinite is given, it is set to 1 if any element is NaN/Inf (it is NOT reset here).
cudaError_t quantize_weight(const void* src, DType dtype, int64_t rows, int64_t cols, float s2,
                            uint8_t* packed, uint8_t* scales, cudaStream_t stream,
                            int* d_nonfinite = nullptr);

// packed: [rows, cols/2]; scales: [rows, cols/16] e4m3 plain; out: [rows, cols] float.
cudaError_t dequantize_weight(const uint8_t* packed, const uint8_t* scales, float s2, int64_t rows,
                              int64_t cols, float* out, cudaStream_t stream);
// Same, out: [rows, cols] bf16 bits (RNE of the float value).
cudaError_t dequantize_weight_bf16(const uint8_t* packed, const uint8_t* scales, float s2,
                                   int64_t rows, int64_t cols, uint16_t* out, cudaStream_t stream);

// W4A4 activation quantization; src: [rows, cols] F32/F16/BF16, cols % 16 == 0; input_scale > 0
// with a finite reciprocal.
// packed: [rows, cols/2]; scales: [rows, cols/16] e4m3 plain.
cudaError_t quantize_activation(const void* src, DType dtype, int64_t rows, int64_t cols,
                                float input_scale, uint8_t* packed, uint8_t* scales,
                                cudaStream_t stream);

// plain: [batch, rows, kb] e4m3; swizzled: [batch, swizzled_scale_bytes(rows, kb)], padding = 0.
cudaError_t swizzle_scales(const uint8_t* plain, int64_t batch, int64_t rows, int64_t kb,
                           uint8_t* swizzled, cudaStream_t stream);
// Inverse of swizzle_scales (padding ignored).
cudaError_t unswizzle_scales(const uint8_t* swizzled, int64_t batch, int64_t rows, int64_t kb,
                             uint8_t* plain, cudaStream_t stream);

}  // namespace tetra::nvfp4::cuda
