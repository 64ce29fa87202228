// W4A4 MoE GEMMs: the activation quantizer for grouped rows, then the W4A16 kernels (see
// w4a4_moe.h for why that gives exactly the FP4 x FP4 products).
#include "ops/moe/w4a4_moe.h"

#include <algorithm>
#include <cstdint>

#include "format/nvfp4.h"
#include "moe/wgmma_order.h"

namespace tetra {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxBlocksPerSlot = 1024;  // grid-stride loop covers larger experts

// One thread per 16-element block: the shared NVFP4 math of format/nvfp4.h, written back as the
// exact bf16 of E2M1 * SF.
__global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(MoeRows rows, bool use_gather, const uint16_t* __restrict__ src,
                         int cols, const float* __restrict__ input_scale, uint16_t* dst,
                         QuantizeRowOrder order) {
  const int e = rows.expert_ids ? rows.expert_ids[blockIdx.y] : int(blockIdx.y);
  if (e < 0) return;
  const int count = rows.row_count[e];
  const int start = rows.row_start[e];
  const int blocks_per_row = cols / nvfp4::kBlock;
  const int64_t items = int64_t(count) * blocks_per_row;
  if (int64_t(blockIdx.x) * kThreads >= items) return;
  const float s = input_scale[e];
  const float inv_s = nvfp4::div_rn(1.0f, s);  // rounded once, as the CPU reference does
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < items;
       i += int64_t(gridDim.x) * kThreads) {
    const int r = int(i / blocks_per_row);
    const int b = int(i % blocks_per_row);
    const int dst_row = start + r;
    const int src_row = use_gather ? rows.gather[dst_row] : dst_row;
    uint32_t words[8];  // 16 bf16, element 2j in the low half of word j
    if (order.src_wgmma) {
      const uint32_t* in = reinterpret_cast<const uint32_t*>(src + int64_t(src_row) * cols);
#pragma unroll
      for (int j = 0; j < 8; ++j) words[j] = in[wgmma_order_block_unit(b, j)];
    } else {
      const uint4* in = reinterpret_cast<const uint4*>(src + int64_t(src_row) * cols) + 2 * b;
      const uint4 v0 = in[0], v1 = in[1];
      words[0] = v0.x, words[1] = v0.y, words[2] = v0.z, words[3] = v0.w;
      words[4] = v1.x, words[5] = v1.y, words[6] = v1.z, words[7] = v1.w;
    }
    float x[nvfp4::kBlock];
    float bamax = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      x[2 * j] = __uint_as_float(words[j] << 16);
      x[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
      bamax = nvfp4::max_abs_step(bamax, x[2 * j]);
      bamax = nvfp4::max_abs_step(bamax, x[2 * j + 1]);
    }
    const uint8_t sf = nvfp4::activation_block_scale(bamax, inv_s);
    const float out_scale = nvfp4::activation_out_scale(sf, s);
    const float sf_f = nvfp4::e4m3_to_float(sf);
    uint32_t out[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // E2M1 * SF is exact in float and in bf16, so the rounding helper only truncates zeros.
      const uint8_t q_lo = nvfp4::activation_code(x[2 * j], out_scale);
      const uint8_t q_hi = nvfp4::activation_code(x[2 * j + 1], out_scale);
      const float lo = nvfp4::mul_rn(nvfp4::e2m1_to_float(q_lo), sf_f);
      const float hi = nvfp4::mul_rn(nvfp4::e2m1_to_float(q_hi), sf_f);
      out[j] = uint32_t(nvfp4::bf16_bits_rne(lo)) | (uint32_t(nvfp4::bf16_bits_rne(hi)) << 16);
    }
    if (order.dst_wgmma) {
      uint32_t* o = reinterpret_cast<uint32_t*>(dst + int64_t(dst_row) * cols);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[wgmma_order_block_unit(b, j)] = out[j];
    } else {
      uint4* o = reinterpret_cast<uint4*>(dst + int64_t(dst_row) * cols) + 2 * b;
      o[0] = make_uint4(out[0], out[1], out[2], out[3]);
      o[1] = make_uint4(out[4], out[5], out[6], out[7]);
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int slots_of(const MoeGemmProblem& p, const MoeRows& rows) {
  return rows.expert_ids && p.num_slots > 0 ? p.num_slots : p.num_experts;
}

}  // namespace

cudaError_t moe_w4a4_quantize_rows(const MoeGemmProblem& p, const MoeRows& rows, bool use_gather,
                                   const uint16_t* src, int cols, const float* input_scale,
                                   uint16_t* dst, cudaStream_t stream, QuantizeRowOrder order) {
  if (p.num_experts <= 0 || p.total_rows < 0 || cols <= 0 || cols % nvfp4::kBlock != 0)
    return cudaErrorInvalidValue;
  if ((order.src_wgmma || order.dst_wgmma) && cols % kWgmmaOrderChunk != 0)
    return cudaErrorInvalidValue;
  // In place, each block's thread reads and writes the same units only if both sides agree.
  if (src == dst && order.src_wgmma != order.dst_wgmma) return cudaErrorInvalidValue;
  if (p.total_rows == 0) return cudaSuccess;
  if (rows.row_start == nullptr || rows.row_count == nullptr || input_scale == nullptr ||
      src == nullptr || dst == nullptr || (use_gather && rows.gather == nullptr))
    return cudaErrorInvalidValue;
  if (!aligned16(src) || !aligned16(dst)) return cudaErrorInvalidValue;
  const int slots = slots_of(p, rows);
  if (slots > 65535) return cudaErrorInvalidValue;
  // Blocks per expert from the expected rows per expert; an expert with more rows loops.
  const int hint = p.max_rows_hint > 0 ? p.max_rows_hint : (p.total_rows + slots - 1) / slots;
  const int64_t items = int64_t(std::max(hint, 1)) * (cols / nvfp4::kBlock);
  const int blocks = int(std::min<int64_t>((items + kThreads - 1) / kThreads, kMaxBlocksPerSlot));
  const dim3 grid{unsigned(blocks), unsigned(slots), 1u};
  quantize_rows_kernel<<<grid, kThreads, 0, stream>>>(rows, use_gather, src, cols, input_scale,
                                                      dst, order);
  return cudaGetLastError();
}

cudaError_t moe_w4a4_gemm1(const MoeGemmProblem& p, const MoeW4a4WeightsDevice& w,
                           const MoeRows& rows, const uint16_t* x, uint16_t* xq, uint16_t* act,
                           cudaStream_t stream, MoeKernel kernel) {
  if (!moe_gemm_unsupported_reason(p).empty() || w.input_scale13 == nullptr ||
      w.input_scale2 == nullptr)
    return cudaErrorInvalidValue;
  if (p.total_rows == 0) return cudaSuccess;
  // kWgmma: xq is written in wgmma order, the GEMM writes act so, and act is quantized in it.
  const bool wg = kernel == MoeKernel::kWgmma;
  MoeGemmProblem pk = p;
  pk.x_wgmma_order = wg;
  cudaError_t err = moe_w4a4_quantize_rows(p, rows, rows.gather != nullptr, x, p.hidden,
                                           w.input_scale13, xq, stream, {false, wg});
  if (err != cudaSuccess) return err;
  MoeRows in_place = rows;
  in_place.gather = nullptr;  // xq is already in row order
  err = moe_w4a16_gemm1(pk, w.w, in_place, xq, act, stream, kernel);
  if (err != cudaSuccess) return err;
  return moe_w4a4_quantize_rows(p, in_place, false, act, p.inter, w.input_scale2, act, stream,
                                {wg, wg});
}

cudaError_t moe_w4a4_gemm2(const MoeGemmProblem& p, const MoeW4a4WeightsDevice& w,
                           const MoeRows& rows, const uint16_t* act, void* y, bool y_f32,
                           cudaStream_t stream, MoeKernel kernel) {
  if (w.input_scale2 == nullptr) return cudaErrorInvalidValue;
  MoeGemmProblem pk = p;
  pk.x_wgmma_order = kernel == MoeKernel::kWgmma;  // act as moe_w4a4_gemm1 left it
  return moe_w4a16_gemm2(pk, w.w, rows, act, y, y_f32, stream, kernel);
}

}  // namespace tetra
