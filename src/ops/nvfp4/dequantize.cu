// CUDA NVFP4 weight dequantization to float or bf16, one thread per block of 16 elements.
// Values come from dequant_value() in format/nvfp4.h, the same code the CPU reference runs.
#include <cstdint>

#include "format/nvfp4.h"
#include "ops/nvfp4/nvfp4_cuda.h"

namespace tetra::nvfp4::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65536;

int grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return int(blocks < kMaxGrid ? blocks : kMaxGrid);
}
bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The 8 code bytes of block b as two little-endian words (byte j = codes 2j low, 2j+1 high).
template <bool kVec>
__device__ __forceinline__ uint2 load_codes(const uint8_t* packed, int64_t b) {
  if constexpr (kVec) {
    return __ldg(reinterpret_cast<const uint2*>(packed) + b);
  } else {
    uint2 w = make_uint2(0u, 0u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w.x |= uint32_t(packed[b * 8 + j]) << (8 * j);
      w.y |= uint32_t(packed[b * 8 + 4 + j]) << (8 * j);
    }
    return w;
  }
}

// Element i (0..15) of a block from its two code words.
__device__ __forceinline__ uint8_t code_at(uint2 w, int i) {
  return uint8_t(((i < 8 ? w.x : w.y) >> (4 * (i % 8))) & 0xfu);
}

// out: [n_blocks * 16] float. kVec: packed 8-byte and out 16-byte aligned.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    dequantize_f32_kernel(const uint8_t* packed, const uint8_t* scales, float s2, int64_t n_blocks,
                          float* out) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x; b < n_blocks; b += stride) {
    const uint2 w = load_codes<kVec>(packed, b);
    const float scale = e4m3_to_float(scales[b]);
    float v[kBlock];
#pragma unroll
    for (int i = 0; i < kBlock; ++i) v[i] = dequant_value(code_at(w, i), scale, s2);
    if constexpr (kVec) {
      float4* o = reinterpret_cast<float4*>(out) + b * 4;
#pragma unroll
      for (int q = 0; q < 4; ++q)
        o[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
    } else {
#pragma unroll
      for (int i = 0; i < kBlock; ++i) out[b * kBlock + i] = v[i];
    }
  }
}

// out: [n_blocks * 16] bf16 bits. kVec: packed 8-byte and out 16-byte aligned.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    dequantize_bf16_kernel(const uint8_t* packed, const uint8_t* scales, float s2, int64_t n_blocks,
                           uint16_t* out) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x; b < n_blocks; b += stride) {
    const uint2 w = load_codes<kVec>(packed, b);
    const float scale = e4m3_to_float(scales[b]);
    uint32_t pairs[kBlock / 2];  // two bf16 per word, even element in the low half
#pragma unroll
    for (int j = 0; j < kBlock / 2; ++j) {
      const uint32_t lo = bf16_bits_rne(dequant_value(code_at(w, 2 * j), scale, s2));
      const uint32_t hi = bf16_bits_rne(dequant_value(code_at(w, 2 * j + 1), scale, s2));
      pairs[j] = lo | (hi << 16);
    }
    if constexpr (kVec) {
      uint4* o = reinterpret_cast<uint4*>(out) + b * 2;
      o[0] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
      o[1] = make_uint4(pairs[4], pairs[5], pairs[6], pairs[7]);
    } else {
#pragma unroll
      for (int j = 0; j < kBlock / 2; ++j) {
        out[b * kBlock + 2 * j] = uint16_t(pairs[j] & 0xffffu);
        out[b * kBlock + 2 * j + 1] = uint16_t(pairs[j] >> 16);
      }
    }
  }
}

bool valid_shape(int64_t rows, int64_t cols) {
  return rows >= 0 && cols >= 0 && cols % kBlock == 0;
}

}  // namespace

cudaError_t dequantize_weight(const uint8_t* packed, const uint8_t* scales, float s2, int64_t rows,
                              int64_t cols, float* out, cudaStream_t stream) {
  if (!valid_shape(rows, cols)) return cudaErrorInvalidValue;
  const int64_t n_blocks = rows * (cols / kBlock);
  if (n_blocks == 0) return cudaSuccess;
  const bool vec = aligned(packed, 8) && aligned(out, 16);
  if (vec)
    dequantize_f32_kernel<true>
        <<<grid_for(n_blocks), kThreads, 0, stream>>>(packed, scales, s2, n_blocks, out);
  else
    dequantize_f32_kernel<false>
        <<<grid_for(n_blocks), kThreads, 0, stream>>>(packed, scales, s2, n_blocks, out);
  return cudaGetLastError();
}

cudaError_t dequantize_weight_bf16(const uint8_t* packed, const uint8_t* scales, float s2,
                                   int64_t rows, int64_t cols, uint16_t* out, cudaStream_t stream) {
  if (!valid_shape(rows, cols)) return cudaErrorInvalidValue;
  const int64_t n_blocks = rows * (cols / kBlock);
  if (n_blocks == 0) return cudaSuccess;
  const bool vec = aligned(packed, 8) && aligned(out, 16);
  if (vec)
    dequantize_bf16_kernel<true>
        <<<grid_for(n_blocks), kThreads, 0, stream>>>(packed, scales, s2, n_blocks, out);
  else
    dequantize_bf16_kernel<false>
        <<<grid_for(n_blocks), kThreads, 0, stream>>>(packed, scales, s2, n_blocks, out);
  return cudaGetLastError();
}

}  // namespace tetra::nvfp4::cuda
