#include "moe/backend_select.h"

#include "core/error.h"

namespace tetra {
namespace {

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : std::string(sep)) + p;
  return out;
}

std::string target_label(const Target& t) {
  return t.gpu ? str(t.gpu->name, " (", sm_label(t.gpu->sm()), ")") : std::string("no GPU");
}

}  // namespace

std::vector<Verdict> evaluate_all(const MoeWorkload& w, const Target& t) {
  std::vector<Verdict> out;
  for (const BackendCaps& b : moe_backends()) out.push_back(evaluate(b, w, t));
  return out;
}

std::optional<std::string> auto_backend(const MoeWorkload& w, const Target& t) {
  const BackendCaps* best = nullptr;
  for (const BackendCaps& b : moe_backends()) {
    if (!b.built || !evaluate(b, w, t).ok) continue;
    if (!best || b.priority > best->priority) best = &b;
  }
  if (!best) return std::nullopt;
  return best->name;
}

std::vector<std::string> shared_gpu_reasons(const MoeWorkload& w, const Target& t) {
  std::vector<std::string> out = w.model_problems;
  if (auto mem = gpu_memory_reason(w, t)) out.push_back(*mem);
  return out;
}

const BackendCaps& require_compatible(std::string_view name, const MoeWorkload& w,
                                      const Target& t) {
  if (name == "auto") {
    if (auto chosen = auto_backend(w, t)) return *find_backend(*chosen);
    std::string why;
    for (const Verdict& v : evaluate_all(w, t))
      why += str("\n  ", v.backend, ": ", join(v.reasons, "; "));
    TETRA_FAIL("no MoE backend can run ", w.model_label, " on ", target_label(t), ":", why);
  }
  const BackendCaps* caps = find_backend(name);
  if (!caps)
    TETRA_FAIL("unknown MoE backend '", name, "'; known: auto, ", join(backend_names(), ", "));
  const Verdict v = evaluate(*caps, w, t);
  if (!v.ok)
    TETRA_FAIL("MoE backend ", caps->name, " cannot run ", w.model_label, " on ", target_label(t),
               ": ", join(v.reasons, "; "));
  return *caps;
}

}  // namespace tetra
