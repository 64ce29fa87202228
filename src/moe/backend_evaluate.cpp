// evaluate(): a backend's declaration against a workload and a target, every reason spelled out.
#include <algorithm>

#include "core/error.h"
#include "moe/backend_caps.h"

namespace tetra {
namespace {

template <typename T>
bool contains(const std::vector<T>& v, const T& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// "SM100 or SM103", "SM90"
std::string sm_list(const std::vector<int>& sms) {
  std::string out;
  for (size_t i = 0; i < sms.size(); ++i) {
    if (i > 0) out += i + 1 == sms.size() ? " or " : ", ";
    out += sm_label(sms[i]);
  }
  return out;
}

template <typename T, typename Name>
std::string names(const std::vector<T>& v, Name name) {
  std::string out;
  for (const T& x : v) out += (out.empty() ? "" : ", ") + std::string(name(x));
  return out;
}

void check_device(const BackendCaps& b, const MoeWorkload& w, const Target& t,
                  std::vector<std::string>& r, std::vector<std::string>& unchecked) {
  if (b.runs_on_cpu) return;
  if (!t.gpu) {
    r.push_back("no CUDA GPU on this machine (pass --gpu NAME to check a GPU from the table)");
    return;
  }
  const GpuSpec& g = *t.gpu;
  const std::string this_gpu = sm_label(g.sm());
  if (!contains(b.sms, g.sm())) {
    if (!b.sm_note.empty())
      r.push_back(str(b.sm_note, "; this GPU is ", this_gpu));
    else
      r.push_back(str("needs ", sm_list(b.sms), b.requires_tcgen05 ? " (tcgen05)" : "",
                      "; this GPU is ", this_gpu));
  } else if (b.requires_tcgen05 && !g.has_tcgen05) {
    r.push_back(str("needs tcgen05; this GPU (", this_gpu, ") has none"));
  }
  const int64_t smem = smem_needed(b, w);
  if (b.smem.empty())
    unchecked.push_back(str("shared memory per block not checked: ", b.smem_unknown));
  if (smem > g.smem_per_block)
    r.push_back(str("needs ", format_count(smem), " B of shared memory per block; ", this_gpu,
                    " allows ", format_count(g.smem_per_block), " B"));
}

void check_formats(const BackendCaps& b, const MoeWorkload& w, std::vector<std::string>& r) {
  if (!contains(b.weight_formats, w.expert_weights)) {
    r.push_back(str("takes ", names(b.weight_formats, weight_format_name),
                    " expert weights; the checkpoint's experts are ",
                    quant_algo_label(w.expert_algo)));
    return;  // activation checks below assume the weights were accepted
  }
  const bool w4a16_ok = contains(b.act_formats, ActFormat::BF16);
  if (!w4a16_ok && b.needs_input_scale && !w.has_input_scale)
    r.push_back(str("checkpoint is ", quant_algo_label(w.expert_algo), ": no input_scale for W4A4"));
  if (!contains(b.activations, w.activation))
    r.push_back(str("activation ", w.activation, " not supported (has ", names(b.activations,
                    [](const std::string& s) { return s; }), ")"));
}

void check_shape(const BackendCaps& b, const MoeWorkload& w, std::vector<std::string>& r) {
  if (b.hidden_align > 1 && w.hidden % b.hidden_align != 0)
    r.push_back(str("hidden size ", w.hidden, " is not a multiple of ", b.hidden_align));
  if (b.inter_align > 1 && w.moe_intermediate_per_gpu % b.inter_align != 0) {
    const int moe_tp = w.plan.moe_tp();
    r.push_back(str("moe intermediate per GPU ", w.moe_intermediate_per_gpu,
                    moe_tp > 1 ? str(" (", w.moe_intermediate, " / ", moe_tp, ")") : std::string(),
                    " is not a multiple of ", b.inter_align));
  }
  if (w.layout && !contains(b.layouts, *w.layout))
    r.push_back(str("has no ", token_layout_name(*w.layout), " layout (has ",
                    names(b.layouts, token_layout_name), ")"));
  if (b.max_tokens_per_launch > 0 && w.tokens_per_launch > b.max_tokens_per_launch)
    r.push_back(str("takes at most ", format_count(b.max_tokens_per_launch),
                    " tokens per launch; ", format_count(w.tokens_per_launch), " asked"));
}

void check_parallel(const BackendCaps& b, const MoeWorkload& w, std::vector<std::string>& r) {
  const int world = w.plan.world();
  if (!b.multi_gpu && world > 1) {
    r.push_back(str("runs in one process; tp=", w.plan.tp, " ep=", w.plan.ep, " asks for ", world,
                    " GPUs"));
    return;
  }
  if (w.plan.ep > 1 && !b.supports_ep)
    r.push_back(str("no expert parallelism (ep=", w.plan.ep, " asked)"));
}

void check_memory(const BackendCaps& b, const MoeWorkload& w, const Target& t,
                  std::vector<std::string>& r) {
  if (!w.memory_known) return;  // a model problem already says why
  if (b.runs_on_cpu) {
    const MemoryFit fit{w.memory_one_process, t.host_memory_bytes};
    if (!fit.fits())
      r.push_back(str("does not fit in this machine's memory: ", describe_fit(fit)));
    return;
  }
  if (auto reason = gpu_memory_reason(w, t)) r.push_back(*reason);
}

}  // namespace

std::string format_count(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

int64_t smem_needed(const BackendCaps& caps, const MoeWorkload& w) {
  int64_t need = 0;
  for (const SmemNeed& s : caps.smem)
    if (w.moe_intermediate_per_gpu >= s.from_moe_intermediate && w.experts >= s.from_experts)
      need = std::max(need, s.bytes);
  return need;
}

std::optional<std::string> gpu_memory_reason(const MoeWorkload& w, const Target& t) {
  if (!t.gpu || !w.memory_known) return std::nullopt;
  const MemoryFit fit{w.memory_per_gpu, t.gpu->memory_bytes};
  if (fit.fits()) return std::nullopt;
  return str("does not fit in GPU memory at tp=", w.plan.tp, " ep=", w.plan.ep, ": ",
             describe_fit(fit), " per GPU");
}

Verdict evaluate(const BackendCaps& caps, const MoeWorkload& w, const Target& t) {
  Verdict v;
  v.backend = caps.name;
  if (!caps.built) v.reasons.push_back(str("not built in this version (kernels live in ", caps.origin, ")"));
  check_device(caps, w, t, v.reasons, v.unchecked);
  check_formats(caps, w, v.reasons);
  check_shape(caps, w, v.reasons);
  check_parallel(caps, w, v.reasons);
  for (const std::string& p : w.model_problems) v.reasons.push_back(p);
  check_memory(caps, w, t, v.reasons);
  v.ok = v.reasons.empty();
  return v;
}

}  // namespace tetra
