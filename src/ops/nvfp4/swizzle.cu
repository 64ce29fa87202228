// CUDA plain <-> 128x4 swizzled block-scale conversion (offset formula in format/scale_layout.h).
#include <cstdint>

#include "format/scale_layout.h"
#include "ops/nvfp4/nvfp4_cuda.h"

namespace tetra::nvfp4::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65536;

int grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return int(blocks < kMaxGrid ? blocks : kMaxGrid);
}

// One thread per byte of the padded output [batch, rows_pad, kb_pad], so padding gets its zeros.
__global__ void __launch_bounds__(kThreads)
    swizzle_kernel(const uint8_t* plain, int64_t batch, int64_t rows, int64_t kb, int64_t rows_pad,
                   int64_t kb_pad, uint8_t* swizzled) {
  const int64_t per_matrix = rows_pad * kb_pad;
  const int64_t total = batch * per_matrix;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += stride) {
    const int64_t e = i / per_matrix;
    const int64_t m = (i % per_matrix) / kb_pad;
    const int64_t k = i % kb_pad;
    const uint8_t v = (m < rows && k < kb) ? plain[(e * rows + m) * kb + k] : uint8_t(0);
    swizzled[e * per_matrix + swizzled_scale_offset(m, k, kb_pad)] = v;
  }
}

// One thread per plain element [batch, rows, kb].
__global__ void __launch_bounds__(kThreads)
    unswizzle_kernel(const uint8_t* swizzled, int64_t batch, int64_t rows, int64_t kb,
                     int64_t per_matrix, int64_t kb_pad, uint8_t* plain) {
  const int64_t total = batch * rows * kb;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total; i += stride) {
    const int64_t e = i / (rows * kb);
    const int64_t m = (i % (rows * kb)) / kb;
    const int64_t k = i % kb;
    plain[i] = swizzled[e * per_matrix + swizzled_scale_offset(m, k, kb_pad)];
  }
}

}  // namespace

cudaError_t swizzle_scales(const uint8_t* plain, int64_t batch, int64_t rows, int64_t kb,
                           uint8_t* swizzled, cudaStream_t stream) {
  if (batch < 0 || rows < 0 || kb < 0) return cudaErrorInvalidValue;
  const int64_t rows_pad = swizzle_rows_padded(rows);
  const int64_t kb_pad = swizzle_kb_padded(kb);
  const int64_t total = batch * rows_pad * kb_pad;
  if (total == 0) return cudaSuccess;
  swizzle_kernel<<<grid_for(total), kThreads, 0, stream>>>(plain, batch, rows, kb, rows_pad, kb_pad,
                                                           swizzled);
  return cudaGetLastError();
}

cudaError_t unswizzle_scales(const uint8_t* swizzled, int64_t batch, int64_t rows, int64_t kb,
                             uint8_t* plain, cudaStream_t stream) {
  if (batch < 0 || rows < 0 || kb < 0) return cudaErrorInvalidValue;
  const int64_t total = batch * rows * kb;
  if (total == 0) return cudaSuccess;
  const int64_t kb_pad = swizzle_kb_padded(kb);
  const int64_t per_matrix = swizzle_rows_padded(rows) * kb_pad;
  unswizzle_kernel<<<grid_for(total), kThreads, 0, stream>>>(swizzled, batch, rows, kb, per_matrix,
                                                             kb_pad, plain);
  return cudaGetLastError();
}

}  // namespace tetra::nvfp4::cuda
