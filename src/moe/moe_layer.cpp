// make_moe_layer: weight checks, the backend decision (the same declarations `tetra check` reads),
// dispatch to the backend's constructor.
#include "moe/moe_layer.h"

#include <cmath>

#include "core/error.h"
#include "moe/backend_select.h"
#include "moe/w4a4_scales.h"
#include "perf/gpu_spec.h"

namespace tetra::moe {
namespace {

const char* format_name(ExpertFormat f) { return f == ExpertFormat::NVFP4 ? "NVFP4" : "BF16"; }

void check_nvfp4(const std::string& layer, const Nvfp4MatrixView& m, int n, int k,
                 const char* what) {
  const std::string name = m.name.empty() ? str(layer, " ", what) : m.name;
  if (!m.weight || !m.scale) TETRA_FAIL(name, ": NVFP4 weight or weight_scale is missing");
  if (m.n != n || m.k != k)
    TETRA_FAIL(name, ": shape [", m.n, ", ", m.k, "], expected [", n, ", ", k, "]");
  if (!(m.scale_2 > 0.0f) || !std::isfinite(m.scale_2))
    TETRA_FAIL(name, ": weight_scale_2 must be positive and finite, got ", m.scale_2);
}

void check_bf16(const std::string& layer, const Bf16MatrixView& m, int n, int k,
                const char* what) {
  const std::string name = m.name.empty() ? str(layer, " ", what) : m.name;
  if (!m.weight) TETRA_FAIL(name, ": BF16 weight is missing");
  if (m.n != n || m.k != k)
    TETRA_FAIL(name, ": shape [", m.n, ", ", m.k, "], expected [", n, ", ", k, "]");
}

// Width of an MLP as its gate matrix says.
int mlp_width(const ExpertMlpView& m) {
  return m.format == ExpertFormat::NVFP4 ? m.gate.n : m.gate_bf16.n;
}

void check_mlp(const std::string& layer, const ExpertMlpView& m, int H, int I) {
  if (m.format == ExpertFormat::NVFP4) {
    check_nvfp4(layer, m.gate, I, H, "gate_proj");
    check_nvfp4(layer, m.up, I, H, "up_proj");
    check_nvfp4(layer, m.down, H, I, "down_proj");
  } else {
    check_bf16(layer, m.gate_bf16, I, H, "gate_proj");
    check_bf16(layer, m.up_bf16, I, H, "up_proj");
    check_bf16(layer, m.down_bf16, H, I, "down_proj");
  }
}

// The first routed linear without an input_scale, for the W4A4 refusal ("" when none).
std::string first_missing_input_scale(const MoeLayerWeights& w) {
  for (size_t e = 0; e < w.experts.size(); ++e) {
    const ExpertMlpView& m = w.experts[e];
    if (m.format != ExpertFormat::NVFP4) return "";  // BF16 experts: the algo label says it
    const Nvfp4MatrixView* mats[3] = {&m.gate, &m.up, &m.down};
    const char* what[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < 3; ++i)
      if (!mats[i]->input_scale)
        return mats[i]->name.empty()
                   ? str(w.name, ".experts.", w.expert_begin + int(e), ".", what[i], ".input_scale")
                   : str(mats[i]->name, ".input_scale");
  }
  return "";
}

}  // namespace

bool mlp_has_input_scales(const ExpertMlpView& m) {
  return m.format == ExpertFormat::NVFP4 && m.gate.input_scale && m.up.input_scale &&
         m.down.input_scale;
}

bool layer_has_input_scales(const MoeLayerWeights& w) {
  if (w.experts.empty()) return false;
  for (const ExpertMlpView& m : w.experts)
    if (!mlp_has_input_scales(m)) return false;
  return true;
}

W4a4MlpScales w4a4_mlp_scales(const ExpertMlpView& m, const std::string& mlp_name) {
  if (!mlp_has_input_scales(m)) TETRA_FAIL(mlp_name, ": no input_scale for W4A4");
  W4a4MlpScales s;
  s.gate_up = w4a4_gate_up_input_scale(*m.gate.input_scale, *m.up.input_scale, mlp_name);
  check_input_scale(*m.down.input_scale, mlp_name + ".down_proj.input_scale");
  s.down = *m.down.input_scale;
  return s;
}

void validate_layer_weights(const MoeLayerWeights& w) {
  const std::string& L = w.name.empty() ? std::string("moe layer") : w.name;
  if (w.hidden <= 0 || w.inter <= 0)
    TETRA_FAIL(L, ": bad shape hidden=", w.hidden, " moe_intermediate=", w.inter);
  try {
    validate_router_params(w.router);
  } catch (const Error& e) {
    TETRA_FAIL(L, ": ", e.what());
  }
  const int E_global = w.router.num_experts;
  const int E = int(w.experts.size());  // local block [expert_begin, expert_begin + E)
  if (E == 0) TETRA_FAIL(L, ": no routed experts given");
  if (w.expert_begin < 0)
    TETRA_FAIL(L, ": expert_begin ", w.expert_begin, " is negative");
  if (int64_t(w.expert_begin) + E > E_global)
    TETRA_FAIL(L, ": routed experts ", w.expert_begin, "..", int64_t(w.expert_begin) + E - 1,
               " given, the router has ", E_global, " (ids 0..", E_global - 1, ")");
  if (!w.gate) TETRA_FAIL(L, ".gate.weight: router weight is missing");
  if (w.gate_rows != 0 && w.gate_rows != E_global)
    TETRA_FAIL(L, ".gate.weight: ", w.gate_rows, " rows, expected one per expert of the whole "
               "layer (", E_global, "), also on an expert-parallel rank");
  if (w.gate_dtype != DType::BF16 && w.gate_dtype != DType::F32)
    TETRA_FAIL(L, ".gate.weight: dtype ", dtype_name(w.gate_dtype), ", expected BF16 or F32");
  const ExpertFormat f = w.experts[0].format;
  for (int e = 0; e < E; ++e) {
    const int g = w.expert_begin + e;  // global id: what the tensor names say
    if (w.experts[size_t(e)].format != f)
      TETRA_FAIL(L, ": expert ", g, " is ", format_name(w.experts[size_t(e)].format),
                 ", expert ", w.expert_begin, " is ", format_name(f), " (one format per layer)");
    check_mlp(str(L, ".experts.", g), w.experts[size_t(e)], w.hidden, w.inter);
  }
  if (w.shared) {
    const int Is = mlp_width(*w.shared);
    if (Is <= 0) TETRA_FAIL(L, ".shared_experts: bad width ", Is);
    check_mlp(L + ".shared_experts", *w.shared, w.hidden, Is);
  }
}

RouterParams router_params_of(const ModelConfig& c) {
  RouterParams p;
  p.scoring = c.routing.scoring == RouterScoring::Sigmoid ? Scoring::Sigmoid : Scoring::Softmax;
  p.num_experts = int(c.n_routed_experts);
  p.top_k = int(c.num_experts_per_tok);
  p.n_group = int(c.routing.n_group);
  p.topk_group = int(c.routing.topk_group);
  p.norm_topk_prob = c.routing.norm_topk_prob;
  p.routed_scaling_factor = float(c.routing.routed_scaling_factor);
  validate_router_params(p);
  return p;
}

MoeWorkload layer_workload(const MoeLayerWeights& w, const MoeLayerOptions& o) {
  MoeWorkload m;
  m.model_label = w.name.empty() ? std::string("moe layer") : w.name;
  const bool nvfp4 = !w.experts.empty() && w.experts[0].format == ExpertFormat::NVFP4;
  // Input scales on every routed linear make it a W4A4 (NVFP4) layer; without, W4A16_NVFP4.
  const bool scales = nvfp4 && layer_has_input_scales(w);
  m.expert_algo = !nvfp4 ? QuantAlgo::None : scales ? QuantAlgo::NVFP4 : QuantAlgo::W4A16_NVFP4;
  m.expert_weights = nvfp4 ? WeightFormat::NVFP4 : WeightFormat::BF16;
  m.has_input_scale = scales;
  m.hidden = w.hidden;
  m.moe_intermediate = w.inter;
  m.moe_intermediate_per_gpu = w.inter;
  m.experts = w.router.num_experts;
  m.top_k = w.router.top_k;
  m.plan = ParallelPlan{1, 1};
  m.memory_known = false;  // one layer: the model's memory is the runtime's business
  m.layout = o.layout;
  m.tokens_per_launch = o.max_tokens;
  // A named CUDA backend runs the shared expert through GEMMs of its format: NVFP4 ones read k
  // in chunks of 64, BF16 ones in 16-byte rows. (auto leaves it to the runner's own check.)
  if (w.shared && o.backend != "cpu" && o.backend != "auto") {
    const int Is = mlp_width(*w.shared);
    const int align = w.shared->format == ExpertFormat::NVFP4 ? 64 : 8;
    if (Is % align != 0)
      m.model_problems.push_back(
          str("shared expert width ", Is, " is not a multiple of ", align, " (the GEMMs' k step)"));
  }
  return m;
}

std::unique_ptr<MoeLayerRunner> make_moe_layer(const MoeLayerWeights& w, const MoeLayerOptions& o) {
  validate_layer_weights(w);
  if (o.max_tokens <= 0) TETRA_FAIL(w.name, ": max_tokens must be positive, got ", o.max_tokens);
  Target target;
  if (o.target) {
    target = *o.target;
  } else {
    target.gpu = detect_local_gpu();
    target.host_memory_bytes = host_memory_bytes();
  }
  // W4A4 is asked for, never picked by auto on its own: it changes the numerics.
  const bool w4a4 = o.w4a4 || o.backend == "cuda-w4a4";
  std::string backend = o.backend;
  if (w4a4 && backend == "auto") backend = target.gpu ? "cuda-w4a4" : "cpu";
  if (w4a4 && backend != "cpu" && backend != "cuda-w4a4")
    TETRA_FAIL(w.name, ": W4A4 numerics asked for, but MoE backend ", backend,
               " keeps bf16 activations (use cuda-w4a4 or cpu)");
  const MoeWorkload workload = layer_workload(w, o);
  if (w4a4 && !workload.has_input_scale) {
    // The same words as check's refusal, plus the first tensor that is missing.
    const std::string missing = first_missing_input_scale(w);
    TETRA_FAIL("MoE backend ", backend, " with W4A4 numerics cannot run ", w.name, ": checkpoint is ",
               quant_algo_label(workload.expert_algo), ": no input_scale for W4A4",
               missing.empty() ? std::string() : str(" (", missing, " is missing)"));
  }
  const BackendCaps& caps = require_compatible(backend, workload, target);
  if (caps.name == "cpu") return make_cpu_moe_layer(w, o.max_tokens, w4a4);
  if (caps.name == "cuda-w4a16" || caps.name == "cuda-bf16" || caps.name == "cuda-w4a4")
    return make_cuda_moe_layer(w, o.max_tokens, o.layout, w4a4);
  TETRA_FAIL(w.name, ": MoE backend ", caps.name, " has no layer runner in this version");
}

}  // namespace tetra::moe
