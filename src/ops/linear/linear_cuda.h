// Dense linear layers on the GPU. Device pointers, one stream, nothing allocates or synchronises
// in the launchers (CUDA-graph capturable); shapes are checked on the host (tetra::Error).
//
// NVFP4 (W4A16): the W4A16 MoE kernels (ops/moe/w4a16_moe.h) run as a one-expert problem:
//   y[M, N] = x[M, K] . W^T is GEMM2 with "H" = N and "I" = K;
//   act[M, I] = silu(x . gate^T) * (x . up^T) is GEMM1 with gate/up packed together.
// The kernels read K in chunks of 64 and write 32 output rows per block: K % 64 == 0 and
// N % 32 == 0 (gated: I % 16 == 0, i.e. 2I % 32 == 0). Other shapes are refused by name.
// The row count lives in device memory (the kernels read it there), so a RowCountTable holds
// 0..max_rows once and each call points into it: no per-call writes, graph-friendly.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "moe/expert_weights.h"
#include "moe/add_rms_norm_step.h"
#include "moe/router_fold.h"

namespace tetra::ops::cuda {

// Device table t[i] = i for i in [0, max_rows]: row_start = &t[0], row_count = &t[M].
class RowCountTable {
 public:
  explicit RowCountTable(int max_rows);
  ~RowCountTable();
  RowCountTable(const RowCountTable&) = delete;
  RowCountTable& operator=(const RowCountTable&) = delete;
  int max_rows() const { return max_rows_; }
  const int* zero() const { return table_; }
  const int* count(int m) const;  // checks 0 <= m <= max_rows

 private:
  int* table_ = nullptr;  // [max_rows + 1] int32, device
  int max_rows_ = 0;
};

// One packed NVFP4 matrix on the device (fragment order, moe/expert_weights.h).
struct Nvfp4LinearDevice {
  const uint8_t* w = nullptr;      // [N/16][K/64][32][16] fragment words
  const uint8_t* s = nullptr;      // [N/16][K/64][32][2] ue5m3 scales
  const float* alpha = nullptr;    // [1] plain, [2] gated (gate, up): weight_scale_2 * 2^10
  int n = 0;                       // packed rows (gated: 2I, gate/up tiles interleaved)
  int k = 0;
  bool gated = false;
};

// Why this dense NVFP4 shape cannot run ("" when it can). n = out features (gated: I), k = in.
std::string nvfp4_linear_unsupported_reason(int n, int k, bool gated);

// Owns the device copy of one packed linear (or of a gate/up pair). Upload is synchronous.
class Nvfp4LinearBuffer {
 public:
  Nvfp4LinearBuffer() = default;
  explicit Nvfp4LinearBuffer(const Nvfp4MatrixView& w);                            // plain
  Nvfp4LinearBuffer(const Nvfp4MatrixView& gate, const Nvfp4MatrixView& up);       // gated
  // Uninitialised storage of a given shape (random-weight benchmarks fill it on the GPU).
  static Nvfp4LinearBuffer allocate(int n, int k, bool gated);
  ~Nvfp4LinearBuffer();
  Nvfp4LinearBuffer(Nvfp4LinearBuffer&& o) noexcept;
  Nvfp4LinearBuffer& operator=(Nvfp4LinearBuffer&& o) noexcept;
  Nvfp4LinearBuffer(const Nvfp4LinearBuffer&) = delete;
  Nvfp4LinearBuffer& operator=(const Nvfp4LinearBuffer&) = delete;

  const Nvfp4LinearDevice& view() const { return view_; }
  size_t bytes() const { return bytes_; }  // weights + scales + alphas on the device
  // Mutable pointers for GPU-side fill (random weights).
  uint8_t* weight_mut() { return const_cast<uint8_t*>(view_.w); }
  uint8_t* scale_mut() { return const_cast<uint8_t*>(view_.s); }
  float* alpha_mut() { return const_cast<float*>(view_.alpha); }

 private:
  void allocate_storage(int n, int k, bool gated);
  void upload(const PackedNvfp4Matrix& p, const float* alphas, int n_alpha);
  void* mem_ = nullptr;
  size_t bytes_ = 0;
  Nvfp4LinearDevice view_;
};

// y [M, N] (F32 or BF16) = x [M, K] bf16 . W^T. M <= rows.max_rows().
// x_scratch: optional [M, K] bf16 device scratch; given it, from kNvfp4WgmmaMinRows rows on an
// SM 9.0 GPU x is reordered there and the warpgroup-MMA kernel runs (ops/moe/w4a16_wgmma.cu),
// its k split over a cluster where the matrix alone has too few column blocks. Above 64 rows it
// replaced the mma.sync tiled kernel: H200, GLM-4.5-Air's o_proj at 128 rows 223 -> 67 us
// (bench/results/2026-12-01-session25-h200.md).
inline constexpr int kNvfp4WgmmaMinRows = 65;
cudaError_t linear_nvfp4(const Nvfp4LinearDevice& w, const uint16_t* x, int M,
                         const RowCountTable& rows, void* y, DType out_dtype,
                         cudaStream_t stream, uint16_t* x_scratch = nullptr);

// act [M, I] bf16 = silu(x . gate^T) * (x . up^T); w gated (n = 2I).
cudaError_t gate_up_silu_nvfp4(const Nvfp4LinearDevice& w, const uint16_t* x, int M,
                               const RowCountTable& rows, uint16_t* act, cudaStream_t stream);

// Decode-size NVFP4 linears: up to kNvfp4GemvMaxOutputs matrices over the same input x [M, k]
// (M <= kNvfp4GemvMaxRows) in one launch, each y = bf16(bf16(x . W^T * alpha) + bias) (the
// rounding of linear_nvfp4 to BF16 followed by add_bias), written [M, n] with row stride n.
// Used for fused q/k/v (three matrices, three biases, three buffers) at batch <= 64 and o_proj at
// batch <= 8. M <= kNvfp4GemvKernelRows runs the GEMV kernels below; larger M runs
// linear_nvfp4_small_m, for k <= kNvfp4SmallMGemvMaxK only (refused beyond: see there).
inline constexpr int kNvfp4GemvMaxRows = 64;
inline constexpr int kNvfp4GemvKernelRows = 8;
inline constexpr int kNvfp4GemvMaxOutputs = 3;
struct Nvfp4GemvOutput {
  const Nvfp4LinearDevice* w = nullptr;  // plain (not gated); n % 16 == 0, k % 64 == 0, k shared
  const uint16_t* bias = nullptr;        // [n] bf16, or null
  uint16_t* y = nullptr;                 // [M, n] bf16 (may be null with `residual`)
  // [M, n] bf16, or null. When set, y is not written: residual <- bf16(bf16(y) + residual) in
  // place, the decoder's residual add after o_proj, with the rounding of the add + RMSNorm it
  // replaces. The GEMV kernels only (M <= kNvfp4GemvKernelRows).
  uint16_t* residual = nullptr;
};
// Why these outputs cannot run ("" when they can).
std::string nvfp4_gemv_unsupported_reason(const Nvfp4GemvOutput* outs, int n_outs, int M);
// Kernels: Stream, a persistent grid streaming the weights through a shared-memory ring
// (ops/moe/w4a16_stream.cuh); Batched, one block per tile, weights loaded straight into
// registers. Auto: Stream when the tiles fit one per block of its grid (long k: o_proj), else
// Batched.
// Rolling (Auto's pick for more tiles than its grid, where k allows): a persistent grid of 3-4
// blocks per SM, each warp's register slots reloaded with the next batch (of its tile or its
// block's next tile) as they are consumed, so the weight stream does not stop between tiles.
enum class Nvfp4GemvKernel { Auto, Batched, Stream, Rolling };
// The Rolling kernel's shape for this k (a warp's share is k / 512 chunks): 4 register slots per
// warp at 4 blocks per SM (64 registers) where 4 divides that share (8 at k = 4096, not 10 at
// 5120), else the largest of 7..5 that divides it at 3 blocks per SM (80 registers: 5 at 5120, 6
// at 3072, 7 at 3584); slots 0 when none does (k % 512 != 0, or k / 512 = 9, 11, 13, ...: those
// take Batched). 4 slots at 4 per SM ran GLM-4.5-Air's batch-1 decode step ~1% faster than 8 at
// 3 (bench/results/2026-12-01-session21-h200.md).
struct Nvfp4GemvRollingShape {
  int slots = 0, blocks_per_sm = 0;
};
Nvfp4GemvRollingShape nvfp4_gemv_rolling_shape(int k);
// Stream kernel shape (benchmarks sweep it; null = these defaults, measured best for o_proj:
// 4 stages rather than 5 took the GLM-4.5-Air batch-1 decode step 4041-4059 -> 4026-4033 us,
// bench/results/2026-11-30-session12-h200.md).
struct Nvfp4GemvStreamConfig {
  int consumer_warps = 16;  // 4 or 8 (chunks_per_warp 2), 16 (chunks_per_warp 1)
  int stages = 4;           // ring depth
  int blocks_per_sm = 2;    // grid = min(tiles, SMs * this)
  int chunks_per_warp = 1;  // chunks (independent MMA chains) per warp per stage: 1 (16 warps),
                            // 2 or 4 (4 or 8 warps); a stage holds warps * this chunks
  int mode = 0;             // benchmark diagnostics (8 warps x 2 chunks, or 4 x 2 for mode 1):
                            // 1 = copy only, 2 = no activation loads; outputs then meaningless
};
// M > kNvfp4GemvKernelRows: the kernel and stream_cfg arguments are ignored (one small-M kernel).
cudaError_t linear_nvfp4_gemv(const Nvfp4GemvOutput* outs, int n_outs, const uint16_t* x, int M,
                              cudaStream_t stream, Nvfp4GemvKernel kernel = Nvfp4GemvKernel::Auto,
                              const Nvfp4GemvStreamConfig* stream_cfg = nullptr);

// The same outputs over gx [M, k] = bf16(h * g), the input RMSNorm's 1/rms folded in
// (moe/add_rms_norm_step.h NormFold, written by the MoE combine before this launch): every
// output row r is y = bf16(W gx * alpha * inv_rms(r)) (+ bias). 1..kNvfp4GemvKernelRows rows,
// no residual outputs, f.H == k, rows * parts <= kNormFoldMaxSums, and shapes for which Auto
// does not pick the Batched kernel (its register budget had no room for the fold: Qwen3-30B-A3B's
// q/k/v keep the norm unfolded). Auto picks Rolling or, for few tiles, the streaming kernel.
std::string nvfp4_gemv_norm_folded_unsupported_reason(const Nvfp4GemvOutput* outs, int n_outs,
                                                      int M, const moe::NormFold& f);
cudaError_t linear_nvfp4_gemv_norm_folded(const Nvfp4GemvOutput* outs, int n_outs,
                                          const uint16_t* gx, int M, const moe::NormFold& f,
                                          cudaStream_t stream,
                                          Nvfp4GemvKernel kernel = Nvfp4GemvKernel::Auto);

// o_proj at one token with the MoE router folded into its epilogue (moe/router_fold.h): one plain
// output whose residual add writes h, run on the streaming kernel with one tile per block (the
// Auto pick for few long tiles), E <= kRouterFoldMaxExperts, 16-byte aligned fold buffers. Each
// block also stores its tile's gx and adds its partials to f.sums (zero before the launch).
std::string nvfp4_gemv_router_fold_unsupported_reason(const Nvfp4GemvOutput& out, int M,
                                                      const moe::RouterFold& f);
cudaError_t linear_nvfp4_gemv_router_fold(const Nvfp4GemvOutput& out, const uint16_t* x,
                                          const moe::RouterFold& f, cudaStream_t stream);

// The same outputs and numerics for 1..64 rows with one kernel built for 9..64
// (ops/linear/nvfp4_small_m.cu): 8 warps x tiles_per_warp 16-row weight tiles per block, x staged
// once per block in shared memory and reused by every tile, k split over a thread-block cluster
// of `split` blocks whose partial sums meet in rank order (deterministic). Also refuses k too long
// for the x slice to fit shared memory at split 8 (k > 14336 at 64 rows).
struct Nvfp4SmallMConfig {
  int tiles_per_warp = 0;  // 1 or 2 (128 or 256 weight rows per block); 0 = auto (1 to 16 rows)
  int split = 0;           // cluster size along k: 1, 2, 4 or 8; 0 = auto (from 2, until x fits)
};
// linear_nvfp4_gemv sends M > kNvfp4GemvKernelRows here only for k <= this: at o_proj's k = 12288
// the small-M kernel measured slower than linear_nvfp4's decode kernel (70 vs 39 us at 64 rows),
// so nvfp4_gemv_unsupported_reason refuses it and callers keep linear_nvfp4 + add_bias.
inline constexpr int kNvfp4SmallMGemvMaxK = 4096;
std::string nvfp4_small_m_unsupported_reason(const Nvfp4GemvOutput* outs, int n_outs, int M);
cudaError_t linear_nvfp4_small_m(const Nvfp4GemvOutput* outs, int n_outs, const uint16_t* x, int M,
                                 cudaStream_t stream, const Nvfp4SmallMConfig* config = nullptr);

// The same outputs and numerics as linear_nvfp4_gemv (q, k and v with their biases) in one launch
// of the wgmma kernel (its k split over a cluster where the matrices are few rows), for
// M >= kNvfp4WgmmaOutputsMinRows on an SM 9.0 GPU; x_scratch [M, K] bf16 holds x in wgmma order.
// Measured on the H200 for GLM-4.5-Air's q/k/v against the small-M kernel: 42.5 vs 80 us at 64
// rows; at 32 rows 27-31 vs 30.5 (no clear gain), at 16 slower (23.7-25.7 vs 19.4-19.6)
// (bench/results/2026-12-01-session25-h200.md).
inline constexpr int kNvfp4WgmmaOutputsMinRows = 64;
std::string nvfp4_wgmma_outputs_unsupported_reason(const Nvfp4GemvOutput* outs, int n_outs,
                                                   int M);
cudaError_t linear_nvfp4_wgmma(const Nvfp4GemvOutput* outs, int n_outs, const uint16_t* x, int M,
                               const RowCountTable& rows, uint16_t* x_scratch, cudaStream_t stream);

// BF16 GEMV for M <= kBf16GemvMaxRows (decode's lm_head): y [M, N] (F32 or BF16) = x [M, K]
// bf16 . W^T, W [N, K] bf16, f32 sums; a persistent grid streaming W once with evict-first loads,
// launched as a programmatic dependent (W requested before the wait, x read after it).
// Needs K % 8 == 0, 16-byte aligned w and x, and x as f32 within kBf16GemvMaxSmemBytes.
// Two rows at most: every weight's 8 f32 FMAs per row read x from shared memory, which at 4 rows
// binds before HBM does (H200, GLM-4.5-Air's lm_head: batch 4 +1% per step, batch 2
// -0.2..-0.6%, batch 1 -0.4%).
inline constexpr int kBf16GemvMaxRows = 2;
inline constexpr int kBf16GemvMaxSmemBytes = 64 << 10;
std::string bf16_gemv_unsupported_reason(const uint16_t* w, int N, int K, const uint16_t* x,
                                         int M, const void* y);
cudaError_t linear_bf16_gemv(const uint16_t* w, int N, int K, const uint16_t* x, int M, void* y,
                             DType out_dtype, cudaStream_t stream);

// BF16 linear: y [M, N] (F32 or BF16) = x [M, K] bf16 . W^T, W [N, K] bf16. The GEMV above where
// it applies, cuBLASLt otherwise.
// Owns the cuBLASLt handle and a fixed workspace (so capture never allocates); not thread safe.
class Bf16Linear {
 public:
  // small_m_gemv: the GEMV above where it applies (TETRA_BF16_GEMV=0 in the environment turns it
  // off, for A/B timing against cuBLASLt).
  explicit Bf16Linear(bool small_m_gemv = true);
  ~Bf16Linear();
  Bf16Linear(const Bf16Linear&) = delete;
  Bf16Linear& operator=(const Bf16Linear&) = delete;
  // Throws tetra::Error on a cuBLASLt failure (cuBLASLt status named).
  void run(const uint16_t* w, int N, int K, const uint16_t* x, int M, void* y, DType out_dtype,
           cudaStream_t stream);

 private:
  void* handle_ = nullptr;     // cublasLtHandle_t
  void* workspace_ = nullptr;  // device
  size_t workspace_bytes_ = 0;
  bool use_gemv_ = true;
};

}  // namespace tetra::ops::cuda
