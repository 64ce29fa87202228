// Combine: out[t] = sum_j w[t,j] * rows[slot_of[t,j]] (+ shared[t]) (+ residual[t]) as a gather
// with a fixed j order, float32 FMAs and one bf16 rounding: deterministic and bit-identical to
// combine_bf16_cpu (no atomics, unlike a combine fused into the down GEMM's epilogue).
#include <cooperative_groups.h>

#include <algorithm>

#include "core/kernel_launch.h"
#include "core/error.h"
#include "moe/router.h"
#include "moe/routing_math.h"
#include "ops/moe/bf16_device.cuh"
#include "ops/moe/moe_ops_cuda.h"

namespace tetra::moe::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 128;      // most threads per block
constexpr int kFewThreads = 64;    // per block at few tokens: more blocks over H
constexpr int kFewTokens = 64;

// kVec consecutive elements as float: bf16 (a 16-byte load for 8, 8-byte for 4) or f32 (a
// 16-byte load for 4).
template <int kVec>
__device__ __forceinline__ void load(const uint16_t* p, float* v) {
  if constexpr (kVec == 4) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    v[0] = bf16_to_f32(uint16_t(q.x & 0xffffu)), v[1] = bf16_to_f32(uint16_t(q.x >> 16));
    v[2] = bf16_to_f32(uint16_t(q.y & 0xffffu)), v[3] = bf16_to_f32(uint16_t(q.y >> 16));
  } else if constexpr (kVec == 8) {
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
  if constexpr (kVec == 4) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else {
    for (int i = 0; i < kVec; ++i) v[i] = p[i];
  }
}

// kVec results rounded to bf16: one 16-byte (8) or 8-byte (4) store.
template <int kVec>
__device__ __forceinline__ void store(const float* acc, uint16_t* out) {
  if constexpr (kVec == 8 || kVec == 4) {
    uint32_t packed[kVec / 2];
    for (int i = 0; i < kVec / 2; ++i)
      packed[i] = uint32_t(f32_to_bf16(acc[2 * i])) | (uint32_t(f32_to_bf16(acc[2 * i + 1])) << 16);
    if constexpr (kVec == 8) {
      *reinterpret_cast<uint4*>(out) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    } else {
      *reinterpret_cast<uint2*>(out) = make_uint2(packed[0], packed[1]);
    }
  } else {
    for (int i = 0; i < kVec; ++i) out[i] = f32_to_bf16(acc[i]);
  }
}

// Up to kMaxTopK pairs per token (the router's limit): their rows and weights are read once per
// block into shared memory, then every row load of a thread is issued before its FMAs.
constexpr int kMaxPairs = kMaxTopK;
constexpr int kBatch = 8;  // row loads in flight per thread

// The add + RMSNorm after the combine: none, fused with a cluster per row reducing the sum of
// squares (AddRmsNormStep), or folded into the reader (NormFold: per-block sums, no cluster).
enum class NormMode { None, Cluster, Fold };

// AddRmsNormStep as a kernel argument.
struct AddNormArgs {
  uint16_t* residual;      // [T, H] bf16, in place
  const uint16_t* weight;  // [H] bf16
  float eps;
  uint16_t* normed;  // [T, H] bf16 (Fold: gx)
  float* fold_sums;  // Fold: [T, gridDim.y] sums of squares
  double* clear;     // [clear_count] zeroed by block (0, 0) after the wait (CombineOptions)
  int clear_count;
};

__device__ __forceinline__ float warp_sum(float v) {
  // xor butterfly: fp addition commutes, so every lane ends with the same bits
  for (int off = 16; off >= 1; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The sum of a block's per-thread values in a fixed order, stored to *dst by thread 0 (every
// thread of the block calls it).
__device__ void block_sum_to(float v, float* dst) {
  __shared__ float warp_part[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = warp_sum(v);
  if (lane == 0) warp_part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const float b = warp_sum(lane < int(blockDim.x / 32) ? warp_part[lane] : 0.0f);
    if (lane == 0) *dst = b;
  }
}

// The sum of a cluster's per-thread values, the same bits in every thread of every block (each
// block's part is summed in a fixed order and every block reads all parts in rank order).
__device__ float cluster_sum(float v) {
  __shared__ float block_part;
  const int lane = threadIdx.x % 32;
  block_sum_to(v, &block_part);
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const float* part = lane < int(cluster.num_blocks()) ? cluster.map_shared_rank(&block_part, lane)
                                                       : nullptr;
  const float total = warp_sum(part ? *part : 0.0f);
  cluster.sync();  // no block leaves while another still reads its part
  return total;
}

// One block's slice of token t = blockIdx.x: kVec elements per thread from h. The grid is
// (T, ceil(H / (kVec * blockDim.x))), blockDim.x = kThreads or kFewThreads (> kMaxPairs); with
// NormMode::Cluster a cluster of gridDim.y blocks covers the row. kVec elements per thread: one
// 16-byte load per row (8 bf16 or 4 f32), or 1 (unaligned H, NormMode::None).
// shared_first (F32 rows only): the shared expert's output is rows[*shared_first + t], rounded to
// bf16 before it is added (the numerics of a bf16 shared output). routing_ready: slot_of,
// weights, shared_first, residual and the norm's residual are read before the PDL wait
// (CombineOptions).
template <int kVec, typename R, NormMode kMode>
__device__ __forceinline__ void combine_slice(const R* __restrict__ rows, int H, int top_k,
                                              const int32_t* __restrict__ slot_of,
                                              const float* __restrict__ weights,
                                              const uint16_t* __restrict__ shared,
                                              const int32_t* __restrict__ shared_first,
                                              const uint16_t* __restrict__ residual,
                                              uint16_t* __restrict__ out, bool routing_ready,
                                              const AddNormArgs& norm) {
  __shared__ int32_t row_s[kMaxPairs];  // [top_k] row of pair j of this token, -1 if dropped
  __shared__ float w_s[kMaxPairs];      // [top_k] its weight
  __shared__ int32_t shared_row;
  constexpr bool kNorm = kMode != NormMode::None;
  // The next kernel (the decode step's add + RMSNorm, or with kNorm its q/k/v GEMV) may be
  // scheduled now: it reads this kernel's output only after its own wait, and its programmatic
  // dependent (the q/k/v GEMV) starts streaming weights sooner.
  asm volatile("griddepcontrol.launch_dependents;");
  const int h = (blockIdx.y * blockDim.x + threadIdx.x) * kVec;
  const size_t o = size_t(blockIdx.x) * H + h;
  const bool in_row = h < H;
  float gain[kVec];  // the norm weight: a model parameter, read before any wait
  if (kNorm && in_row) load<kVec>(norm.weight + h, gain);
  // As a programmatic dependent launch: wait for the previous kernel before reading what it may
  // write (a no-op for a plain launch); with routing_ready only the rows come from it.
  if (!routing_ready) asm volatile("griddepcontrol.wait;" ::: "memory");
  const int t = blockIdx.x;
  if (threadIdx.x < top_k) {
    const size_t p = size_t(t) * top_k + threadIdx.x;
    row_s[threadIdx.x] = slot_of[p];
    w_s[threadIdx.x] = weights ? weights[p] : 1.0f;
  } else if (threadIdx.x == kMaxPairs && shared_first) {
    shared_row = *shared_first + t;
  }
  // The token's own rows (independent of the pairs) are loaded while the pairs arrive.
  float extra[kVec], res[kVec], carried[kVec];  // carried: the residual stream (kNorm)
  if (in_row && residual) load<kVec>(residual + o, res);
  if (kNorm && in_row) load<kVec>(norm.residual + o, carried);
  if (routing_ready) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (kNorm && blockIdx.x == 0 && blockIdx.y == 0)
    for (int i = threadIdx.x; i < norm.clear_count; i += blockDim.x) norm.clear[i] = 0.0;
  if (in_row && shared) load<kVec>(shared + o, extra);
  __syncthreads();
  if (!kNorm && !in_row) return;
  float acc[kVec];
  for (int i = 0; i < kVec; ++i) acc[i] = 0.0f;
  if (in_row) {
    if (shared_first) load<kVec>(rows + size_t(shared_row) * H + h, extra);
    for (int j0 = 0; j0 < top_k; j0 += kBatch) {
      float y[kBatch][kVec];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int j = j0 + b;
        if (j < top_k && row_s[j] >= 0) load<kVec>(rows + size_t(row_s[j]) * H + h, y[b]);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int j = j0 + b;
        if (j < top_k && row_s[j] >= 0)  // fixed j order, as the CPU
          for (int i = 0; i < kVec; ++i) acc[i] = fmaf(w_s[j], y[b][i], acc[i]);
      }
    }
    if (shared_first) {
      for (int i = 0; i < kVec; ++i) acc[i] = acc[i] + bf16_to_f32(f32_to_bf16(extra[i]));
    } else if (shared) {
      for (int i = 0; i < kVec; ++i) acc[i] = acc[i] + extra[i];
    }
    if (residual)
      for (int i = 0; i < kVec; ++i) acc[i] = acc[i] + res[i];
    store<kVec>(acc, out + o);
  }
  if constexpr (kNorm) {
    // residual <- bf16(bf16(out) + residual), then the row's sum of squares over the cluster.
    float ss = 0.0f;
    if (in_row) {
      for (int i = 0; i < kVec; ++i) {
        const float x = bf16_to_f32(f32_to_bf16(acc[i]));
        carried[i] = bf16_to_f32(f32_to_bf16(x + carried[i]));
        ss += carried[i] * carried[i];
      }
      store<kVec>(carried, norm.residual + o);
    }
    if constexpr (kMode == NormMode::Fold) {  // gx = bf16(h * g); the reader applies 1/rms
      block_sum_to(ss, norm.fold_sums + size_t(t) * gridDim.y + blockIdx.y);
      if (in_row) {
        float y[kVec];
        for (int i = 0; i < kVec; ++i) y[i] = carried[i] * gain[i];
        store<kVec>(y, norm.normed + o);
      }
    } else {
      const float inv_rms = rsqrtf(cluster_sum(ss) / float(H) + norm.eps);
      if (in_row) {
        float y[kVec];
        for (int i = 0; i < kVec; ++i) y[i] = carried[i] * inv_rms * gain[i];
        store<kVec>(y, norm.normed + o);
      }
    }
  }
}

template <int kVec, typename R>
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const R* __restrict__ rows, int H, int top_k,
                   const int32_t* __restrict__ slot_of, const float* __restrict__ weights,
                   const uint16_t* __restrict__ shared, const int32_t* __restrict__ shared_first,
                   const uint16_t* __restrict__ residual, uint16_t* __restrict__ out,
                   bool routing_ready) {
  combine_slice<kVec, R, NormMode::None>(rows, H, top_k, slot_of, weights, shared, shared_first, residual,
                                out, routing_ready, AddNormArgs{});
}

constexpr int kNormCluster = 8;      // blocks per row (the portable cluster size)
constexpr int kNormMaxThreads = 1024;

template <int kVec, typename R, NormMode kMode>
__global__ void __launch_bounds__(kNormMaxThreads)
    combine_add_norm_kernel(const R* __restrict__ rows, int H, int top_k,
                            const int32_t* __restrict__ slot_of, const float* __restrict__ weights,
                            const uint16_t* __restrict__ shared,
                            const int32_t* __restrict__ shared_first,
                            const uint16_t* __restrict__ residual, uint16_t* __restrict__ out,
                            bool routing_ready, const AddNormArgs norm) {
  combine_slice<kVec, R, kMode>(rows, H, top_k, slot_of, weights, shared, shared_first, residual,
                               out, routing_ready, norm);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename R>
cudaError_t launch(const R* rows, int T, int H, int top_k, const int32_t* slot_of,
                   const float* weights, const uint16_t* shared, const uint16_t* residual,
                   uint16_t* out, cudaStream_t stream, const CombineOptions& opt) {
  constexpr int kWide = int(16 / sizeof(R));  // elements of one 16-byte row load
  // 16-byte row loads; shared / residual / out move kWide bf16 (8 or 16 bytes) at a time.
  const bool vec = H % kWide == 0 && aligned16(rows) && aligned16(out) &&
                   (!shared || aligned16(shared)) && (!residual || aligned16(residual));
  const int threads = T <= kFewTokens ? kFewThreads : kThreads;
  const int per_block = (vec ? kWide : 1) * threads;
  const KernelLaunch launch(dim3(T, (H + per_block - 1) / per_block), dim3(threads), stream,
                            opt.pdl);
  if (vec)
    return launch(combine_kernel<kWide, R>, rows, H, top_k, slot_of, weights, shared,
                  opt.shared_first_row, residual, out, opt.pdl && opt.routing_ready);
  return launch(combine_kernel<1, R>, rows, H, top_k, slot_of, weights, shared,
                opt.shared_first_row, residual, out, opt.pdl && opt.routing_ready);
}

// The fused add + RMSNorm (F32 rows), four elements per thread. NormMode::Cluster: a cluster of
// up to kNormCluster blocks per token, at least kFewThreads threads each (> kMaxPairs). Fold:
// fold->parts blocks of kFewThreads threads per token (combine_norm_fold_parts), no cluster.
cudaError_t launch_add_norm(const float* rows, int T, int H, int top_k, const int32_t* slot_of,
                            const float* weights, const uint16_t* shared, const uint16_t* residual,
                            uint16_t* out, cudaStream_t stream, const CombineOptions& opt) {
  constexpr int kWide = 4;  // f32 rows: one 16-byte load
  const AddRmsNormStep& n = *opt.add_norm;
  const void* ptrs[] = {rows, out, shared, residual, n.residual, n.weight, n.normed};
  for (const void* p : ptrs)
    if (p != nullptr && !aligned16(p)) TETRA_FAIL("cuda combine + add_rms_norm: a pointer is not 16-byte aligned");
  if (n.residual == nullptr || n.weight == nullptr || n.normed == nullptr)
    TETRA_FAIL("cuda combine + add_rms_norm: residual, weight and normed are required");
  const AddNormArgs a{n.residual, n.weight, n.eps, n.normed, n.fold ? n.fold->sums : nullptr,
                      opt.clear, opt.clear_count};
  const bool ready = opt.pdl && opt.routing_ready;
  if (n.fold != nullptr) {
    const NormFold& f = *n.fold;
    if (f.sums == nullptr || f.H != H || f.parts != combine_norm_fold_parts(H))
      TETRA_FAIL("cuda combine + folded norm: sums ", f.sums == nullptr ? "missing" : "set",
                 ", H ", f.H, " (rows: ", H, "), ", f.parts, " parts (the combine's: ",
                 combine_norm_fold_parts(H), ")");
    const KernelLaunch launch(dim3(unsigned(T), unsigned(f.parts)), dim3(kFewThreads), stream,
                              opt.pdl);
    return launch(combine_add_norm_kernel<kWide, float, NormMode::Fold>, rows, H, top_k, slot_of,
                  weights, shared, opt.shared_first_row, residual, out, ready, a);
  }
  const int need = (H + kNormCluster * kWide - 1) / (kNormCluster * kWide);  // threads per block
  const int threads = std::max(kFewThreads, (need + 31) / 32 * 32);
  const int blocks = (H + threads * kWide - 1) / (threads * kWide);  // the cluster: <= 8
  cudaLaunchAttribute attr[2] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = unsigned(blocks);
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(T), unsigned(blocks));
  cfg.blockDim = dim3(unsigned(threads));
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = opt.pdl ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, combine_add_norm_kernel<kWide, float, NormMode::Cluster>, rows,
                            H, top_k, slot_of, weights, shared, opt.shared_first_row, residual,
                            out, ready, a);
}

}  // namespace

int combine_norm_fold_parts(int H) {
  constexpr int per_block = kFewThreads * 4;
  const int parts = (H + per_block - 1) / per_block;
  return H > 0 && H % 4 == 0 && 8 * parts <= kNormFoldMaxSums ? parts : 0;  // 8 rows fit
}

bool combine_add_rms_norm_fits(int H, DType rows_dtype) {
  return rows_dtype == DType::F32 && H > 0 && H % 4 == 0 && H <= kNormCluster * kNormMaxThreads * 4;
}

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
  if (top_k > kMaxPairs)
    TETRA_FAIL("cuda combine_bf16: top_k ", top_k, " is over the router's limit ", kMaxPairs);
  if (opt.clear_count > 0 && (!opt.add_norm || !opt.clear))
    TETRA_FAIL("cuda combine_bf16: clearing a buffer needs add_norm and the buffer");
  if (T == 0) return cudaSuccess;
  if (opt.add_norm) {
    if (!combine_add_rms_norm_fits(H, rows_dtype))
      TETRA_FAIL("cuda combine + add_rms_norm: H=", H, " with ", dtype_name(rows_dtype),
                 " rows does not fit (combine_add_rms_norm_fits)");
    return launch_add_norm(static_cast<const float*>(rows), T, H, top_k, slot_of, weights, shared,
                           residual, out, stream, opt);
  }
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
