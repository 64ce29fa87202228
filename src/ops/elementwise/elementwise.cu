// Elementwise CUDA kernels: grid-stride loops, bf16 in/out, float math.
#include <cuda_bf16.h>

#include "ops/elementwise/elementwise_cuda.h"

namespace tetra::ops::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float bf(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
__device__ __forceinline__ uint16_t to_bf(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return int(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

// One block per token; 16-byte copies when H allows (H % 8 == 0 keeps rows 16-byte aligned).
__global__ void gather_kernel(const uint16_t* table, int vocab, int H, const int32_t* ids,
                              uint16_t* out) {
  const int t = blockIdx.x;
  const int id = ids[t];
  uint16_t* dst = out + size_t(t) * H;
  const bool ok = id >= 0 && id < vocab;
  const uint16_t* src = table + size_t(ok ? id : 0) * H;
  if (H % 8 == 0) {
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    for (int i = threadIdx.x; i < H / 8; i += blockDim.x) d4[i] = ok ? s4[i] : make_uint4(0, 0, 0, 0);
  } else {
    for (int i = threadIdx.x; i < H; i += blockDim.x) dst[i] = ok ? src[i] : uint16_t(0);
  }
}

__global__ void silu_mul_kernel(const uint16_t* gu, int T, int I, uint16_t* out) {
  const int64_t n = int64_t(T) * I;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / I, c = i % I;
    const float g = bf(gu[t * 2 * I + c]), u = bf(gu[t * 2 * I + I + c]);
    out[i] = to_bf(g / (1.0f + expf(-g)) * u);
  }
}

__global__ void silu_mul_split_kernel(const uint16_t* gate, const uint16_t* up, int64_t n,
                                      uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = bf(gate[i]);
    out[i] = to_bf(g / (1.0f + expf(-g)) * bf(up[i]));
  }
}

__global__ void add_kernel(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = to_bf(bf(a[i]) + bf(b[i]));
}

template <bool F32>
__global__ void add_bias_kernel(void* y, int M, int N, const uint16_t* bias) {
  const int64_t n = int64_t(M) * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float b = bf(bias[i % N]);
    if constexpr (F32)
      static_cast<float*>(y)[i] += b;
    else {
      uint16_t* p = static_cast<uint16_t*>(y);
      p[i] = to_bf(bf(p[i]) + b);
    }
  }
}

// splitmix64 finaliser of (seed, index): a stateless, launch-shape independent random stream.
__device__ __forceinline__ uint64_t mix(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void random_bytes_kernel(uint8_t* p, int64_t n, uint32_t lo, uint32_t span,
                                    uint64_t seed) {
  // 8 bytes per hash.
  const int64_t words = (n + 7) / 8;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < words;
       w += int64_t(gridDim.x) * blockDim.x) {
    uint64_t r = mix(seed, uint64_t(w));
    for (int j = 0; j < 8; ++j) {
      const int64_t i = w * 8 + j;
      if (i < n) p[i] = uint8_t(span == 256 ? (r & 0xff) : lo + (r & 0xff) % span);
      r >>= 8;
    }
  }
}

__global__ void random_bf16_kernel(uint16_t* p, int64_t n, float a, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix(seed, uint64_t(i));
    const float u = float(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = to_bf((2.0f * u - 1.0f) * a);
  }
}

template <typename T>
__global__ void fill_kernel(T* p, int64_t n, T v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = v;
}

}  // namespace

cudaError_t embedding_gather(const uint16_t* table, int vocab, int H, const int32_t* ids, int T,
                             uint16_t* out, cudaStream_t stream) {
  if (T <= 0) return cudaSuccess;
  gather_kernel<<<T, 128, 0, stream>>>(table, vocab, H, ids, out);
  return cudaGetLastError();
}

cudaError_t silu_mul(const uint16_t* gu, int T, int I, uint16_t* out, cudaStream_t stream) {
  if (T <= 0 || I <= 0) return cudaSuccess;
  silu_mul_kernel<<<blocks_for(int64_t(T) * I), kThreads, 0, stream>>>(gu, T, I, out);
  return cudaGetLastError();
}

cudaError_t silu_mul_split(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out,
                           cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  silu_mul_split_kernel<<<blocks_for(n), kThreads, 0, stream>>>(gate, up, n, out);
  return cudaGetLastError();
}

cudaError_t add(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out,
                cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(a, b, n, out);
  return cudaGetLastError();
}

cudaError_t add_bias(void* y, bool y_f32, int M, int N, const uint16_t* bias,
                     cudaStream_t stream) {
  if (M <= 0 || N <= 0) return cudaSuccess;
  const int blocks = blocks_for(int64_t(M) * N);
  if (y_f32)
    add_bias_kernel<true><<<blocks, kThreads, 0, stream>>>(y, M, N, bias);
  else
    add_bias_kernel<false><<<blocks, kThreads, 0, stream>>>(y, M, N, bias);
  return cudaGetLastError();
}

cudaError_t fill_random_bytes(uint8_t* p, int64_t n, uint64_t seed, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  random_bytes_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, stream>>>(p, n, 0, 256, seed);
  return cudaGetLastError();
}

cudaError_t fill_random_byte_range(uint8_t* p, int64_t n, uint8_t lo, uint8_t hi, uint64_t seed,
                                   cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (hi < lo) return cudaErrorInvalidValue;
  random_bytes_kernel<<<blocks_for((n + 7) / 8), kThreads, 0, stream>>>(
      p, n, lo, uint32_t(hi) - lo + 1, seed);
  return cudaGetLastError();
}

cudaError_t fill_random_bf16(uint16_t* p, int64_t n, float a, uint64_t seed, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  random_bf16_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, n, a, seed);
  return cudaGetLastError();
}

cudaError_t fill_f32(float* p, int64_t n, float v, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  fill_kernel<float><<<blocks_for(n), kThreads, 0, stream>>>(p, n, v);
  return cudaGetLastError();
}

cudaError_t fill_bf16(uint16_t* p, int64_t n, float v, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  uint16_t bits;
  {
    uint32_t u;
    __builtin_memcpy(&u, &v, 4);
    bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // RNE (v finite)
  }
  fill_kernel<uint16_t><<<blocks_for(n), kThreads, 0, stream>>>(p, n, bits);
  return cudaGetLastError();
}

}  // namespace tetra::ops::cuda
