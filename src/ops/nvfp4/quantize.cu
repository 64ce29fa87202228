// CUDA kernels that read high-precision tensors: amax, weight quantization, activation
// quantization. One thread per block of 16 elements (16-byte loads); the per-element math is the
// shared code in format/nvfp4.h, so the bytes equal the CPU reference's.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "format/nvfp4.h"
#include "ops/nvfp4/nvfp4_cuda.h"

namespace tetra::nvfp4::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65536;  // grid-stride loops cover the rest

template <DType D, bool V>
struct Variant {
  static constexpr DType kDType = D;
  static constexpr bool kVec = V;
};

// Calls launch(Variant<dtype, vec>{}) for the runtime dtype; unsupported dtypes are refused.
template <typename Launch>
cudaError_t dispatch(DType dtype, bool vec, Launch&& launch) {
  switch (dtype) {
    case DType::F32:
      return vec ? launch(Variant<DType::F32, true>{}) : launch(Variant<DType::F32, false>{});
    case DType::F16:
      return vec ? launch(Variant<DType::F16, true>{}) : launch(Variant<DType::F16, false>{});
    case DType::BF16:
      return vec ? launch(Variant<DType::BF16, true>{}) : launch(Variant<DType::BF16, false>{});
    default:
      return cudaErrorInvalidValue;
  }
}

int grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return int(blocks < kMaxGrid ? blocks : kMaxGrid);
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Exact conversions of one input element to float.
template <DType D>
__device__ __forceinline__ float load_scalar(const void* src, int64_t i) {
  if constexpr (D == DType::F32) {
    return static_cast<const float*>(src)[i];
  } else if constexpr (D == DType::F16) {
    return __half2float(__ushort_as_half(static_cast<const unsigned short*>(src)[i]));
  } else {
    return __uint_as_float(uint32_t(static_cast<const unsigned short*>(src)[i]) << 16);
  }
}

// One 32-bit word of a 16-bit input holds two elements, the lower-addressed one in the low half.
template <DType D>
__device__ __forceinline__ void decode_pair(uint32_t w, float& lo, float& hi) {
  if constexpr (D == DType::BF16) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  } else {
    lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
    hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
}

// Loads block b (elements [16b, 16b+16)) into x. kVec needs src 16-byte aligned.
template <DType D, bool kVec>
__device__ __forceinline__ void load_block(const void* src, int64_t b, float (&x)[kBlock]) {
  if constexpr (!kVec) {
#pragma unroll
    for (int i = 0; i < kBlock; ++i) x[i] = load_scalar<D>(src, b * kBlock + i);
  } else if constexpr (D == DType::F32) {
    const float4* p = static_cast<const float4*>(src) + b * 4;  // 4 x 16 B per block
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float4 q = __ldg(p + v);
      x[4 * v] = q.x;
      x[4 * v + 1] = q.y;
      x[4 * v + 2] = q.z;
      x[4 * v + 3] = q.w;
    }
  } else {
    const uint4* p = static_cast<const uint4*>(src) + b * 2;  // 2 x 16 B per block
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const uint4 q = __ldg(p + v);
      decode_pair<D>(q.x, x[8 * v], x[8 * v + 1]);
      decode_pair<D>(q.y, x[8 * v + 2], x[8 * v + 3]);
      decode_pair<D>(q.z, x[8 * v + 4], x[8 * v + 5]);
      decode_pair<D>(q.w, x[8 * v + 6], x[8 * v + 7]);
    }
  }
}

// Stores the 8 bytes of block b: byte j holds codes 2j (low nibble) and 2j+1 (high nibble).
template <bool kVec>
__device__ __forceinline__ void store_codes(uint8_t* packed, int64_t b, uint32_t lo_word,
                                            uint32_t hi_word) {
  if constexpr (kVec) {
    reinterpret_cast<uint2*>(packed)[b] = make_uint2(lo_word, hi_word);  // needs 8-byte alignment
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      packed[b * 8 + j] = uint8_t(lo_word >> (8 * j));
      packed[b * 8 + 4 + j] = uint8_t(hi_word >> (8 * j));
    }
  }
}

// ---- amax ---------------------------------------------------------------------------------------
template <DType D, bool kVec>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const void* src, int64_t n, float* d_amax, int* d_nonfinite) {
  float m = 0.0f;
  bool bad = false;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t tid = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  int64_t scalar_from = 0;
  if constexpr (kVec) {
    constexpr int kPer = D == DType::F32 ? 4 : 8;  // elements per 16-byte load
    const int64_t n_vec = n / kPer;
    for (int64_t v = tid; v < n_vec; v += stride) {
      float x[8];
      if constexpr (D == DType::F32) {
        const float4 q = __ldg(static_cast<const float4*>(src) + v);
        x[0] = q.x, x[1] = q.y, x[2] = q.z, x[3] = q.w;
      } else {
        const uint4 q = __ldg(static_cast<const uint4*>(src) + v);
        decode_pair<D>(q.x, x[0], x[1]);
        decode_pair<D>(q.y, x[2], x[3]);
        decode_pair<D>(q.z, x[4], x[5]);
        decode_pair<D>(q.w, x[6], x[7]);
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        if (is_finite_f32(x[i]))
          m = max_abs_step(m, x[i]);
        else
          bad = true;
      }
    }
    scalar_from = n_vec * kPer;
  }
  for (int64_t i = scalar_from + tid; i < n; i += stride) {
    const float x = load_scalar<D>(src, i);
    if (is_finite_f32(x))
      m = max_abs_step(m, x);
    else
      bad = true;
  }
  // m is finite and >= 0 here, so fmaxf is exact and float order equals int order of the bits.
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  __shared__ float warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  const int any_bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    float block_max = warp_max[0];
    for (int w = 1; w < kThreads / 32; ++w) block_max = fmaxf(block_max, warp_max[w]);
    atomicMax(reinterpret_cast<int*>(d_amax), __float_as_int(block_max));
    if (any_bad) atomicOr(d_nonfinite, 1);
  }
}

// ---- quantization ------------------------------------------------------------------------------
template <DType D, bool kVec>
__global__ void __launch_bounds__(kThreads)
    quantize_weight_kernel(const void* src, int64_t n_blocks, float s2, uint8_t* packed,
                           uint8_t* scales, int* d_nonfinite) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x; b < n_blocks; b += stride) {
    float x[kBlock];
    load_block<D, kVec>(src, b, x);
    float bamax = 0.0f;
    bool bad = false;
#pragma unroll
    for (int i = 0; i < kBlock; ++i) {
      bamax = max_abs_step(bamax, x[i]);
      bad |= !is_finite_f32(x[i]);
    }
    if (bad && d_nonfinite != nullptr) atomicOr(d_nonfinite, 1);
    const uint8_t sf = weight_block_scale(bamax, s2);
    const float divisor = weight_block_divisor(sf, s2);
    scales[b] = sf;
    uint32_t words[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < kBlock; ++i)
      words[i / 8] |= uint32_t(weight_code(x[i], divisor)) << (4 * (i % 8));
    store_codes<kVec>(packed, b, words[0], words[1]);
  }
}

template <DType D, bool kVec>
__global__ void __launch_bounds__(kThreads)
    quantize_activation_kernel(const void* src, int64_t n_blocks, float input_scale,
                               float inv_input_scale, uint8_t* packed, uint8_t* scales) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x; b < n_blocks; b += stride) {
    float x[kBlock];
    load_block<D, kVec>(src, b, x);
    float bamax = 0.0f;
#pragma unroll
    for (int i = 0; i < kBlock; ++i) bamax = max_abs_step(bamax, x[i]);
    const uint8_t sf = activation_block_scale(bamax, inv_input_scale);
    const float out_scale = activation_out_scale(sf, input_scale);
    scales[b] = sf;
    uint32_t words[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < kBlock; ++i)
      words[i / 8] |= uint32_t(activation_code(x[i], out_scale)) << (4 * (i % 8));
    store_codes<kVec>(packed, b, words[0], words[1]);
  }
}

bool valid_shape(int64_t rows, int64_t cols) {
  return rows >= 0 && cols >= 0 && cols % kBlock == 0;
}
bool valid_scale(float s) { return s > 0.0f && std::isfinite(s); }
bool supported_input(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

}  // namespace

cudaError_t amax(const void* src, DType dtype, int64_t n, float* d_amax, int* d_nonfinite,
                 cudaStream_t stream) {
  if (n < 0 || d_amax == nullptr || d_nonfinite == nullptr) return cudaErrorInvalidValue;
  if (!supported_input(dtype)) return cudaErrorInvalidValue;
  if (cudaError_t e = cudaMemsetAsync(d_amax, 0, sizeof(float), stream); e != cudaSuccess) return e;
  if (cudaError_t e = cudaMemsetAsync(d_nonfinite, 0, sizeof(int), stream); e != cudaSuccess)
    return e;
  if (n == 0) return cudaSuccess;
  const bool vec = aligned(src, 16);
  return dispatch(dtype, vec, [&](auto variant) {
    using V = decltype(variant);
    const int64_t per_thread = V::kVec ? (V::kDType == DType::F32 ? 4 : 8) : 1;
    amax_kernel<V::kDType, V::kVec>
        <<<grid_for((n + per_thread - 1) / per_thread), kThreads, 0, stream>>>(src, n, d_amax,
                                                                               d_nonfinite);
    return cudaGetLastError();
  });
}

cudaError_t quantize_weight(const void* src, DType dtype, int64_t rows, int64_t cols, float s2,
                            uint8_t* packed, uint8_t* scales, cudaStream_t stream,
                            int* d_nonfinite) {
  if (!valid_shape(rows, cols) || !valid_scale(s2)) return cudaErrorInvalidValue;
  const int64_t n_blocks = rows * (cols / kBlock);
  if (n_blocks == 0) return supported_input(dtype) ? cudaSuccess : cudaErrorInvalidValue;
  const bool vec = aligned(src, 16) && aligned(packed, 8);
  return dispatch(dtype, vec, [&](auto variant) {
    using V = decltype(variant);
    quantize_weight_kernel<V::kDType, V::kVec><<<grid_for(n_blocks), kThreads, 0, stream>>>(
        src, n_blocks, s2, packed, scales, d_nonfinite);
    return cudaGetLastError();
  });
}

cudaError_t quantize_activation(const void* src, DType dtype, int64_t rows, int64_t cols,
                                float input_scale, uint8_t* packed, uint8_t* scales,
                                cudaStream_t stream) {
  // Rounded once on the host, exactly as the CPU reference does; it must not overflow.
  const float inv_input_scale = 1.0f / input_scale;
  if (!valid_shape(rows, cols) || !valid_scale(input_scale) || !std::isfinite(inv_input_scale))
    return cudaErrorInvalidValue;
  const int64_t n_blocks = rows * (cols / kBlock);
  if (n_blocks == 0) return supported_input(dtype) ? cudaSuccess : cudaErrorInvalidValue;
  const bool vec = aligned(src, 16) && aligned(packed, 8);
  return dispatch(dtype, vec, [&](auto variant) {
    using V = decltype(variant);
    quantize_activation_kernel<V::kDType, V::kVec><<<grid_for(n_blocks), kThreads, 0, stream>>>(
        src, n_blocks, input_scale, inv_input_scale, packed, scales);
    return cudaGetLastError();
  });
}

}  // namespace tetra::nvfp4::cuda
