// Router GEMM logits = x @ W_gate^T: small (E <= a few hundred), so one warp per (token, expert)
// dot product, float accumulation. Lane l owns the 8-element blocks b with b % 32 == l and FMAs
// them in ascending k; a butterfly then sums the lanes. router_logits_cpu uses the same order.
#include "core/error.h"
#include "moe/routing_math.h"
#include "ops/moe/moe_ops_cuda.h"

namespace tetra::moe::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;  // experts per block
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float bf16_to_f32(uint16_t b) {
  return math::f32_from_bits(uint32_t(b) << 16);
}
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(uint16_t b) { return bf16_to_f32(b); }

// 8 consecutive activations as float, one 16-byte (bf16) or two 16-byte (f32) loads.
__device__ __forceinline__ void load8(const uint16_t* p, float* v) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = bf16_to_f32(uint16_t(w[i] & 0xffffu));
    v[2 * i + 1] = bf16_to_f32(uint16_t(w[i] >> 16));
  }
}
__device__ __forceinline__ void load8(const float* p, float* v) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// grid (T, ceil(E / kWarpsPerBlock)); warp w of block (t, y) computes logits[t, y*8 + w].
template <typename X, bool kVec>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    router_logits_kernel(const X* __restrict__ x, const uint16_t* __restrict__ w, int H, int E,
                         float* __restrict__ logits) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x;
  const int e = blockIdx.y * kWarpsPerBlock + warp;
  if (e >= E) return;
  const X* xt = x + size_t(t) * H;         // [H]
  const uint16_t* we = w + size_t(e) * H;  // [H] bf16
  float acc = 0.0f;
  for (int k0 = lane * 8; k0 < H; k0 += 32 * 8) {
    if (kVec) {  // H % 8 == 0 and 16-byte aligned rows: whole blocks
      float xv[8], wv[8];
      load8(xt + k0, xv);
      load8(we + k0, wv);
      for (int i = 0; i < 8; ++i) acc = fmaf(xv[i], wv[i], acc);
    } else {
      const int k1 = min(k0 + 8, H);
      for (int k = k0; k < k1; ++k) acc = fmaf(to_f32(xt[k]), bf16_to_f32(we[k]), acc);
    }
  }
  for (int off = 16; off >= 1; off /= 2) acc = acc + __shfl_xor_sync(kFullMask, acc, off);
  if (lane == 0) logits[size_t(t) * E + e] = acc;
}

template <typename X>
cudaError_t launch(const X* x, const uint16_t* w, int T, int H, int E, float* logits,
                   cudaStream_t stream) {
  const dim3 grid(T, (E + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const bool vec = H % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(w) % 16 == 0;
  if (vec) {
    router_logits_kernel<X, true><<<grid, kWarpsPerBlock * 32, 0, stream>>>(x, w, H, E, logits);
  } else {
    router_logits_kernel<X, false><<<grid, kWarpsPerBlock * 32, 0, stream>>>(x, w, H, E, logits);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t router_logits(const void* x, DType x_dtype, const uint16_t* w_gate_bf16, int T, int H,
                          int E, float* logits, cudaStream_t stream) {
  if (T < 0 || H < 1 || E < 1)
    TETRA_FAIL("cuda router_logits: bad sizes T=", T, " H=", H, " E=", E);
  if (E > 65535 * kWarpsPerBlock) TETRA_FAIL("cuda router_logits: too many experts ", E);
  if (T == 0) return cudaSuccess;
  if (x_dtype == DType::BF16)
    return launch(static_cast<const uint16_t*>(x), w_gate_bf16, T, H, E, logits, stream);
  if (x_dtype == DType::F32)
    return launch(static_cast<const float*>(x), w_gate_bf16, T, H, E, logits, stream);
  TETRA_FAIL("cuda router_logits: activations must be BF16 or F32, got ", dtype_name(x_dtype));
}

}  // namespace tetra::moe::cuda
