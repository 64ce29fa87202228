// Combine: out[t] = sum_j w[t,j] * rows[slot_of[t,j]] (+ shared[t]) (+ residual[t]) as a gather
// with a fixed j order, float32 FMAs and one bf16 rounding: deterministic and bit-identical to
// combine_bf16_cpu (no atomics, unlike a combine fused into the down GEMM's epilogue).
#include "core/kernel_launch.h"
#include "core/error.h"
#include "moe/routing_math.h"
#include "ops/moe/moe_ops_cuda.h"

namespace tetra::moe::cuda {

namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float bf16_to_f32(uint16_t b) {
  return math::f32_from_bits(uint32_t(b) << 16);
}
// Round to nearest even; NaN stays a quiet NaN (same rule as core/half.h float_to_bf16).
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
  uint32_t u = math::f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// kVec consecutive elements as float: bf16 (16-byte load for 8) or f32 (two 16-byte loads).
template <int kVec>
__device__ __forceinline__ void load(const uint16_t* p, float* v) {
  if constexpr (kVec == 8) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = bf16_to_f32(uint16_t(w[i] & 0xffffu));
      v[2 * i + 1] = bf16_to_f32(uint16_t(w[i] >> 16));
    }
  } else {
    for (int i = 0; i < kVec; ++i) v[i] = bf16_to_f32(p[i]);
  }
}
template <int kVec>
__device__ __forceinline__ void load(const float* p, float* v) {
  if constexpr (kVec == 8) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    for (int i = 0; i < kVec; ++i) v[i] = p[i];
  }
}

// grid (T, ceil(H / (kVec * kThreads))).
// shared_first (F32 rows only): the shared expert's output is rows[*shared_first + t], rounded to
// bf16 before it is added (the numerics of a bf16 shared output).
template <int kVec, typename R>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const R* __restrict__ rows, int H, int top_k,
                   const int32_t* __restrict__ slot_of, const float* __restrict__ weights,
                   const uint16_t* __restrict__ shared, const int32_t* __restrict__ shared_first,
                   const uint16_t* __restrict__ residual, uint16_t* __restrict__ out) {
  // As a programmatic dependent launch: nothing is read before the previous kernel is done (a
  // no-op for a plain launch).
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int t = blockIdx.x;
  const int h = (blockIdx.y * kThreads + threadIdx.x) * kVec;
  if (h >= H) return;
  float acc[kVec];
  for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    const int32_t row = slot_of[size_t(t) * top_k + j];
    if (row < 0) continue;
    const float w = weights ? weights[size_t(t) * top_k + j] : 1.0f;
    float y[kVec];
    load<kVec>(rows + size_t(row) * H + h, y);
    for (int i = 0; i < kVec; ++i) acc[i] = fmaf(w, y[i], acc[i]);
  }
  const size_t o = size_t(t) * H + h;
  if (shared_first) {
    float v[kVec];
    load<kVec>(rows + size_t(*shared_first + t) * H + h, v);
    for (int i = 0; i < kVec; ++i) acc[i] = acc[i] + bf16_to_f32(f32_to_bf16(v[i]));
  } else if (shared) {
    float v[kVec];
    load<kVec>(shared + o, v);
    for (int i = 0; i < kVec; ++i) acc[i] = acc[i] + v[i];
  }
  if (residual) {
    float v[kVec];
    load<kVec>(residual + o, v);
    for (int i = 0; i < kVec; ++i) acc[i] = acc[i] + v[i];
  }
  if constexpr (kVec == 8) {
    uint32_t packed[4];
    for (int i = 0; i < 4; ++i)
      packed[i] = uint32_t(f32_to_bf16(acc[2 * i])) | (uint32_t(f32_to_bf16(acc[2 * i + 1])) << 16);
    *reinterpret_cast<uint4*>(out + o) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  } else {
    for (int i = 0; i < kVec; ++i) out[o + i] = f32_to_bf16(acc[i]);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename R>
cudaError_t launch(const R* rows, int T, int H, int top_k, const int32_t* slot_of,
                   const float* weights, const uint16_t* shared, const uint16_t* residual,
                   uint16_t* out, cudaStream_t stream, const CombineOptions& opt) {
  const bool vec = H % 8 == 0 && aligned16(rows) && aligned16(out) &&
                   (!shared || aligned16(shared)) && (!residual || aligned16(residual));
  const int per_block = (vec ? 8 : 1) * kThreads;
  const KernelLaunch launch(dim3(T, (H + per_block - 1) / per_block), dim3(kThreads), stream,
                            opt.pdl);
  if (vec)
    return launch(combine_kernel<8, R>, rows, H, top_k, slot_of, weights, shared,
                  opt.shared_first_row, residual, out);
  return launch(combine_kernel<1, R>, rows, H, top_k, slot_of, weights, shared,
                opt.shared_first_row, residual, out);
}

}  // namespace

cudaError_t combine_bf16(const void* rows, DType rows_dtype, int T, int H, int top_k,
                         const int32_t* slot_of, const float* weights, const uint16_t* shared,
                         const uint16_t* residual, uint16_t* out, cudaStream_t stream) {
  return combine_bf16(rows, rows_dtype, T, H, top_k, slot_of, weights, shared, residual, out,
                      stream, CombineOptions{});
}

cudaError_t combine_bf16(const void* rows, DType rows_dtype, int T, int H, int top_k,
                         const int32_t* slot_of, const float* weights, const uint16_t* shared,
                         const uint16_t* residual, uint16_t* out, cudaStream_t stream,
                         const CombineOptions& opt) {
  if (T < 0 || H < 1 || top_k < 1)
    TETRA_FAIL("cuda combine_bf16: bad sizes T=", T, " H=", H, " top_k=", top_k);
  if (opt.shared_first_row && (shared || rows_dtype != DType::F32))
    TETRA_FAIL("cuda combine_bf16: the shared expert's output in the rows needs F32 rows and no "
               "separate shared tensor");
  if (T == 0) return cudaSuccess;
  if (rows_dtype == DType::BF16)
    return launch(static_cast<const uint16_t*>(rows), T, H, top_k, slot_of, weights, shared,
                  residual, out, stream, opt);
  if (rows_dtype == DType::F32)
    return launch(static_cast<const float*>(rows), T, H, top_k, slot_of, weights, shared,
                  residual, out, stream, opt);
  TETRA_FAIL("cuda combine_bf16: expert output rows must be BF16 or F32, got ",
             dtype_name(rows_dtype));
}

}  // namespace tetra::moe::cuda
