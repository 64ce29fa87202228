#include "cli/check_report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace tetra::cli {
namespace {

template <typename T, typename Name>
std::string join_names(const std::vector<T>& v, Name name, std::string_view sep = ", ") {
  std::string out;
  for (const T& x : v) out += (out.empty() ? "" : std::string(sep)) + std::string(name(x));
  return out;
}

std::string ident(const std::string& s) { return s; }

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

std::string tb_per_s(double bytes_per_s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f TB/s", bytes_per_s / 1e12);
  return buf;
}

std::string gpu_line(const Target& t) {
  if (!t.gpu) return "none on this machine (CUDA found no device); GPU backends cannot run";
  const GpuSpec& g = *t.gpu;
  return str(g.name, " - ", g.product, ", ", sm_label(g.sm()), ", ", g.sms, " SMs, ",
             format_count(g.smem_per_block), " B shared memory per block, ",
             format_gb(double(g.memory_bytes)), ", ",
             g.bandwidth_bytes_per_s > 0 ? tb_per_s(g.bandwidth_bytes_per_s) : "bandwidth unknown",
             g.detected ? " (detected)" : " (spec table)");
}

std::string memory_line(const MoeWorkload& w, const Target& t) {
  if (!w.memory_known) return "not sized (see the shared problems)";
  if (!t.gpu)
    return str("per GPU weights ", format_gb(w.memory_per_gpu.weights_bytes), " + KV cache ",
               format_gb(w.memory_per_gpu.kv_bytes), "; no GPU to compare with");
  const MemoryFit fit{w.memory_per_gpu, t.gpu->memory_bytes};
  return str("per GPU ", describe_fit(fit), fit.fits() ? " -> fits" : " -> does NOT fit");
}

// The reasons one row shows: shared ones are printed once above the table.
std::vector<std::string> row_reasons(const Verdict& v, const std::vector<std::string>& shared) {
  std::vector<std::string> own;
  size_t hidden = 0;
  for (const std::string& r : v.reasons) {
    if (std::find(shared.begin(), shared.end(), r) != shared.end())
      ++hidden;
    else
      own.push_back(r);
  }
  if (hidden > 0)
    own.push_back(str("+ ", hidden, " shared problem", hidden > 1 ? "s" : "", " listed above"));
  return own;
}

std::string declaration_text(const BackendCaps& b) {
  std::ostringstream os;
  os << b.name << " (" << b.origin << (b.built ? ", built" : ", not built in this version")
     << "): " << b.summary << "\n";
  os << "    weights " << join_names(b.weight_formats, weight_format_name) << "; activations "
     << join_names(b.act_formats, act_format_name)
     << (b.needs_input_scale ? " (needs input_scale)" : "") << "; ";
  if (b.runs_on_cpu)
    os << "any machine (CPU)";
  else
    os << join_names(b.sms, sm_label, "/") << (b.sm_note.empty() ? "" : " (" + b.sm_note + ")")
       << (b.requires_tcgen05 ? ", tcgen05" : "");
  os << "\n    shared memory per block: ";
  if (b.smem.empty()) os << (b.runs_on_cpu ? "none (CPU)" : "not declared (" + b.smem_unknown + ")");
  for (size_t i = 0; i < b.smem.size(); ++i) {
    const SmemNeed& s = b.smem[i];
    os << (i ? "; " : "") << format_count(s.bytes) << " B";
    if (s.from_moe_intermediate > 0) os << " from moe intermediate " << s.from_moe_intermediate;
    if (s.from_experts > 0) os << " from " << s.from_experts << " experts";
  }
  os << "; layouts " << join_names(b.layouts, token_layout_name) << "; hidden % "
     << b.hidden_align << ", intermediate % " << b.inter_align << "; tokens per launch "
     << (b.max_tokens_per_launch > 0 ? format_count(b.max_tokens_per_launch) : "no limit")
     << "\n    multi-GPU " << (b.multi_gpu ? "yes" : "no") << "; expert parallel "
     << (b.supports_ep ? "yes" : "no") << "; activations " << join_names(b.activations, ident)
     << "; auto priority " << b.priority << "\n";
  for (const std::string& s : b.sources) os << "    source: " << s << "\n";
  for (const SmemNeed& s : b.smem)
    if (!s.source.empty()) os << "    source: " << s.source << "\n";
  return os.str();
}

}  // namespace

std::string check_report_text(const CheckResult& r) {
  const MoeWorkload& w = r.workload;
  std::ostringstream os;
  os << "model:   " << w.model_label << " (" << w.arch << ")\n";
  os << "experts: " << w.experts << " x [hidden " << w.hidden << ", intermediate "
     << w.moe_intermediate << "], top-" << w.top_k << ", " << w.activation << "; format "
     << quant_algo_label(w.expert_algo) << ", input_scale " << (w.has_input_scale ? "yes" : "no")
     << "\n";
  os << "GPU:     " << gpu_line(r.target) << "\n";
  os << "split:   tp=" << w.plan.tp << " ep=" << w.plan.ep << " -> " << w.plan.world()
     << " GPU" << (w.plan.world() > 1 ? "s" : "") << "; moe intermediate per GPU "
     << w.moe_intermediate_per_gpu << "\n";
  if (!r.split_detail.empty()) os << "         " << r.split_detail << "\n";
  os << "memory:  " << memory_line(w, r.target) << " (KV cache: one sequence of "
     << kMinimalKvTokens << " tokens, bf16)\n";
  if (r.runtime_reasons.empty()) {
    os << "runtime: generate, serve and bench decode support this model (on a GPU, where a "
          "backend below can run)\n";
  } else {
    os << "runtime: generate, serve and bench decode cannot run this model (the rows below are "
          "about its MoE layers, as tetra bench moe runs them):\n";
    for (const std::string& s : r.runtime_reasons) os << "  - " << s << "\n";
  }
  if (!r.shared.empty()) {
    os << "shared problems (every GPU backend):\n";
    for (const std::string& s : r.shared) os << "  - " << s << "\n";
  }
  os << "\n";

  size_t name_w = std::string("backend").size(), verdict_w = std::string("refused").size();
  for (const Verdict& v : r.verdicts) name_w = std::max(name_w, v.backend.size());
  const std::string built_h = "built";
  os << pad("backend", name_w) << " | " << built_h << " | " << pad("verdict", verdict_w)
     << " | reasons\n";
  os << std::string(name_w, '-') << "-+-" << std::string(built_h.size(), '-') << "-+-"
     << std::string(verdict_w, '-') << "-+--------\n";
  const std::string cont = std::string(name_w, ' ') + " | " + std::string(built_h.size(), ' ') +
                           " | " + std::string(verdict_w, ' ') + " | ";
  for (const Verdict& v : r.verdicts) {
    const BackendCaps* caps = find_backend(v.backend);
    std::vector<std::string> reasons = row_reasons(v, r.shared);
    reasons.insert(reasons.end(), v.unchecked.begin(), v.unchecked.end());
    os << pad(v.backend, name_w) << " | " << pad(caps && caps->built ? "yes" : "no", built_h.size())
       << " | " << pad(v.ok ? "ok" : "refused", verdict_w) << " | "
       << (reasons.empty() ? "" : reasons[0]) << "\n";
    for (size_t i = 1; i < reasons.size(); ++i) os << cont << reasons[i] << "\n";
  }
  os << "\nauto: " << (r.auto_pick ? *r.auto_pick : "none (no backend can run this)");
  if (const BackendCaps* pick = r.auto_pick ? find_backend(*r.auto_pick) : nullptr;
      pick != nullptr && pick->runs_on_cpu)
    os << " (no GPU backend can run this model on this GPU: the CPU reference, at CPU speed)";
  os << "\n";
  if (r.requested != "auto" && r.requested != "all")
    os << r.requested << ": " << (r.can_run ? "can run" : "cannot run") << "\n";
  if (r.show_declarations) {
    os << "\ndeclarations:\n";
    for (const BackendCaps& b : moe_backends()) os << "  " << declaration_text(b);
  }
  return os.str();
}

nlohmann::json backend_caps_to_json(const BackendCaps& b) {
  nlohmann::json j;
  j["name"] = b.name;
  j["summary"] = b.summary;
  j["origin"] = b.origin;
  j["built_in_this_version"] = b.built;
  j["weight_formats"] = nlohmann::json::array();
  for (WeightFormat f : b.weight_formats) j["weight_formats"].push_back(weight_format_name(f));
  j["activation_formats"] = nlohmann::json::array();
  for (ActFormat f : b.act_formats) j["activation_formats"].push_back(act_format_name(f));
  j["needs_input_scale"] = b.needs_input_scale;
  j["runs_on_cpu"] = b.runs_on_cpu;
  j["sms"] = b.sms;
  j["sm_note"] = b.sm_note;
  j["requires_tcgen05"] = b.requires_tcgen05;
  j["shared_memory"] = nlohmann::json::array();
  for (const SmemNeed& s : b.smem)
    j["shared_memory"].push_back({{"bytes_per_block", s.bytes},
                                  {"from_moe_intermediate", s.from_moe_intermediate},
                                  {"from_experts", s.from_experts},
                                  {"source", s.source}});
  j["shared_memory_unknown"] = b.smem_unknown;
  j["layouts"] = nlohmann::json::array();
  for (TokenLayout l : b.layouts) j["layouts"].push_back(token_layout_name(l));
  j["hidden_align"] = b.hidden_align;
  j["inter_align"] = b.inter_align;
  j["max_tokens_per_launch"] = b.max_tokens_per_launch;
  j["multi_gpu"] = b.multi_gpu;
  j["supports_ep"] = b.supports_ep;
  j["activations"] = b.activations;
  j["priority"] = b.priority;
  j["sources"] = b.sources;
  return j;
}

nlohmann::json check_report_json(const CheckResult& r, int exit_code) {
  const MoeWorkload& w = r.workload;
  nlohmann::json j;
  j["model"] = {{"label", w.model_label},
                {"arch", w.arch},
                {"expert_format", quant_algo_label(w.expert_algo)},
                {"has_input_scale", w.has_input_scale},
                {"hidden", w.hidden},
                {"moe_intermediate", w.moe_intermediate},
                {"experts", w.experts},
                {"top_k", w.top_k},
                {"activation", w.activation}};
  j["gpu"] = r.target.gpu ? gpu_spec_to_json(*r.target.gpu) : nlohmann::json(nullptr);
  j["host_memory_bytes"] = r.target.host_memory_bytes;
  j["parallel"] = {{"tp", w.plan.tp},
                   {"ep", w.plan.ep},
                   {"gpus", w.plan.world()},
                   {"moe_intermediate_per_gpu", w.moe_intermediate_per_gpu},
                   {"per_gpu", r.split_detail},
                   {"problems", w.model_problems}};
  nlohmann::json mem = {{"kv_tokens", kMinimalKvTokens},
                        {"usable_fraction", kUsableMemoryFraction},
                        {"weights_bytes_per_gpu", w.memory_per_gpu.weights_bytes},
                        {"kv_bytes_per_gpu", w.memory_per_gpu.kv_bytes},
                        {"total_bytes_per_gpu", w.memory_per_gpu.total()},
                        {"weights_bytes_one_process", w.memory_one_process.weights_bytes}};
  mem["known"] = w.memory_known;
  if (r.target.gpu && w.memory_known) {
    const MemoryFit fit{w.memory_per_gpu, r.target.gpu->memory_bytes};
    mem["gpu_capacity_bytes"] = fit.capacity_bytes;
    mem["gpu_usable_bytes"] = fit.usable_bytes();
    mem["fits_gpu"] = fit.fits();
  }
  j["memory"] = mem;
  j["runtime"] = {{"runs_model", r.runtime_reasons.empty()}, {"reasons", r.runtime_reasons}};
  j["shared_reasons"] = r.shared;
  j["backends"] = nlohmann::json::array();
  for (const Verdict& v : r.verdicts) {
    const BackendCaps* caps = find_backend(v.backend);
    nlohmann::json b = {{"name", v.backend}, {"ok", v.ok}, {"reasons", v.reasons},
                        {"unchecked", v.unchecked}};
    if (caps) b["declaration"] = backend_caps_to_json(*caps);
    j["backends"].push_back(b);
  }
  j["auto"] = r.auto_pick ? nlohmann::json(*r.auto_pick) : nlohmann::json(nullptr);
  j["requested"] = r.requested;
  j["can_run"] = r.can_run;
  j["exit_code"] = exit_code;
  return j;
}

}  // namespace tetra::cli
