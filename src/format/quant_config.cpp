#include "format/quant_config.h"

#include <fstream>
#include <set>

#include "core/error.h"
#include "format/wildcard.h"

namespace tetra {
namespace {

using nlohmann::json;

const json* find_non_null(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

std::string get_string(const json& j, const char* key, const std::string& label) {
  const json* v = find_non_null(j, key);
  if (!v) return "";
  if (!v->is_string()) TETRA_FAIL(label, ": '", key, "' must be a string, got ", v->dump());
  return v->get<std::string>();
}

// One algorithm name as ModelOpt writes it. MIXED_PRECISION is handled by the callers.
QuantAlgo parse_algo(const std::string& name, const std::string& label) {
  if (name == "NVFP4") return QuantAlgo::NVFP4;
  if (name == "W4A16_NVFP4") return QuantAlgo::W4A16_NVFP4;
  if (name.rfind("FP8", 0) == 0) return QuantAlgo::FP8;  // FP8, FP8_PB_WO, FP8_PER_CHANNEL_...
  TETRA_FAIL(label, ": quant_algo '", name,
             "' is not supported (Tetra reads NVFP4 and W4A16_NVFP4 checkpoints)");
}

std::vector<std::string> get_patterns(const json& j, const char* key, const std::string& label) {
  std::vector<std::string> out;
  const json* v = find_non_null(j, key);
  if (!v) return out;
  if (!v->is_array()) TETRA_FAIL(label, ": '", key, "' must be a list of module patterns");
  for (const auto& e : *v) {
    if (!e.is_string()) TETRA_FAIL(label, ": '", key, "' has a non-string entry ", e.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::map<std::string, QuantAlgo> get_quantized_layers(const json& j, const std::string& label) {
  std::map<std::string, QuantAlgo> out;
  const json* v = find_non_null(j, "quantized_layers");
  if (!v) return out;
  if (!v->is_object()) TETRA_FAIL(label, ": 'quantized_layers' must be an object");
  for (const auto& [name, entry] : v->items()) {
    const std::string entry_label = label + " quantized_layers['" + name + "']";
    const std::string algo = get_string(entry, "quant_algo", entry_label);
    if (algo.empty()) TETRA_FAIL(entry_label, ": missing 'quant_algo'");
    out[name] = parse_algo(algo, entry_label);
    if (const json* gs = find_non_null(entry, "group_size");
        gs && (!gs->is_number_integer() || gs->get<int>() != 16) && out[name] != QuantAlgo::FP8)
      TETRA_FAIL(entry_label, ": group_size ", gs->dump(), " is not NVFP4's 16");
  }
  return out;
}

// Sets algo/mixed/quantized_layers from a quant_algo value (string or missing).
void set_algo(QuantConfig& q, const json& block, const std::string& algo_name,
              const std::string& label) {
  if (algo_name == "MIXED_PRECISION") {
    q.mixed = true;
    q.algo = QuantAlgo::None;
    q.quantized_layers = get_quantized_layers(block, label);
  } else if (!algo_name.empty()) {
    q.algo = parse_algo(algo_name, label);
  }
}

void read_producer(QuantConfig& q, const json& block, const std::string& label) {
  const json* p = find_non_null(block, "producer");
  if (!p) return;
  if (p->is_string()) {
    q.producer = p->get<std::string>();
  } else if (p->is_object()) {
    q.producer = get_string(*p, "name", label + " producer");
    if (const json* v = find_non_null(*p, "version"))
      q.producer_version = v->is_string() ? v->get<std::string>() : v->dump();
  }
}

void check_group_size(const QuantConfig& q, const std::string& label) {
  const bool fp4 = q.algo == QuantAlgo::NVFP4 || q.algo == QuantAlgo::W4A16_NVFP4 || q.mixed;
  if (fp4 && q.group_size != 16)
    TETRA_FAIL(label, ": group_size ", q.group_size, " is not NVFP4's block of 16");
}

QuantConfig from_hf_quant_config(const json& j, const std::string& label) {
  if (!j.is_object()) TETRA_FAIL(label, ": must be a JSON object");
  const json* block = find_non_null(j, "quantization");
  if (!block || !block->is_object())
    TETRA_FAIL(label, ": missing the 'quantization' object (is this a ModelOpt export?)");
  QuantConfig q;
  read_producer(q, j, label);
  set_algo(q, *block, get_string(*block, "quant_algo", label), label);
  q.kv_cache_quant_algo = get_string(*block, "kv_cache_quant_algo", label);
  if (const json* gs = find_non_null(*block, "group_size")) {
    if (!gs->is_number_integer()) TETRA_FAIL(label, ": 'group_size' must be an integer");
    q.group_size = gs->get<int>();
  }
  q.exclude = get_patterns(*block, "exclude_modules", label);
  check_group_size(q, label);
  return q;
}

// kv_cache_scheme is a string in older exports and {"num_bits": 8, "type": "float"} in newer.
std::string kv_scheme_name(const json& scheme, const std::string& label) {
  if (scheme.is_string()) return scheme.get<std::string>();
  if (!scheme.is_object()) TETRA_FAIL(label, ": 'kv_cache_scheme' must be a string or object");
  const json* bits = find_non_null(scheme, "num_bits");
  const std::string type = get_string(scheme, "type", label + " kv_cache_scheme");
  if (bits && bits->is_number_integer() && type == "float") {
    if (bits->get<int>() == 8) return "FP8";
    if (bits->get<int>() == 4) return "NVFP4";
  }
  TETRA_FAIL(label, ": kv_cache_scheme ", scheme.dump(), " is not one Tetra knows");
}

// The algorithm of a ModelOpt config.json block that has no quant_algo, from its first
// config group: 4-bit float weights with 4-bit activations = NVFP4, without = W4A16_NVFP4.
std::string infer_algo_from_groups(const json& qc, const std::string& label) {
  const json* groups = find_non_null(qc, "config_groups");
  if (!groups || !groups->is_object() || groups->empty())
    TETRA_FAIL(label, ": neither 'quant_algo' nor 'config_groups' says how it is quantized");
  const json& g = groups->begin().value();
  const json* w = find_non_null(g, "weights");
  const json* a = find_non_null(g, "input_activations");
  auto is_fp4 = [](const json* x) {
    const json* bits = x ? find_non_null(*x, "num_bits") : nullptr;
    const json* type = x ? find_non_null(*x, "type") : nullptr;
    return bits && bits->is_number_integer() && bits->get<int>() == 4 && type &&
           type->is_string() && type->get<std::string>() == "float";
  };
  if (is_fp4(w)) return is_fp4(a) ? "NVFP4" : "W4A16_NVFP4";
  TETRA_FAIL(label, ": config_groups ", g.dump(), " is not an NVFP4 scheme");
}

int group_size_from_groups(const json& qc) {
  const json* groups = find_non_null(qc, "config_groups");
  if (!groups || !groups->is_object() || groups->empty()) return 16;
  const json* w = find_non_null(groups->begin().value(), "weights");
  const json* gs = w ? find_non_null(*w, "group_size") : nullptr;
  return gs && gs->is_number_integer() ? gs->get<int>() : 16;
}

QuantConfig from_config_json(const json& qc, const std::string& label) {
  if (!qc.is_object()) TETRA_FAIL(label, ": 'quantization_config' must be an object");
  QuantConfig q;
  std::string method = get_string(qc, "quant_method", label);
  if (method.empty()) method = get_string(qc, "quant_library", label);
  if (method == "fp8") {  // DeepSeek-V3/R1 native block-FP8 release
    q.algo = QuantAlgo::FP8;
    q.exclude = get_patterns(qc, "modules_to_not_convert", label);
    return q;
  }
  if (method != "modelopt")
    TETRA_FAIL(label, ": quantization method '", method.empty() ? "(none)" : method,
               "' is not supported (Tetra reads ModelOpt NVFP4 / W4A16_NVFP4 checkpoints)");
  read_producer(q, qc, label);
  std::string algo = get_string(qc, "quant_algo", label);
  if (algo.empty()) algo = infer_algo_from_groups(qc, label);
  set_algo(q, qc, algo, label);
  if (const json* gs = find_non_null(qc, "group_size"); gs && gs->is_number_integer())
    q.group_size = gs->get<int>();
  else
    q.group_size = group_size_from_groups(qc);
  if (const json* kv = find_non_null(qc, "kv_cache_scheme")) q.kv_cache_quant_algo = kv_scheme_name(*kv, label);
  else q.kv_cache_quant_algo = get_string(qc, "kv_cache_quant_algo", label);
  q.exclude = get_patterns(qc, find_non_null(qc, "ignore") ? "ignore" : "exclude_modules", label);
  check_group_size(q, label);
  return q;
}

std::string describe(const QuantConfig& q) {
  return q.mixed ? "MIXED_PRECISION" : std::string(quant_algo_name(q.algo));
}

json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) TETRA_FAIL("cannot open ", path.string());
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    TETRA_FAIL(path.string(), " is not valid JSON: ", e.what());
  }
}

json group_for(QuantAlgo algo, int group_size) {
  json fp4 = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", group_size}};
  json fp8 = {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}};
  switch (algo) {
    case QuantAlgo::NVFP4: return {{"input_activations", fp4}, {"weights", fp4}};
    case QuantAlgo::W4A16_NVFP4: return {{"weights", fp4}};
    case QuantAlgo::FP8: return {{"input_activations", fp8}, {"weights", fp8}};
    case QuantAlgo::None: break;
  }
  return json::object();
}

json layer_entry(QuantAlgo algo, int group_size) {
  json e = {{"quant_algo", std::string(quant_algo_name(algo))}};
  if (algo != QuantAlgo::FP8) e["group_size"] = group_size;
  return e;
}

}  // namespace

std::string_view quant_algo_name(QuantAlgo a) {
  switch (a) {
    case QuantAlgo::None: return "NONE";
    case QuantAlgo::NVFP4: return "NVFP4";
    case QuantAlgo::W4A16_NVFP4: return "W4A16_NVFP4";
    case QuantAlgo::FP8: return "FP8";
  }
  return "?";
}

QuantAlgo QuantConfig::algo_for(std::string_view module) const {
  for (const auto& pattern : exclude)
    if (wildcard_match_module(pattern, module)) return QuantAlgo::None;
  if (!mixed) return algo;
  if (auto it = quantized_layers.find(std::string(module)); it != quantized_layers.end())
    return it->second;
  // A pattern, or a parent module listed whole ("model.layers.3.mlp.experts").
  for (const auto& [pattern, a] : quantized_layers)
    if (wildcard_match_module(pattern, module)) return a;
  return QuantAlgo::None;
}

bool QuantConfig::quantized() const {
  if (!mixed) return algo != QuantAlgo::None;
  for (const auto& [name, a] : quantized_layers)
    if (a != QuantAlgo::None) return true;
  return false;
}

QuantConfig parse_quant_config(const json& hf, const json& config_json, std::string_view hf_label,
                               std::string_view config_label) {
  const std::string hf_l(hf_label);
  const std::string cfg_l = std::string(config_label) + " quantization_config";
  const json* qc = config_json.is_object() ? find_non_null(config_json, "quantization_config")
                                           : nullptr;
  if (hf.is_null() && !qc) return QuantConfig{};
  if (hf.is_null()) return from_config_json(*qc, cfg_l);
  QuantConfig q = from_hf_quant_config(hf, hf_l);
  if (qc) {
    const QuantConfig other = from_config_json(*qc, cfg_l);
    if (other.algo != q.algo || other.mixed != q.mixed)
      TETRA_FAIL(hf_l, " says ", describe(q), " but ", cfg_l, " says ", describe(other));
  }
  return q;
}

QuantConfig load_quant_config(const std::filesystem::path& dir) {
  const auto hf_path = dir / "hf_quant_config.json";
  const auto cfg_path = dir / "config.json";
  const json hf = std::filesystem::exists(hf_path) ? read_json_file(hf_path) : json(nullptr);
  const json cfg = std::filesystem::exists(cfg_path) ? read_json_file(cfg_path) : json(nullptr);
  return parse_quant_config(hf, cfg, hf_path.string(), cfg_path.string());
}

json quant_config_to_hf_json(const QuantConfig& q) {
  json block;
  block["quant_algo"] = q.mixed ? json("MIXED_PRECISION")
                        : q.algo == QuantAlgo::None ? json(nullptr)
                                                    : json(std::string(quant_algo_name(q.algo)));
  block["kv_cache_quant_algo"] = q.kv_cache_quant_algo.empty() ? json(nullptr)
                                                               : json(q.kv_cache_quant_algo);
  block["group_size"] = q.group_size;
  block["exclude_modules"] = q.exclude;
  if (q.mixed) {
    json layers = json::object();
    for (const auto& [name, a] : q.quantized_layers) layers[name] = layer_entry(a, q.group_size);
    block["quantized_layers"] = layers;
  }
  json j;
  if (!q.producer.empty()) {
    j["producer"] = {{"name", q.producer}};
    if (!q.producer_version.empty()) j["producer"]["version"] = q.producer_version;
  }
  j["quantization"] = block;
  return j;
}

json quant_config_to_config_json(const QuantConfig& q) {
  if (!q.mixed && q.algo == QuantAlgo::None) return nullptr;  // not quantized: no block at all
  json j;
  json groups = json::object();
  if (q.mixed) {
    // One config group per distinct algorithm, listing its layers (ModelOpt's layout).
    std::map<QuantAlgo, json> targets;
    for (const auto& [name, a] : q.quantized_layers) targets[a].push_back(name);
    int idx = 0;
    for (auto& [a, names] : targets) {
      json g = group_for(a, q.group_size);
      g["targets"] = names;
      groups["group_" + std::to_string(idx++)] = g;
    }
    json layers = json::object();
    for (const auto& [name, a] : q.quantized_layers) layers[name] = layer_entry(a, q.group_size);
    j["quantized_layers"] = layers;
  } else {
    json g = group_for(q.algo, q.group_size);
    g["targets"] = json::array({"Linear"});
    groups["group_0"] = g;
  }
  j["config_groups"] = groups;
  j["ignore"] = q.exclude;
  j["quant_algo"] = describe(q);
  if (q.kv_cache_quant_algo == "FP8")
    j["kv_cache_scheme"] = {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}};
  else if (!q.kv_cache_quant_algo.empty())
    j["kv_cache_scheme"] = q.kv_cache_quant_algo;
  if (!q.producer.empty()) {
    j["producer"] = {{"name", q.producer}};
    if (!q.producer_version.empty()) j["producer"]["version"] = q.producer_version;
  }
  j["quant_method"] = "modelopt";
  return j;
}

}  // namespace tetra
