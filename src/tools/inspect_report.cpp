#include "tools/inspect_report.h"

#include <map>
#include <sstream>

#include "core/error.h"
#include "format/model_size.h"
#include "model/cuda/cuda_model_ops.h"
#include "model/model_weights.h"

namespace tetra {
namespace {

const char* attention_name(AttentionKind k) { return k == AttentionKind::MLA ? "MLA" : "GQA"; }

std::string human_bytes(double b) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  if (b >= 1e9) os << b / 1e9 << " GB";
  else if (b >= 1e6) os << b / 1e6 << " MB";
  else os << b / 1e3 << " kB";
  return os.str();
}

std::string human_count(double n) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  if (n >= 1e9) os << n / 1e9 << " B";
  else if (n >= 1e6) os << n / 1e6 << " M";
  else os << n / 1e3 << " k";
  return os.str();
}

}  // namespace

nlohmann::json inspect_report(const Checkpoint& ck) {
  const ModelConfig& c = ck.config();
  const QuantConfig& q = ck.quant();
  nlohmann::json r;
  r["directory"] = ck.dir().string();
  r["architecture"] = std::string(arch_hf_name(c.arch));
  r["model_type"] = c.model_type;
  int64_t moe_layers = 0;
  for (bool m : c.layer_is_moe) moe_layers += m;
  r["layers"] = {{"total", c.num_layers}, {"dense", c.num_layers - moe_layers}, {"moe", moe_layers},
                 {"mtp", c.num_nextn_predict_layers}};
  r["hidden_size"] = c.hidden_size;
  r["vocab_size"] = c.vocab_size;
  r["attention"] = {{"kind", attention_name(c.attention)}, {"heads", c.num_attention_heads},
                    {"kv_heads", c.num_key_value_heads}, {"head_dim", c.head_dim}};
  r["experts"] = {{"routed", c.n_routed_experts}, {"shared", c.n_shared_experts},
                  {"top_k", c.num_experts_per_tok}, {"moe_intermediate", c.moe_intermediate_size}};
  r["quantization"] = {{"algo", std::string(quant_algo_name(q.algo))}, {"mixed", q.mixed},
                       {"group_size", q.group_size}, {"exclude", q.exclude},
                       {"kv_cache", q.kv_cache_quant_algo}};

  // What the files actually hold, per module kind: FP4 linears vs high-precision ones.
  std::map<std::string, std::pair<int64_t, int64_t>> by_kind;  // kind -> (fp4, high precision)
  for (const LinearSpec& lin : ck.layout().linears) {
    const std::string w = lin.module + ".weight";
    if (!ck.tensors().contains(w)) continue;
    auto& slot = by_kind[std::string(module_kind_name(lin.kind))];
    (ck.tensors().view(w).dtype == DType::U8 ? slot.first : slot.second)++;
  }
  nlohmann::json modules = nlohmann::json::object();
  for (const auto& [kind, counts] : by_kind)
    modules[kind] = {{"fp4", counts.first}, {"high_precision", counts.second}};
  r["linear_modules"] = modules;

  // Totals from the files: a packed U8 weight holds two parameters per byte.
  int64_t file_params = 0;
  double file_bytes = 0;
  for (const std::string& name : ck.tensors().names()) {
    const TensorView v = ck.tensors().view(name);
    file_bytes += double(v.nbytes);
    const bool scale = name.size() > 6 && (name.find(".weight_scale") != std::string::npos ||
                                           name.find(".input_scale") != std::string::npos);
    if (scale) continue;
    file_params += v.dtype == DType::U8 ? 2 * v.numel() : v.numel();
  }
  r["files"] = {{"count", ck.tensors().num_files()}, {"tensors", ck.tensors().names().size()},
                {"params", file_params}, {"bytes", file_bytes}};

  const ModelSize size = model_size(c, q);
  nlohmann::json total = nlohmann::json::object(), active = nlohmann::json::object();
  for (const auto& [kind, s] : size.total)
    total[std::string(module_kind_name(kind))] = {{"params", s.params}, {"bytes", s.bytes}};
  for (const auto& [kind, s] : size.active)
    active[std::string(module_kind_name(kind))] = {{"params", s.params}, {"bytes", s.bytes}};
  r["total"] = {{"params", size.total_all.params}, {"bytes", size.total_all.bytes}, {"by_kind", total}};
  r["active_per_token"] = {{"params", size.active_all.params}, {"bytes", size.active_all.bytes},
                           {"by_kind", active},
                           {"note", "batch 1: all non-expert weights, top_k routed experts per MoE "
                                    "layer, full lm_head; KV cache read not included"}};
  // Whether generate/serve run this model, on any backend and on the CUDA one (the reasons the
  // runtime refuses with; `tetra check` prints the same).
  const std::vector<std::string> why = model::runtime_unsupported_reasons(c);
  r["runtime"] = {{"reasons", why},
                  {"cuda_reasons", why.empty() ? model::cuda::cuda_model_unsupported_reasons(c)
                                               : std::vector<std::string>{}}};
  r["problems"] = ck.problems();
  return r;
}

std::string format_inspect_report(const nlohmann::json& r) {
  std::ostringstream os;
  os << r["architecture"].get<std::string>() << " (" << r["model_type"].get<std::string>() << ") in "
     << r["directory"].get<std::string>() << "\n";
  const auto& l = r["layers"];
  os << "  layers        " << l["total"] << " (" << l["dense"] << " dense, " << l["moe"] << " MoE";
  if (l["mtp"].get<int64_t>() > 0) os << ", +" << l["mtp"] << " MTP not counted";
  os << ")\n";
  os << "  hidden        " << r["hidden_size"] << ", vocab " << r["vocab_size"] << "\n";
  const auto& a = r["attention"];
  os << "  attention     " << a["kind"].get<std::string>() << ", " << a["heads"] << " heads, "
     << a["kv_heads"] << " kv heads, head_dim " << a["head_dim"] << "\n";
  const auto& rt = r["runtime"];
  os << "  runtime       ";
  if (!rt["reasons"].empty()) {
    os << "generate/serve cannot run it: " << rt["reasons"][0].get<std::string>();
    for (size_t i = 1; i < rt["reasons"].size(); ++i) os << "; " << rt["reasons"][i].get<std::string>();
  } else if (!rt["cuda_reasons"].empty()) {
    os << "generate/serve run it on cpu, not on cuda: " << rt["cuda_reasons"][0].get<std::string>();
    for (size_t i = 1; i < rt["cuda_reasons"].size(); ++i)
      os << "; " << rt["cuda_reasons"][i].get<std::string>();
  } else {
    os << "generate/serve support it (cpu; cuda where its MoE backend runs, see tetra check)";
  }
  os << "\n";
  const auto& e = r["experts"];
  os << "  experts       " << e["routed"] << " routed (top-" << e["top_k"] << ", width "
     << e["moe_intermediate"] << ") + " << e["shared"] << " shared\n";
  const auto& q = r["quantization"];
  os << "  quantization  " << q["algo"].get<std::string>();
  if (q["mixed"].get<bool>()) os << " (MIXED_PRECISION)";
  if (!q["exclude"].empty()) os << ", exclude " << q["exclude"].dump();
  os << "\n  linear modules (fp4 / high precision):\n";
  for (const auto& [kind, c] : r["linear_modules"].items())
    os << "    " << kind << std::string(16 - std::min<size_t>(15, kind.size()), ' ') << c["fp4"]
       << " / " << c["high_precision"] << "\n";
  const auto& f = r["files"];
  os << "  files         " << f["count"] << " shard(s), " << f["tensors"] << " tensors, "
     << human_count(f["params"].get<double>()) << " params, " << human_bytes(f["bytes"].get<double>())
     << "\n";
  os << "  total         " << human_count(r["total"]["params"].get<double>()) << " params, "
     << human_bytes(r["total"]["bytes"].get<double>()) << "\n";
  os << "  active/token  " << human_count(r["active_per_token"]["params"].get<double>())
     << " params, " << human_bytes(r["active_per_token"]["bytes"].get<double>())
     << "  (the decode floor's numerator at batch 1, before the KV read)\n";
  for (const auto& [kind, s] : r["active_per_token"]["by_kind"].items())
    os << "    " << kind << std::string(16 - std::min<size_t>(15, kind.size()), ' ')
       << human_bytes(s["bytes"].get<double>()) << "\n";
  if (!r["problems"].empty()) {
    os << "  PROBLEMS:\n";
    for (const auto& p : r["problems"]) os << "    " << p.get<std::string>() << "\n";
  }
  return os.str();
}

}  // namespace tetra
