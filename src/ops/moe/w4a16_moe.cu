// Public W4A16 MoE GEMM launchers: validate, pick a kernel by rows per expert, launch.
#include "ops/moe/w4a16_moe.h"

#include <algorithm>
#include <sstream>

#include "core/cuda_check.h"
#include "core/error.h"

#include "moe/expert_weights.h"
#include "ops/moe/gemm1_routing.h"
#include "ops/moe/w4a16_launch.h"

namespace tetra {

std::ostream& operator<<(std::ostream& os, const MoeGemmProblem& p) {
  return os << "MoeGemmProblem{E=" << p.num_experts << " H=" << p.hidden << " I=" << p.inter
            << " rows=" << p.total_rows << " slots=" << p.num_slots
            << " max_rows_hint=" << p.max_rows_hint << " gemm2_pdl=" << p.gemm2_pdl
            << " gemm2_one_wave=" << p.gemm2_one_wave << " gemm2_wide=" << p.gemm2_wide << "}";
}

const char* moe_kernel_name(MoeKernel k) {
  switch (k) {
    case MoeKernel::kAuto: return "auto";
    case MoeKernel::kDecode: return "decode";
    case MoeKernel::kTiled: return "tiled";
    case MoeKernel::kWgmma: return "wgmma";
  }
  return "?";
}

std::string moe_gemm_unsupported_reason(const MoeGemmProblem& p) {
  if (p.num_experts <= 0) return str("num_experts must be positive, got ", p.num_experts);
  const std::string shape = moe_shape_unsupported_reason(p.hidden, p.inter);
  if (!shape.empty()) return shape;
  if (p.total_rows < 0) return str("total_rows must be >= 0, got ", p.total_rows);
  if (p.num_slots < 0 || p.num_slots > 65535)
    return str("num_slots must be in [0, 65535], got ", p.num_slots);
  return "";
}

namespace {

// Rows per expert from which kAuto takes the wgmma kernel (when x is in its order): wherever the
// decode kernel stops. With per-stage mbarriers it beats the tiled kernel at every size measured,
// 9 to 128 rows (H200: GLM-5 288 tokens = 9 rows 4277 -> 2926 us per layer, 1024 tokens 4845 ->
// 3700, Air 144 tokens 1051 -> 771; bench/results/2026-11-30-moe-small-batch-h200.md).
constexpr int kWgmmaMinRows = 9;
// Problems of at most this many experts take the decode kernel up to kFewExpertsDecodeRows rows,
// one 32-row pass (moe_pick_kernel). At 64 rows (two passes) the shared expert's own launches
// gained in a lone layer but not in the batch-64 decode step (+0.4%), so 32.
constexpr int kFewExperts = 2, kFewExpertsDecodeRows = 32;

int slots_of(const MoeGemmProblem& p) { return p.num_slots > 0 ? p.num_slots : p.num_experts; }

// Expected rows per expert: the hint, else rows spread evenly over the slots.
int rows_per_expert(const MoeGemmProblem& p) {
  if (p.max_rows_hint > 0) return p.max_rows_hint;
  const int slots = slots_of(p);
  return (p.total_rows + slots - 1) / std::max(slots, 1);
}

moe_detail::DecodeConfig decode_config(const MoeGemmProblem& p) {
  moe_detail::DecodeConfig c;
  const int m = rows_per_expert(p);
  // Measured on H200 (bench/moe_kernels/RESULTS.md, runs 6-7): 8 rows per pass, 4 k-warps,
  // activations read late, 2 chunks per batch and a 64-register cap for 8 blocks (32 warps) per
  // SM beat the classic kernel (4 chunks, activations with the weights, 4 blocks/SM) by 10-17% at
  // 1..64 tokens: more warps with fewer bytes each win; 4- and 8-chunk batches, double-buffered
  // batches, 8 k-warps, L2 bulk prefetch and wider passes were all slower; so were tighter
  // register caps for 9, 10 or 12 blocks per SM (bench/results/2026-11-30-dequant-code-h200.md).
  c.token_tiles = m <= 8 ? 1 : m <= 16 ? 2 : 4;
  c.k_warps = moe_detail::kLateKWarps;
  c.tiled_blocks_per_sm = 2;
  c.late_x = c.token_tiles == 1;  // the late kernel is instantiated for 8 rows per pass only
  c.chunks_per_batch = moe_detail::kLateChunks;
  c.min_blocks_per_sm = moe_detail::kLateBlocksPerSm;
  return c;
}

moe_detail::GroupedGemmArgs base_args(const MoeGemmProblem& p, const MoeRows& rows) {
  moe_detail::GroupedGemmArgs a;
  a.rows = rows;
  a.num_slots = slots_of(p);
  if (rows.expert_ids == nullptr) a.num_slots = p.num_experts;
  a.total_rows = p.total_rows;
  return a;
}

bool gemm1_weights_ok(const MoeWeightsDevice& w, const MoeRows& rows) {
  return rows.row_start != nullptr && rows.row_count != nullptr && w.w13 != nullptr &&
         w.s13 != nullptr && w.alpha_gate != nullptr && w.alpha_up != nullptr;
}

moe_detail::GroupedGemmArgs gemm1_args(const MoeGemmProblem& p, const MoeWeightsDevice& w,
                                       const MoeRows& rows, const uint16_t* x, uint16_t* act) {
  moe_detail::GroupedGemmArgs a = base_args(p, rows);
  a.w = w.w13;
  a.s = w.s13;
  a.alpha0 = w.alpha_gate;
  a.alpha1 = w.alpha_up;
  a.x = x;
  a.out = act;
  a.n = 2 * p.inter;
  a.k = p.hidden;
  a.gated = true;
  a.pdl = a.wait_first = p.gemm1_pdl;
  return a;
}

bool gemm2_weights_ok(const MoeWeightsDevice& w, const MoeRows& rows) {
  return rows.row_start != nullptr && rows.row_count != nullptr && w.w2 != nullptr &&
         w.s2 != nullptr && w.alpha_down != nullptr;
}

moe_detail::GroupedGemmArgs gemm2_args(const MoeGemmProblem& p, const MoeWeightsDevice& w,
                                       const MoeRows& rows, const uint16_t* act, void* y,
                                       bool y_f32) {
  moe_detail::GroupedGemmArgs a = base_args(p, rows);
  a.rows.gather = nullptr;  // GEMM2 reads act rows in place
  a.w = w.w2;
  a.s = w.s2;
  a.alpha0 = w.alpha_down;
  a.x = act;
  a.out = y;
  a.out_f32 = y_f32;
  a.pdl = p.gemm2_pdl;
  a.n = p.hidden;
  a.k = p.inter;
  a.gated = false;
  return a;
}

cudaError_t run(const MoeGemmProblem& p, moe_detail::GroupedGemmArgs a, MoeKernel kernel,
                cudaStream_t stream, const moe_detail::DecodeConfig* cfg) {
  if (kernel == MoeKernel::kAuto) kernel = moe_pick_kernel(p);
  // gemm1_pdl: the decode kernel's alone; the others launch normally.
  if (kernel != MoeKernel::kDecode && a.wait_first) a.pdl = a.wait_first = false;
  if (kernel == MoeKernel::kWgmma && !p.x_wgmma_order) return cudaErrorInvalidValue;
  if (kernel == MoeKernel::kWgmma && !moe_wgmma_available()) return cudaErrorInvalidDeviceFunction;
  moe_detail::DecodeConfig c = cfg ? *cfg : decode_config(p);
  if (cfg == nullptr && !c.late_x) c.k_warps = moe_detail::classic_decode_k_warps(a);
  // A GEMM2 launched as a programmatic dependent has its first weights in registers when GEMM1
  // ends and then streams the rest at full bandwidth, so a second wave of a few blocks costs it a
  // whole block time: take 3-warp blocks where only they fit one wave (GLM-4.5-Air at 1 token:
  // 1152 blocks on 132 SMs; decode step -0.5%, the MoE layer -1%, H200). GEMM1 starts cold and
  // needs the bytes in flight of 4-warp blocks (3-warp blocks measured slower there).
  if (cfg == nullptr && c.late_x && a.pdl && !a.gated && p.gemm2_one_wave)
    c = moe_detail::one_wave_late_config(a, c, p.gemm2_wide);
  if (kernel == MoeKernel::kTiled) return moe_detail::launch_tiled(a, c.tiled_blocks_per_sm, stream);
  if (kernel == MoeKernel::kWgmma) return moe_detail::launch_wgmma(a, stream, c.wgmma);
  return moe_detail::launch_decode(a, c, stream);
}

}  // namespace

MoeKernel moe_pick_kernel(const MoeGemmProblem& p) {
  // Up to ~8 rows per expert the weights dominate: stream them once (decode kernel). Above, a
  // kernel that reuses each dequantized fragment for up to 128 rows: wgmma when x comes in its
  // order (the MoE layer reorders x when this picks it), else the mma.sync tiled kernel.
  const int m = rows_per_expert(p);
  if (m <= 8) return MoeKernel::kDecode;
  // One or two experts (the shared expert's own launches) with up to 32 rows: the tiled kernel's
  // blocks (128 weight rows of one expert each) are too few to fill the GPU, while the decode
  // kernel with 32-row passes was 3.5-6x faster on one expert at 16-64 rows
  // (tests/gpu/bench_decode_parts, H200, session 14); the MoE layer at 9 and 16 tokens 1-2%.
  if (!p.x_wgmma_order && slots_of(p) <= kFewExperts && m <= kFewExpertsDecodeRows)
    return MoeKernel::kDecode;
  return p.x_wgmma_order && m >= kWgmmaMinRows && moe_wgmma_available() ? MoeKernel::kWgmma
                                                                        : MoeKernel::kTiled;
}

bool moe_wgmma_available() { return current_device_compute_capability() == 90; }

namespace moe_detail {
cudaError_t gemm1_with(const MoeGemmProblem& p, const MoeWeightsDevice& w, const MoeRows& rows,
                       const uint16_t* x, uint16_t* act, cudaStream_t stream, MoeKernel kernel,
                       const DecodeConfig* cfg) {
  if (!moe_gemm_unsupported_reason(p).empty() || !gemm1_weights_ok(w, rows))
    return cudaErrorInvalidValue;
  if (p.total_rows == 0) return cudaSuccess;
  return run(p, gemm1_args(p, w, rows, x, act), kernel, stream, cfg);
}

cudaError_t gemm2_with(const MoeGemmProblem& p, const MoeWeightsDevice& w, const MoeRows& rows,
                       const uint16_t* act, void* y, bool y_f32, cudaStream_t stream,
                       MoeKernel kernel, const DecodeConfig* cfg) {
  if (!moe_gemm_unsupported_reason(p).empty() || !gemm2_weights_ok(w, rows))
    return cudaErrorInvalidValue;
  if (p.total_rows == 0) return cudaSuccess;
  return run(p, gemm2_args(p, w, rows, act, y, y_f32), kernel, stream, cfg);
}
}  // namespace moe_detail

namespace {
bool default_late(const MoeGemmProblem& p) {
  if (!moe_gemm_unsupported_reason(p).empty() || moe_pick_kernel(p) != MoeKernel::kDecode)
    return false;
  return moe_detail::is_default_late(decode_config(p));
}
}  // namespace

bool moe_gemm_pair_fits(const MoeGemmProblem& p1, const MoeGemmProblem& p2) {
  return default_late(p1) && default_late(p2) && slots_of(p1) == slots_of(p2);
}

bool moe_gemm_pair_preferred(const MoeGemmProblem& p1, int active_slots) {
  const double blocks = double(2 * p1.inter / 32) * active_slots;
  const double wave = double(moe_detail::kLateBlocksPerSm) * current_device_sm_count();
  return blocks > wave && blocks <= 2.0 * wave;
}

cudaError_t moe_w4a16_gemm_pair(const MoeGemmProblem& p1, const MoeGemmProblem& p2,
                                const MoeWeightsDevice& w, const MoeRows& rows,
                                const uint16_t* x, uint16_t* act, float* y, uint32_t* done,
                                cudaStream_t stream) {
  if (!moe_gemm_pair_fits(p1, p2) || !gemm1_weights_ok(w, rows) || !gemm2_weights_ok(w, rows) ||
      done == nullptr)
    return cudaErrorInvalidValue;
  if (p1.total_rows == 0) return cudaSuccess;
  return moe_detail::launch_decode_pair(gemm1_args(p1, w, rows, x, act),
                                        gemm2_args(p2, w, rows, act, y, true), done, stream);
}

const char* moe_gemm1_routed_unsupported(const MoeGemmProblem& p, const Gemm1Routing& r,
                                         const Gemm1Fold* fold) {
  const int K = r.router.top_k, E = r.router.num_experts;
  if (!default_late(p)) return "not the default late decode configuration";
  if (E < 1 || E > kGemm1RoutingMaxExperts || E != p.num_experts - (r.shared_slot ? 1 : 0))
    return "experts: at most 256, all of them local";
  if (K < 1 || K >= moe::kMaxTopK || K > E) return "top_k: 1..31";
  if (p.num_slots != K + (r.shared_slot ? 1 : 0) || p.total_rows < p.num_slots)
    return "one token: top_k slots (+1 shared) of one row each";
  if (!r.logits || !r.ids || !r.weights || !r.slot_of || !r.slots || !r.offsets ||
      !r.row_count || !r.row_token)
    return "missing routing pointers";
  if (fold && r.router.scoring == moe::Scoring::Softmax)
    return "the router fold takes sigmoid scoring only";
  if (fold && (!fold->sums || fold->copies < 1 || fold->copies > moe::kRouterFoldMaxCopies))
    return "router fold: sums and 1..16 copies";
  return "";
}

cudaError_t moe_w4a16_gemm1_routed(const MoeGemmProblem& p, const MoeWeightsDevice& w,
                                   const Gemm1Routing& r, const uint16_t* x, uint16_t* act,
                                   cudaStream_t stream, const Gemm1Fold* fold) {
  if (*moe_gemm1_routed_unsupported(p, r, fold) != '\0') return cudaErrorInvalidValue;
  MoeRows rows;  // replaced in the kernel by the rows it routes; checked as GEMM1's are
  rows.row_start = r.offsets;
  rows.row_count = r.row_count;
  rows.expert_ids = r.slots;
  rows.gather = r.row_token;
  if (!gemm1_weights_ok(w, rows)) return cudaErrorInvalidValue;
  return moe_detail::launch_decode_routed(gemm1_args(p, w, rows, x, act), r, stream, fold);
}

cudaError_t moe_w4a16_gemm1(const MoeGemmProblem& p, const MoeWeightsDevice& w,
                            const MoeRows& rows, const uint16_t* x, uint16_t* act,
                            cudaStream_t stream, MoeKernel kernel) {
  return moe_detail::gemm1_with(p, w, rows, x, act, stream, kernel, nullptr);
}

cudaError_t moe_w4a16_gemm2(const MoeGemmProblem& p, const MoeWeightsDevice& w,
                            const MoeRows& rows, const uint16_t* act, void* y, bool y_f32,
                            cudaStream_t stream, MoeKernel kernel) {
  return moe_detail::gemm2_with(p, w, rows, act, y, y_f32, stream, kernel, nullptr);
}

}  // namespace tetra
