// Permute: copy each token's activation row to the layout rows of its top_k pairs. One read of
// x[t], top_k writes; rows of the layout that no pair maps to are not touched.
#include "core/error.h"
#include "ops/moe/moe_ops_cuda.h"

namespace tetra::moe::cuda {

namespace {

constexpr int kThreads = 128;

// grid (T, ceil(H / (kVec * kThreads))); each thread moves kVec bf16 (16 bytes when kVec == 8).
template <int kVec>
__global__ void __launch_bounds__(kThreads)
    permute_kernel(const uint16_t* __restrict__ x, int H, int top_k,
                   const int32_t* __restrict__ slot_of, uint16_t* __restrict__ rows) {
  const int t = blockIdx.x;
  const int h = (blockIdx.y * kThreads + threadIdx.x) * kVec;
  if (h >= H) return;
  const uint16_t* src = x + size_t(t) * H + h;
  if constexpr (kVec == 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(src);
    for (int j = 0; j < top_k; ++j) {
      const int32_t row = slot_of[size_t(t) * top_k + j];
      if (row >= 0) *reinterpret_cast<uint4*>(rows + size_t(row) * H + h) = v;
    }
  } else {
    const uint16_t v = *src;
    for (int j = 0; j < top_k; ++j) {
      const int32_t row = slot_of[size_t(t) * top_k + j];
      if (row >= 0) rows[size_t(row) * H + h] = v;
    }
  }
}

}  // namespace

cudaError_t permute_bf16(const uint16_t* x, int T, int H, int top_k, const int32_t* slot_of,
                         uint16_t* rows, cudaStream_t stream) {
  if (T < 0 || H < 1 || top_k < 1)
    TETRA_FAIL("cuda permute_bf16: bad sizes T=", T, " H=", H, " top_k=", top_k);
  if (T == 0) return cudaSuccess;
  const bool vec = H % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(rows) % 16 == 0;
  const int per_block = (vec ? 8 : 1) * kThreads;
  const dim3 grid(T, (H + per_block - 1) / per_block);
  if (vec) {
    permute_kernel<8><<<grid, kThreads, 0, stream>>>(x, H, top_k, slot_of, rows);
  } else {
    permute_kernel<1><<<grid, kThreads, 0, stream>>>(x, H, top_k, slot_of, rows);
  }
  return cudaGetLastError();
}

}  // namespace tetra::moe::cuda
