// Dense NVFP4 linears as one-expert W4A16 grouped GEMMs: packing/upload, row table, launchers.
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/linear/linear_cuda.h"
#include "ops/moe/w4a16_launch.h"
#include "ops/moe/w4a16_moe.h"

namespace tetra::ops::cuda {

RowCountTable::RowCountTable(int max_rows) : max_rows_(max_rows) {
  TETRA_CHECK(max_rows >= 0, "max_rows=", max_rows);
  std::vector<int> iota(size_t(max_rows) + 1);  // [max_rows + 1]
  for (size_t i = 0; i < iota.size(); ++i) iota[i] = int(i);
  TETRA_CUDA_MALLOC(&table_, iota.size() * sizeof(int));
  TETRA_CUDA_CHECK(
      cudaMemcpy(table_, iota.data(), iota.size() * sizeof(int), cudaMemcpyHostToDevice));
}

RowCountTable::~RowCountTable() { cudaFree(table_); }

const int* RowCountTable::count(int m) const {
  TETRA_CHECK(m >= 0 && m <= max_rows_, "row count ", m, " outside [0, ", max_rows_, "]");
  return table_ + m;
}

std::string nvfp4_linear_unsupported_reason(int n, int k, bool gated) {
  if (n <= 0 || k <= 0) return str("bad NVFP4 linear shape [", n, ", ", k, "]");
  if (k % 64 != 0)
    return str("in_features ", k, " is not a multiple of 64 (the W4A16 kernels read k in chunks "
               "of 64)");
  const int rows = gated ? 2 * n : n;
  if (rows % 32 != 0)
    return str(gated ? "intermediate size " : "out_features ", n, " is not a multiple of ",
               gated ? 16 : 32, " (each block writes 32 packed weight rows)");
  return "";
}

namespace {
constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

void check_shape(int n, int k, bool gated, const std::string& name) {
  const std::string why = nvfp4_linear_unsupported_reason(n, k, gated);
  if (!why.empty()) TETRA_FAIL("NVFP4 linear ", name, ": ", why);
}
}  // namespace

void Nvfp4LinearBuffer::allocate_storage(int n, int k, bool gated) {
  const int rows = gated ? 2 * n : n;
  const size_t wb = packed_weight_bytes(rows, k), sb = packed_scale_bytes(rows, k);
  bytes_ = align_up(wb) + align_up(sb) + kAlign;
  TETRA_CUDA_MALLOC(&mem_, bytes_);
  uint8_t* base = static_cast<uint8_t*>(mem_);
  view_.w = base;
  view_.s = base + align_up(wb);
  view_.alpha = reinterpret_cast<const float*>(base + align_up(wb) + align_up(sb));
  view_.n = rows;
  view_.k = k;
  view_.gated = gated;
}

void Nvfp4LinearBuffer::upload(const PackedNvfp4Matrix& p, const float* alphas, int n_alpha) {
  TETRA_CUDA_CHECK(cudaMemcpy(weight_mut(), p.weight.data(), p.weight.size(),
                              cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(cudaMemcpy(scale_mut(), p.scale.data(), p.scale.size(),
                              cudaMemcpyHostToDevice));
  TETRA_CUDA_CHECK(
      cudaMemcpy(alpha_mut(), alphas, size_t(n_alpha) * sizeof(float), cudaMemcpyHostToDevice));
}

Nvfp4LinearBuffer::Nvfp4LinearBuffer(const Nvfp4MatrixView& w) {
  check_shape(w.n, w.k, false, w.name);
  const PackedNvfp4Matrix p = pack_nvfp4_matrix(w);
  allocate_storage(w.n, w.k, false);
  const float alpha = packed_alpha(w.scale_2);
  upload(p, &alpha, 1);
}

Nvfp4LinearBuffer::Nvfp4LinearBuffer(const Nvfp4MatrixView& gate, const Nvfp4MatrixView& up) {
  check_shape(gate.n, gate.k, true, gate.name);
  const PackedNvfp4Matrix p = pack_gate_up(gate, up);  // checks gate/up shapes agree
  allocate_storage(gate.n, gate.k, true);
  const float alphas[2] = {packed_alpha(gate.scale_2), packed_alpha(up.scale_2)};
  upload(p, alphas, 2);
}

Nvfp4LinearBuffer Nvfp4LinearBuffer::allocate(int n, int k, bool gated) {
  check_shape(n, k, gated, "(allocated)");
  Nvfp4LinearBuffer b;
  b.allocate_storage(n, k, gated);
  return b;
}

Nvfp4LinearBuffer::~Nvfp4LinearBuffer() { cudaFree(mem_); }

Nvfp4LinearBuffer::Nvfp4LinearBuffer(Nvfp4LinearBuffer&& o) noexcept
    : mem_(std::exchange(o.mem_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), view_(o.view_) {
  o.view_ = {};
}

Nvfp4LinearBuffer& Nvfp4LinearBuffer::operator=(Nvfp4LinearBuffer&& o) noexcept {
  if (this != &o) {
    cudaFree(mem_);
    mem_ = std::exchange(o.mem_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    view_ = o.view_;
    o.view_ = {};
  }
  return *this;
}

namespace {

// Decode kernel up to 64 rows (weights stream once per 32-row pass, later passes hit L2), the
// tiled tensor-core kernel above; its k-warps by moe_detail::classic_decode_k_warps.
cudaError_t run_one_expert(moe_detail::GroupedGemmArgs a, int M, cudaStream_t stream) {
  if (M == 0) return cudaSuccess;
  if (M > 64) return moe_detail::launch_tiled(a, 2, stream);
  moe_detail::DecodeConfig cfg;
  cfg.token_tiles = M <= 8 ? 1 : M <= 16 ? 2 : 4;
  cfg.k_warps = moe_detail::classic_decode_k_warps(a);
  return moe_detail::launch_decode(a, cfg, stream);
}

moe_detail::GroupedGemmArgs args_of(const Nvfp4LinearDevice& w, const uint16_t* x, int M,
                                    const RowCountTable& rows, void* out) {
  moe_detail::GroupedGemmArgs a;
  a.w = w.w;
  a.s = w.s;
  a.alpha0 = w.alpha;
  a.alpha1 = w.gated ? w.alpha + 1 : nullptr;
  a.x = x;
  a.out = out;
  a.rows.row_start = rows.zero();
  a.rows.row_count = rows.count(M);
  a.rows.expert_ids = nullptr;
  a.rows.gather = nullptr;
  a.n = w.n;
  a.k = w.k;
  a.num_slots = 1;
  a.total_rows = M;
  a.gated = w.gated;
  return a;
}

}  // namespace

cudaError_t linear_nvfp4(const Nvfp4LinearDevice& w, const uint16_t* x, int M,
                         const RowCountTable& rows, void* y, DType out_dtype,
                         cudaStream_t stream, uint16_t* x_scratch) {
  TETRA_CHECK(!w.gated, "linear_nvfp4 takes a plain matrix; use gate_up_silu_nvfp4");
  TETRA_CHECK(out_dtype == DType::F32 || out_dtype == DType::BF16, "out dtype ",
              dtype_name(out_dtype));
  TETRA_CHECK(w.w && w.s && w.alpha, "NVFP4 linear without device data");
  moe_detail::GroupedGemmArgs a = args_of(w, x, M, rows, y);
  a.out_f32 = out_dtype == DType::F32;
  // Large M: the wgmma kernel reads x in its order (a plain matrix's output stays in order).
  if (x_scratch != nullptr && M >= kNvfp4WgmmaMinRows && moe_wgmma_available()) {
    const cudaError_t e = moe_w4a16_to_wgmma_order(x, M, w.k, x_scratch, stream);
    if (e != cudaSuccess) return e;
    a.x = x_scratch;
    return moe_detail::launch_wgmma(a, stream);
  }
  return run_one_expert(a, M, stream);
}

std::string nvfp4_wgmma_outputs_unsupported_reason(const Nvfp4GemvOutput* outs, int n_outs,
                                                   int M) {
  if (n_outs < 1 || n_outs > moe_detail::kMaxOutSegments)
    return str("wgmma outputs: ", n_outs, " outputs (1..", moe_detail::kMaxOutSegments, ")");
  if (M < kNvfp4WgmmaOutputsMinRows)
    return str("wgmma outputs: ", M, " rows (from ", kNvfp4WgmmaOutputsMinRows, ")");
  if (!moe_wgmma_available()) return "wgmma outputs: the wgmma kernel needs SM 9.0";
  for (int i = 0; i < n_outs; ++i) {
    const Nvfp4LinearDevice* w = outs[i].w;
    if (w == nullptr || w->w == nullptr || w->s == nullptr || w->alpha == nullptr ||
        outs[i].y == nullptr)
      return str("wgmma outputs: output ", i, " unset");
    if (outs[i].residual != nullptr)
      return str("wgmma outputs: output ", i, " has a residual add (the GEMV kernels only)");
    if (w->gated) return str("wgmma outputs: output ", i, " is a gated matrix");
    const std::string why = nvfp4_linear_unsupported_reason(w->n, w->k, false);
    if (!why.empty()) return str("wgmma outputs: output ", i, ": ", why);
    if (w->k != outs[0].w->k)
      return str("wgmma outputs: output ", i, " has k ", w->k, ", output 0 ", outs[0].w->k);
  }
  return "";
}

cudaError_t linear_nvfp4_wgmma(const Nvfp4GemvOutput* outs, int n_outs, const uint16_t* x, int M,
                               const RowCountTable& rows, uint16_t* x_scratch,
                               cudaStream_t stream) {
  const std::string why = nvfp4_wgmma_outputs_unsupported_reason(outs, n_outs, M);
  if (!why.empty()) TETRA_FAIL(why);
  TETRA_CHECK(x_scratch != nullptr, "linear_nvfp4_wgmma needs x scratch for the wgmma order");
  const cudaError_t e = moe_w4a16_to_wgmma_order(x, M, outs[0].w->k, x_scratch, stream);
  if (e != cudaSuccess) return e;
  moe_detail::GroupedGemmArgs a = args_of(*outs[0].w, x_scratch, M, rows, outs[0].y);
  moe_detail::OutSegments segments;
  int rows_end = 0;
  for (int i = 0; i < n_outs; ++i) {
    const Nvfp4LinearDevice& w = *outs[i].w;
    rows_end += w.n;
    segments.seg[i] = {rows_end, w.w, w.s, w.alpha, outs[i].bias, outs[i].y};
  }
  segments.count = n_outs;
  a.n = rows_end;
  return moe_detail::launch_wgmma(a, stream, {}, segments);
}

cudaError_t gate_up_silu_nvfp4(const Nvfp4LinearDevice& w, const uint16_t* x, int M,
                               const RowCountTable& rows, uint16_t* act, cudaStream_t stream) {
  TETRA_CHECK(w.gated, "gate_up_silu_nvfp4 takes a gated (gate/up packed) matrix");
  TETRA_CHECK(w.w && w.s && w.alpha, "NVFP4 linear without device data");
  return run_one_expert(args_of(w, x, M, rows, act), M, stream);
}

}  // namespace tetra::ops::cuda
