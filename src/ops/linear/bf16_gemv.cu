// BF16 GEMV for a few activation rows (see linear_cuda.h). Decode's lm_head is the case it is
// for: GLM-4.5-Air's [151552, 4096] bf16 matrix is 1.24 GB, about 9% of a batch-1 step, read once
// per step; a streaming kernel reads it with evict-first loads (so the step's code and small
// arrays stay in L2 for the next step) and as a programmatic dependent (its first weights are
// requested while the kernel before it, the gather of the rows to score, drains).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/cuda_check.h"
#include "core/kernel_launch.h"
#include "core/kernel_smem_attr.h"
#include "ops/linear/linear_cuda.h"
#include "ops/moe/w4a16_fragment.cuh"

namespace tetra::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBlocksPerSm = 2;
// 16-byte weight loads per lane in flight: a warp asks for 32 * 16 * kBatch bytes of one row at
// once (8 KB, all of a 4096-wide row), 16 warps per SM.
constexpr int kBatch = 16;
constexpr int kGroupsPerBatch = 32 * kBatch;  // 8-element groups of a row per batch

struct Bf16GemvArgs {
  const uint16_t* w;  // [N, K] bf16
  const uint16_t* x;  // [M, K] bf16
  void* y;            // [M, N] f32 or bf16
  int n, k;
  bool out_f32;
};

__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// acc += the dot product of 8 bf16 weights with x's matching 8 floats (as two float4).
__device__ __forceinline__ float dot8(float acc, const uint4& w, const float4& x0,
                                      const float4& x1) {
  acc = fmaf(bf16_lo(w.x), x0.x, acc);
  acc = fmaf(bf16_hi(w.x), x0.y, acc);
  acc = fmaf(bf16_lo(w.y), x0.z, acc);
  acc = fmaf(bf16_hi(w.y), x0.w, acc);
  acc = fmaf(bf16_lo(w.z), x1.x, acc);
  acc = fmaf(bf16_hi(w.z), x1.y, acc);
  acc = fmaf(bf16_lo(w.w), x1.z, acc);
  acc = fmaf(bf16_hi(w.w), x1.w, acc);
  return acc;
}

// A persistent grid: warp g of G takes rows g, g + G, ... A row's k range is read in batches of
// kBatch 16-byte loads per lane (lane l takes 8-element groups l, l + 32, ...); the next row's
// first batch is requested before this row's sums are reduced and stored.
template <int M>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) bf16_gemv_kernel(const Bf16GemvArgs a) {
  // x as f32, two planes per row: plane 0 holds elements 0..3 of each 8-element group, plane 1
  // elements 4..7, so a warp's 16-byte reads of consecutive groups fall on distinct banks.
  extern __shared__ float4 xs[];  // [M][2][k / 8]
  asm volatile("griddepcontrol.launch_dependents;");
  const int lane = threadIdx.x % 32;
  const int k8 = a.k / 8;
  const int64_t rows_step = int64_t(gridDim.x) * kWarps;
  int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const uint64_t policy = moe_detail::l2_evict_first_policy();
  uint4 wv[kBatch];
  auto load_batch = [&](int64_t r, int g0) {
    const uint4* wr = reinterpret_cast<const uint4*>(a.w + r * a.k);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int g = g0 + 32 * u + lane;
      wv[u] = r < a.n && g < k8 ? moe_detail::ld_stream_u4(wr + g, policy) : make_uint4(0, 0, 0, 0);
    }
  };
  load_batch(row, 0);  // weights are not the predecessor's: ask for them before the wait
  asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int i = threadIdx.x; i < M * k8; i += kThreads) {
    const int m = i / k8, g = i - m * k8;
    const uint4 v = *reinterpret_cast<const uint4*>(a.x + size_t(m) * a.k + size_t(g) * 8);
    float4* plane0 = xs + size_t(2 * m) * k8;  // elements 0..3 of each group
    float4* plane1 = plane0 + k8;                // elements 4..7
    plane0[g] = make_float4(bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y));
    plane1[g] = make_float4(bf16_lo(v.z), bf16_hi(v.z), bf16_lo(v.w), bf16_hi(v.w));
  }
  __syncthreads();
  for (; row < a.n; row += rows_step) {
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
    for (int g0 = 0; g0 < k8; g0 += kGroupsPerBatch) {
      if (g0 > 0) load_batch(row, g0);
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int g = g0 + 32 * u + lane;
        if (g < k8) {
#pragma unroll
          for (int m = 0; m < M; ++m)
            acc[m] = dot8(acc[m], wv[u], xs[size_t(2 * m) * k8 + g],  // plane 0, then 1
                          xs[size_t(2 * m + 1) * k8 + g]);
        }
      }
    }
    load_batch(row + rows_step, 0);
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int o = 16; o > 0; o /= 2) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
    if (lane < M) {
      float v = acc[0];
#pragma unroll
      for (int m = 1; m < M; ++m) v = lane == m ? acc[m] : v;
      const size_t at = size_t(lane) * a.n + size_t(row);
      if (a.out_f32)
        static_cast<float*>(a.y)[at] = v;
      else
        static_cast<uint16_t*>(a.y)[at] = moe_detail::f32_to_bf16_bits(v);
    }
  }
}

// Resident blocks per SM of bf16_gemv_kernel<M> with `smem` bytes of x, asked of CUDA once per
// device and size (a model has one k): the occupancy query is host work that eager launches
// (prefill's logits) would otherwise repeat every step; graph replays never ask.
template <int M>
cudaError_t blocks_per_sm(int smem, int& per_sm) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> known;  // {device, smem} -> blocks per SM
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const std::lock_guard<std::mutex> lock(mu);
  if (const auto it = known.find({dev, smem}); it != known.end()) {
    per_sm = it->second;
    return cudaSuccess;
  }
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, bf16_gemv_kernel<M>, kThreads, size_t(smem));
      e != cudaSuccess)
    return e;
  known[{dev, smem}] = per_sm;
  return cudaSuccess;
}

template <int M>
cudaError_t launch_bf16_gemv(const Bf16GemvArgs& a, cudaStream_t stream) {
  const int smem = M * a.k * int(sizeof(float));
  // The opt-in is set once per GPU (the first value stays): the largest x this kernel takes.
  if (cudaError_t e = ensure_max_dynamic_smem<bf16_gemv_kernel<M>>(kBf16GemvMaxSmemBytes);
      e != cudaSuccess)
    return e;
  int per_sm = 0;
  if (cudaError_t e = blocks_per_sm<M>(smem, per_sm); e != cudaSuccess) return e;
  if (per_sm < 1) return cudaErrorInvalidConfiguration;
  const int64_t want = (int64_t(a.n) + kWarps - 1) / kWarps;
  const int grid = int(std::min<int64_t>(want, int64_t(per_sm) * current_device_sm_count()));
  const KernelLaunch launch(dim3(unsigned(grid)), dim3(kThreads), stream, true, size_t(smem));
  return launch(bf16_gemv_kernel<M>, a);
}

}  // namespace

std::string bf16_gemv_unsupported_reason(const uint16_t* w, int N, int K, const uint16_t* x,
                                         int M, const void* y) {
  if (M < 1 || M > kBf16GemvMaxRows)
    return "needs 1 to " + std::to_string(kBf16GemvMaxRows) + " rows, got " + std::to_string(M);
  if (N < 1 || K < 8 || K % 8 != 0)
    return "needs N >= 1 and K a positive multiple of 8, got N=" + std::to_string(N) +
           " K=" + std::to_string(K);
  if (size_t(M) * K * sizeof(float) > size_t(kBf16GemvMaxSmemBytes))
    return "x as f32 (" + std::to_string(size_t(M) * K * sizeof(float)) +
           " B) exceeds the kernel's shared memory (" + std::to_string(kBf16GemvMaxSmemBytes) +
           " B)";
  if (reinterpret_cast<uintptr_t>(w) % 16 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return "weights and x must be 16-byte aligned";
  if (y == nullptr) return "no output";
  return {};
}

cudaError_t linear_bf16_gemv(const uint16_t* w, int N, int K, const uint16_t* x, int M, void* y,
                             DType out_dtype, cudaStream_t stream) {
  if (!bf16_gemv_unsupported_reason(w, N, K, x, M, y).empty() ||
      (out_dtype != DType::F32 && out_dtype != DType::BF16))
    return cudaErrorInvalidValue;
  const Bf16GemvArgs a{w, x, y, N, K, out_dtype == DType::F32};
  switch (M) {
    case 1: return launch_bf16_gemv<1>(a, stream);
    case 2: return launch_bf16_gemv<2>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace tetra::ops::cuda
