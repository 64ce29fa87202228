// One MoE layer as the model runtime calls it: route, dispatch, expert FFNs, shared expert,
// weighted combine (+ residual), behind one backend-neutral interface.
//
//   auto moe = make_moe_layer(weights, {.backend = "auto", .max_tokens = 4096});
//   moe->forward(x, T, out, residual, stream);  // device pointers when moe->on_device()
//
// Semantics (MODELS.md): out[t] = sum_j w[t,j] * Expert_{ids[t,j]}(x[t]) + Shared(x[t]) + residual[t]
// with Expert(x) = down(silu(gate(x)) * up(x)). Routing is route_cpu / cuda::route. An expert-
// parallel block (MoeLayerWeights::expert_begin) sums only the j whose expert it holds.
//
// Numerics, the same on every backend so that they can be compared to 1e-5 NMSE:
//   router logits from the bf16 x and the bf16 router weight (an F32 router weight is rounded to
//   bf16 once, at construction: the CUDA router reads bf16), float32 routing (bit-identical ids and weights on CPU and GPU);
//   expert GEMMs accumulate in float32; the intermediate silu(g)*u is ROUNDED TO BF16 (the GPU
//   keeps it in bf16 between GEMM1 and GEMM2; the cpu backend rounds it the same way on purpose);
//   expert outputs stay float32; the shared expert's output is rounded to bf16 (combine reads it
//   as bf16); the combine is combine_bf16's fixed-order FMA sum with one final rounding.
//
// Backends: "cpu" (host pointers; float32 loops on the dequantized weights), "cuda-w4a16" (device
// pointers; NVFP4 experts), "cuda-w4a4" (device pointers; NVFP4 experts AND NVFP4 activations
// quantized with the checkpoint's input_scale, moe/w4a4_reference.h), "cuda-bf16" (device
// pointers; BF16 experts), "auto" (the declarations' pick: never cuda-w4a4 unless
// MoeLayerOptions::w4a4 asks, because W4A4 changes the numerics). On the CUDA backends the shared
// expert may be NVFP4 or BF16. The backend is checked with require_compatible, so a refusal
// carries the reasons `tetra check` prints.
//
// W4A4 numerics (cuda-w4a4, and "cpu" with MoeLayerOptions::w4a4 = its CPU twin): every routed
// expert needs gate/up/down input_scale (else the refusal "checkpoint is W4A16_NVFP4: no
// input_scale for W4A4"). GEMM1 quantizes x once for the fused gate+up GEMM with
// max(gate.input_scale, up.input_scale) (moe/w4a4_scales.h: the larger scale never saturates
// what either calibrated range covers; ModelOpt exports them equal). The shared expert runs W4A4
// when its three linears carry input_scale too, else W4A16 (bf16 activations).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "moe/add_rms_norm_step.h"
#include "moe/backend_caps.h"
#include "format/model_config.h"
#include "moe/expert_weights.h"
#include "moe/router.h"
#include "moe/router_fold.h"

namespace tetra::moe {

using ::tetra::TokenLayout;  // moe::TokenLayout reads naturally at call sites

// One BF16 linear layer as stored on disk (borrowed pointer).
struct Bf16MatrixView {
  const uint16_t* weight = nullptr;  // [n, k] bf16 bits, row-major
  int n = 0;                         // out_features
  int k = 0;                         // in_features
  std::string name;                  // tensor name, for error messages
};

enum class ExpertFormat { NVFP4, BF16 };

// One SwiGLU MLP (a routed expert or the shared expert): down(silu(gate(x)) * up(x)).
// Fill the three matrices of `format`; the others stay empty.
struct ExpertMlpView {
  ExpertFormat format = ExpertFormat::NVFP4;
  Nvfp4MatrixView gate, up, down;        // NVFP4: gate/up [I, H], down [H, I]
  Bf16MatrixView gate_bf16, up_bf16, down_bf16;  // BF16: same shapes
};

// Everything one MoE layer reads (borrowed: the runner copies or uploads what it keeps, so the
// views may die after construction).
//
// Expert parallelism: a rank holds the contiguous block of routed experts
// [expert_begin, expert_begin + experts.size()) but routes over all E_global = router.num_experts
// (the router weight and bias keep every expert). forward then adds only the pairs whose expert
// is local, each with its routing weight as the whole layer computes it (NOT renormalised over
// the local ones), so summing the outputs of all ranks gives the unsplit layer. The shared expert
// and the residual belong to one rank (the others leave them out).
struct MoeLayerWeights {
  std::string name;  // e.g. "model.layers.3.mlp": prefixes every error
  int hidden = 0;    // H
  int inter = 0;     // routed experts' I (moe_intermediate_size)
  RouterParams router;               // num_experts = E_global
  const void* gate = nullptr;        // [E_global, H] router weight, gate_dtype BF16 or F32
  DType gate_dtype = DType::BF16;
  int gate_rows = 0;                 // rows of the router weight tensor when known (0 = unknown)
  const float* bias = nullptr;       // [E_global] e_score_correction_bias as float32, or nullptr
  int expert_begin = 0;              // global id of experts[0]
  std::vector<ExpertMlpView> experts;  // [E_local] routed experts (E_local <= E_global), one format
  std::optional<ExpertMlpView> shared;  // width = its own gate.n (n_shared * moe_intermediate)
};

struct MoeLayerOptions {
  std::string backend = "auto";  // "auto", "cpu", "cuda-w4a16", ...
  int max_tokens = 0;            // largest T forward accepts (> 0); sizes all scratch
  TokenLayout layout = TokenLayout::Contiguous;  // masked: [E, max_tokens, .] rows (decode)
  std::optional<Target> target;  // where to run; default: this machine (detected GPU)
  // W4A4 numerics (see above). With backend "cpu": the cpu twin of cuda-w4a4; with "auto": pick
  // cuda-w4a4 on a GPU, else cpu; "cuda-w4a4" implies it; any other backend refuses it.
  bool w4a4 = false;
};

class MoeLayerRunner {
 public:
  virtual ~MoeLayerRunner() = default;
  virtual const std::string& backend() const = 0;
  // True: forward takes device pointers and runs on `stream`; false: host pointers.
  virtual bool on_device() const = 0;
  virtual int max_tokens() const = 0;
  // x [T, H] bf16 -> out [T, H] bf16 (+ residual [T, H] bf16 when not null). 0 <= T <=
  // max_tokens. The cuda backend allocates nothing and never synchronises here, so forward can
  // be captured in a CUDA graph (one graph per T: shapes follow T). out must not alias x
  // or residual (the combine kernel reads them through restrict pointers).
  virtual void forward(const uint16_t* x, int T, uint16_t* out, const uint16_t* residual,
                       cudaStream_t stream) = 0;
  // forward(x, T, out, nullptr, stream), then the decoder's add + RMSNorm in the same launches
  // (moe/add_rms_norm_step.h; norm.normed may be x; with norm.fold, gx and the sums of squares
  // for a reader that applies 1/rms). false: this backend does not fuse it at this T (or this
  // fold) and nothing ran.
  // With `pre`, x is the un-normalised row and the norm before the block runs in its first
  // launch (moe/add_rms_norm_step.h PreRmsNormStep); only where takes_pre_norm(T).
  virtual bool forward_add_rms_norm(const uint16_t* x, int T, uint16_t* out,
                                    const AddRmsNormStep& norm, cudaStream_t stream,
                                    const PreRmsNormStep* pre = nullptr) {
    (void)x, (void)T, (void)out, (void)norm, (void)stream, (void)pre;
    return false;
  }
  // The part count a folded norm (AddRmsNormStep::fold, moe/add_rms_norm_step.h) must have for
  // forward_add_rms_norm to take it: fixed by how the backend splits a row; 0: it does not fold.
  virtual int norm_fold_parts() const { return 0; }
  // Whether forward_add_rms_norm takes a PreRmsNormStep at T tokens (known before the launches
  // that precede the block, whose epilogue must then add the residual).
  virtual bool takes_pre_norm(int T) const {
    (void)T;
    return false;
  }
  // The router folded into o_proj's epilogue (moe/router_fold.h) at T tokens, where
  // takes_pre_norm(T): what that epilogue takes (its gx is the caller's: pre.normed), or nullptr
  // where this layer does not take the fold. The caller then passes a PreRmsNormStep with
  // router_folded set. Needs prepare_router_fold first.
  virtual const RouterFold* router_fold(int T) const {
    (void)T;
    return nullptr;
  }
  // Builds the fold's constants from the post-attention norm's weight ([H] bf16, device memory
  // on a CUDA backend). Not during stream capture. A no-op where the layer cannot fold.
  virtual void prepare_router_fold(const uint16_t* norm_weight) { (void)norm_weight; }
};

// Checks the weights (shapes, formats, names in errors) and the backend (require_compatible),
// then builds the runner: the cuda backends pack and upload the weights and allocate all scratch
// here. Throws tetra::Error.
std::unique_ptr<MoeLayerRunner> make_moe_layer(const MoeLayerWeights& w, const MoeLayerOptions& o);

// ---- pieces shared by the backends (exposed for tests and the benchmark) --------------------

// The workload require_compatible judges: the layer's formats and shape, one GPU, o.layout,
// o.max_tokens per launch.
MoeWorkload layer_workload(const MoeLayerWeights& w, const MoeLayerOptions& o);
// Throws an Error naming w.name and the tensor on any inconsistency (shapes, formats, nulls, an
// expert block outside [0, E_global)).
void validate_layer_weights(const MoeLayerWeights& w);

// The routing fields of a config.json (n_routed_experts, num_experts_per_tok, scoring, groups,
// norm_topk_prob, routed_scaling_factor) as RouterParams; validated.
RouterParams router_params_of(const ModelConfig& c);

// The router weight as the backends use it: [E, H] bf16 bits (F32 rounded RNE).
std::vector<uint16_t> router_weight_bf16(const MoeLayerWeights& w);
// One MLP's weights in float32: w13 [2I, H] (rows 0..I-1 gate, I..2I-1 up), w2 [H, I].
void dequantize_mlp(const ExpertMlpView& m, int H, int I, float* w13, float* w2);

// Backend constructors (make_moe_layer dispatches here after the checks).
// w4a4: routed experts (and the shared one when it has input scales) with W4A4 numerics.
std::unique_ptr<MoeLayerRunner> make_cpu_moe_layer(const MoeLayerWeights& w, int max_tokens,
                                                   bool w4a4 = false);
// Defined in ops/moe/moe_layer_cuda.cu: cuda-w4a16 for NVFP4 experts, cuda-bf16 for BF16 ones,
// cuda-w4a4 for NVFP4 experts when w4a4.
std::unique_ptr<MoeLayerRunner> make_cuda_moe_layer(const MoeLayerWeights& w, int max_tokens,
                                                    TokenLayout layout, bool w4a4 = false);

// True when the MLP is NVFP4 and gate, up and down all carry an input_scale.
bool mlp_has_input_scales(const ExpertMlpView& m);
// True when every routed expert does (the shared expert is not asked: it may stay W4A16).
bool layer_has_input_scales(const MoeLayerWeights& w);
// The MLP's two activation scales for W4A4: {GEMM1 = max(gate, up), GEMM2 = down}, each checked
// (positive, finite, invertible; errors name the tensor). Needs mlp_has_input_scales(m).
struct W4a4MlpScales {
  float gate_up = 0.0f;
  float down = 0.0f;
};
W4a4MlpScales w4a4_mlp_scales(const ExpertMlpView& m, const std::string& mlp_name);

}  // namespace tetra::moe
