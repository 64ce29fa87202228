#include "format/model_config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <set>

#include "core/error.h"

namespace tetra {
namespace {

struct ArchNames {
  Arch arch;
  std::string_view hf_name;
  std::string_view model_type;
};
constexpr std::array<ArchNames, 4> kArchs = {{
    {Arch::GlmMoeDsa, "GlmMoeDsaForCausalLM", "glm_moe_dsa"},
    {Arch::Glm4Moe, "Glm4MoeForCausalLM", "glm4_moe"},
    {Arch::DeepseekV3, "DeepseekV3ForCausalLM", "deepseek_v3"},
    {Arch::Qwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"},
}};

std::string supported_list() {
  std::string s;
  for (const auto& a : kArchs) {
    if (!s.empty()) s += ", ";
    s += std::string(a.hf_name) + " (" + std::string(a.model_type) + ")";
  }
  return s;
}

constexpr int64_t kMaxConfigInt = int64_t(1) << 40;

// Typed access to one JSON object with errors that name the file and the key. A key whose
// value is null counts as absent (HF writes `"q_lora_rank": null`, `"rope_scaling": null`).
class Reader {
 public:
  Reader(const nlohmann::json& j, std::string label, std::string arch)
      : j_(j), label_(std::move(label)), arch_(std::move(arch)) {}

  bool has(const char* key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  bool present(const char* key) const { return j_.contains(key); }  // even when null
  const nlohmann::json& at(const char* key) const { return j_.at(key); }

  [[noreturn]] void fail(const char* key, const std::string& what) const {
    TETRA_FAIL(label_, ": key '", key, "' ", what);
  }
  void require(const char* key) const {
    if (!has(key)) TETRA_FAIL(label_, ": missing key '", key, "' (needed for ", arch_, ")");
  }

  int64_t req_int(const char* key) const {
    require(key);
    return to_int(key);
  }
  int64_t opt_int(const char* key, int64_t def) const { return has(key) ? to_int(key) : def; }
  double req_num(const char* key) const {
    require(key);
    return to_num(key);
  }
  double opt_num(const char* key, double def) const { return has(key) ? to_num(key) : def; }
  bool req_bool(const char* key) const {
    require(key);
    return to_bool(key);
  }
  bool opt_bool(const char* key, bool def) const { return has(key) ? to_bool(key) : def; }
  std::string opt_str(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    const auto& v = j_.at(key);
    if (!v.is_string()) fail(key, "must be a string, got " + v.dump());
    return v.get<std::string>();
  }
  std::vector<std::string> opt_str_list(const char* key) const {
    std::vector<std::string> out;
    if (!has(key)) return out;
    const auto& v = j_.at(key);
    if (!v.is_array()) fail(key, "must be a list of strings, got " + v.dump());
    for (const auto& e : v) {
      if (!e.is_string()) fail(key, "must be a list of strings, has " + e.dump());
      out.push_back(e.get<std::string>());
    }
    return out;
  }
  std::vector<int64_t> opt_int_list(const char* key) const {
    std::vector<int64_t> out;
    if (!has(key)) return out;
    const auto& v = j_.at(key);
    if (!v.is_array()) fail(key, "must be a list of integers, got " + v.dump());
    for (const auto& e : v) {
      if (!e.is_number_integer()) fail(key, "must be a list of integers, has " + e.dump());
      out.push_back(e.get<int64_t>());
    }
    return out;
  }

 private:
  int64_t to_int(const char* key) const {
    const auto& v = j_.at(key);
    // Every integer of a config is a size, a count or an index: beyond 2^40 it is not a model,
    // and a bound here keeps the sums and products below from overflowing before validate()
    // checks each key against its own limit.
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(kMaxConfigInt))
      fail(key, "is out of range: " + v.dump());
    if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      if (i > kMaxConfigInt || i < -kMaxConfigInt) fail(key, "is out of range: " + v.dump());
      return i;
    }
    // Some writers emit 2048.0; accept exact integers only.
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) <= double(kMaxConfigInt))
        return static_cast<int64_t>(d);
    }
    fail(key, "must be an integer, got " + v.dump());
  }
  double to_num(const char* key) const {
    const auto& v = j_.at(key);
    if (!v.is_number()) fail(key, "must be a number, got " + v.dump());
    return v.get<double>();
  }
  bool to_bool(const char* key) const {
    const auto& v = j_.at(key);
    if (!v.is_boolean()) fail(key, "must be true or false, got " + v.dump());
    return v.get<bool>();
  }

  const nlohmann::json& j_;
  std::string label_;
  std::string arch_;
};

Arch detect_arch(const nlohmann::json& j, std::string_view src) {
  std::optional<Arch> from_class, from_type;
  std::string class_name, type_name;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty() &&
                                          (*it)[0].is_string()) {
    class_name = (*it)[0].get<std::string>();
    from_class = arch_from_name(class_name);
  }
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) {
    type_name = it->get<std::string>();
    from_type = arch_from_name(type_name);
  }
  if (class_name.empty() && type_name.empty())
    TETRA_FAIL(src, ": neither 'architectures' nor 'model_type' is set; Tetra supports ",
               supported_list());
  if (from_class && from_type && *from_class != *from_type)
    TETRA_FAIL(src, ": 'architectures' says ", class_name, " but 'model_type' says ", type_name);
  if (from_class) return *from_class;
  if (from_type) return *from_type;
  TETRA_FAIL(src, ": unsupported architecture ",
             class_name.empty() ? "" : "'" + class_name + "' ",
             type_name.empty() ? "" : "(model_type '" + type_name + "')",
             "; Tetra supports ", supported_list());
}

// Dense/MoE pattern from whichever dialect the config uses.
std::vector<bool> parse_layer_pattern(const Reader& r, Arch arch, int64_t num_layers) {
  std::vector<bool> moe(static_cast<size_t>(num_layers), false);
  if (r.has("mlp_layer_types")) {
    const auto types = r.opt_str_list("mlp_layer_types");
    if (static_cast<int64_t>(types.size()) != num_layers)
      r.fail("mlp_layer_types", str("has ", types.size(), " entries, num_hidden_layers is ",
                                    num_layers));
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] == "sparse") moe[i] = true;
      else if (types[i] != "dense")
        r.fail("mlp_layer_types", "entry " + std::to_string(i) + " is '" + types[i] +
                                      "' (expected \"dense\" or \"sparse\")");
    }
    return moe;
  }
  if (arch == Arch::Qwen3Moe) {
    // transformers Qwen3Moe: sparse iff not in mlp_only_layers and (i + 1) % step == 0.
    const int64_t step = r.opt_int("decoder_sparse_step", 1);
    if (step < 1) r.fail("decoder_sparse_step", "must be >= 1");
    const auto only = r.opt_int_list("mlp_only_layers");
    const std::set<int64_t> dense_only(only.begin(), only.end());
    for (int64_t i = 0; i < num_layers; ++i)
      moe[static_cast<size_t>(i)] = !dense_only.count(i) && (i + 1) % step == 0;
    return moe;
  }
  // DeepSeek / GLM: the first k layers are dense, then every moe_layer_freq-th is MoE.
  const int64_t first_k = r.req_int("first_k_dense_replace");
  const int64_t freq = r.opt_int("moe_layer_freq", 1);
  if (first_k < 0) r.fail("first_k_dense_replace", "must be >= 0");
  if (freq < 1) r.fail("moe_layer_freq", "must be >= 1");
  for (int64_t i = 0; i < num_layers; ++i)
    moe[static_cast<size_t>(i)] = i >= first_k && i % freq == 0;
  return moe;
}

// GLM-5 indexer schedule: explicit list, a "FSSF..." pattern, or the freq/offset rule of
// transformers' GlmMoeDsaConfig. Empty = every layer runs its own indexer.
std::vector<std::string> parse_indexer_types(const Reader& r, int64_t num_layers) {
  if (r.has("indexer_types")) return r.opt_str_list("indexer_types");
  if (r.has("index_topk_pattern")) {
    const auto& p = r.at("index_topk_pattern");
    if (p.is_array()) return r.opt_str_list("index_topk_pattern");
    if (!p.is_string()) r.fail("index_topk_pattern", "must be a string of F/S or a list");
    std::vector<std::string> out;
    for (char c : p.get<std::string>()) {
      if (c == 'F') out.push_back("full");
      else if (c == 'S') out.push_back("shared");
      else r.fail("index_topk_pattern", std::string("has '") + c + "' (expected F or S)");
    }
    return out;
  }
  if (r.has("index_topk_freq")) {
    const int64_t freq = std::max<int64_t>(r.opt_int("index_topk_freq", 1), 1);
    const int64_t offset = r.opt_int("index_skip_topk_offset", 2);
    std::vector<std::string> out;
    for (int64_t i = 0; i < num_layers; ++i)
      out.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
    return out;
  }
  return {};
}

RopeConfig parse_rope(const Reader& top, const nlohmann::json& j, Arch arch,
                      const std::string& src, const std::string& arch_name) {
  RopeConfig rope;
  // New dialect: everything inside rope_parameters. Old: rope_theta + rope_scaling.
  const nlohmann::json empty = nlohmann::json::object();
  const bool has_params = top.has("rope_parameters");
  if (has_params && !j.at("rope_parameters").is_object())
    top.fail("rope_parameters", "must be an object");
  const Reader params(has_params ? j.at("rope_parameters") : empty, src + " rope_parameters",
                      arch_name);
  if (params.has("rope_theta")) rope.theta = params.req_num("rope_theta");
  else if (top.has("rope_theta")) rope.theta = top.req_num("rope_theta");
  else TETRA_FAIL(src, ": missing key 'rope_theta' (top level or in rope_parameters; needed for ",
                  arch_name, ")");

  const bool has_scaling = top.has("rope_scaling");
  if (has_scaling && !j.at("rope_scaling").is_object())
    top.fail("rope_scaling", "must be an object or null");
  const Reader scaling = has_scaling ? Reader(j.at("rope_scaling"), src + " rope_scaling", arch_name)
                                     : params;
  std::string type = scaling.opt_str("rope_type", scaling.opt_str("type", "default"));
  if (type == "default") {
    rope.type = "default";
  } else if (type == "yarn") {
    rope.type = "yarn";
    rope.factor = scaling.req_num("factor");
    rope.original_max_position = scaling.req_int("original_max_position_embeddings");
    rope.beta_fast = scaling.opt_num("beta_fast", 32.0);
    rope.beta_slow = scaling.opt_num("beta_slow", 1.0);
    rope.mscale = scaling.opt_num("mscale", 0.0);
    rope.mscale_all_dim = scaling.opt_num("mscale_all_dim", 0.0);
  } else {
    TETRA_FAIL(src, ": unsupported RoPE type '", type, "' (Tetra implements \"default\" and \"yarn\")");
  }

  rope.partial_rotary_factor =
      params.opt_num("partial_rotary_factor", top.opt_num("partial_rotary_factor", 1.0));
  const bool interleave_default = arch == Arch::GlmMoeDsa || arch == Arch::DeepseekV3;
  rope.interleave = top.opt_bool("rope_interleave", interleave_default);
  return rope;
}

void validate(const ModelConfig& c, const std::string& src) {
  auto positive = [&](int64_t v, const char* key) {
    if (v <= 0) TETRA_FAIL(src, ": key '", key, "' must be > 0, got ", v);
  };
  positive(c.hidden_size, "hidden_size");
  positive(c.num_layers, "num_hidden_layers");
  positive(c.vocab_size, "vocab_size");
  positive(c.max_position_embeddings, "max_position_embeddings");
  positive(c.num_attention_heads, "num_attention_heads");
  positive(c.n_routed_experts, "n_routed_experts");
  positive(c.num_experts_per_tok, "num_experts_per_tok");
  positive(c.moe_intermediate_size, "moe_intermediate_size");
  if (c.num_dense_layers() > 0) positive(c.intermediate_size, "intermediate_size");
  // Limits far above any published model (sizes up to 64x, counts up to 10x), so that every
  // size the layout, the roofline and the loaders compute stays well inside int64 and the
  // per-expert tensor lists inside memory.
  auto at_most = [&](int64_t v, int64_t limit, const char* key) {
    if (v > limit) TETRA_FAIL(src, ": key '", key, "' is ", v, "; Tetra takes at most ", limit);
  };
  at_most(c.hidden_size, kMaxHidden, "hidden_size");
  at_most(c.vocab_size, kMaxVocab, "vocab_size");
  at_most(c.max_position_embeddings, kMaxPositions, "max_position_embeddings");
  at_most(c.intermediate_size, kMaxIntermediate, "intermediate_size");
  at_most(c.moe_intermediate_size, kMaxIntermediate, "moe_intermediate_size");
  at_most(c.n_routed_experts, kMaxExperts, "n_routed_experts");
  at_most(c.n_shared_experts, kMaxSharedExperts, "n_shared_experts");
  at_most(c.num_attention_heads, kMaxHeads, "num_attention_heads");
  at_most(c.num_key_value_heads, kMaxHeads, "num_key_value_heads");
  at_most(c.head_dim, kMaxHeadDim, "head_dim");
  at_most(c.q_lora_rank, kMaxHidden, "q_lora_rank");
  at_most(c.kv_lora_rank, kMaxHidden, "kv_lora_rank");
  at_most(c.v_head_dim, kMaxHeadDim, "v_head_dim");
  at_most(c.index_n_heads, kMaxHeads, "index_n_heads");
  at_most(c.index_head_dim, kMaxHeadDim, "index_head_dim");
  at_most(c.index_topk, kMaxPositions, "index_topk");
  at_most(c.num_nextn_predict_layers, kMaxLayers, "num_nextn_predict_layers");
  if (c.num_moe_layers() * (c.n_routed_experts + c.n_shared_experts) > kMaxExpertInstances)
    TETRA_FAIL(src, ": ", c.num_moe_layers(), " MoE layers x ",
               c.n_routed_experts + c.n_shared_experts, " experts is over Tetra's limit of ",
               kMaxExpertInstances, " expert instances");
  if (c.num_experts_per_tok > c.n_routed_experts)
    TETRA_FAIL(src, ": num_experts_per_tok (", c.num_experts_per_tok,
               ") is larger than the number of experts (", c.n_routed_experts, ")");
  if (c.n_shared_experts < 0) TETRA_FAIL(src, ": key 'n_shared_experts' must be >= 0");
  if (!(c.rms_norm_eps > 0)) TETRA_FAIL(src, ": key 'rms_norm_eps' must be > 0");

  if (c.attention == AttentionKind::GQA) {
    positive(c.num_key_value_heads, "num_key_value_heads");
    positive(c.head_dim, "head_dim");
    if (c.num_attention_heads % c.num_key_value_heads != 0)
      TETRA_FAIL(src, ": num_attention_heads (", c.num_attention_heads,
                 ") is not a multiple of num_key_value_heads (", c.num_key_value_heads, ")");
    const double rot = static_cast<double>(c.head_dim) * c.rope.partial_rotary_factor;
    if (!(rot > 0) || rot != std::floor(rot) || static_cast<int64_t>(rot) % 2 != 0)
      TETRA_FAIL(src, ": head_dim ", c.head_dim, " * partial_rotary_factor ",
                 c.rope.partial_rotary_factor, " must be a positive even number of dims");
  } else {
    positive(c.kv_lora_rank, "kv_lora_rank");
    positive(c.qk_nope_head_dim, "qk_nope_head_dim");
    positive(c.qk_rope_head_dim, "qk_rope_head_dim");
    positive(c.v_head_dim, "v_head_dim");
    if (c.q_lora_rank < 0) TETRA_FAIL(src, ": key 'q_lora_rank' must be >= 0 or null");
    if (c.qk_rope_head_dim % 2 != 0)
      TETRA_FAIL(src, ": key 'qk_rope_head_dim' must be even, got ", c.qk_rope_head_dim);
  }

  if (c.index_n_heads > 0) {
    positive(c.index_head_dim, "index_head_dim");
    positive(c.index_topk, "index_topk");
    if (c.q_lora_rank <= 0)
      TETRA_FAIL(src, ": the DSA indexer reads the compressed query, so q_lora_rank must be > 0");
    if (c.index_head_dim < c.qk_rope_head_dim)
      TETRA_FAIL(src, ": index_head_dim (", c.index_head_dim, ") is smaller than qk_rope_head_dim (",
                 c.qk_rope_head_dim, ")");
  }
  if (!c.indexer_types.empty()) {
    if (static_cast<int64_t>(c.indexer_types.size()) != c.num_layers)
      TETRA_FAIL(src, ": key 'indexer_types' has ", c.indexer_types.size(),
                 " entries, num_hidden_layers is ", c.num_layers);
    for (size_t i = 0; i < c.indexer_types.size(); ++i)
      if (c.indexer_types[i] != "full" && c.indexer_types[i] != "shared")
        TETRA_FAIL(src, ": key 'indexer_types' entry ", i, " is '", c.indexer_types[i],
                   "' (expected \"full\" or \"shared\")");
    if (c.indexer_types[0] != "full")
      TETRA_FAIL(src, ": key 'indexer_types' starts with \"shared\", but a shared layer reuses "
                      "the previous layer's selection");
  }

  const auto& r = c.routing;
  if (r.n_group < 1 || c.n_routed_experts % r.n_group != 0)
    TETRA_FAIL(src, ": n_group (", r.n_group, ") must divide the number of experts (",
               c.n_routed_experts, ")");
  if (r.topk_group < 1 || r.topk_group > r.n_group)
    TETRA_FAIL(src, ": topk_group (", r.topk_group, ") must be in [1, n_group=", r.n_group, "]");
  if (r.n_group > 1 && c.n_routed_experts / r.n_group < 2)
    TETRA_FAIL(src, ": group scores sum the top-2 experts of a group, so each of the ", r.n_group,
               " groups needs at least 2 experts");
  if (c.num_experts_per_tok > r.topk_group * (c.n_routed_experts / r.n_group))
    TETRA_FAIL(src, ": num_experts_per_tok (", c.num_experts_per_tok,
               ") exceeds the experts left in the topk_group best groups");
  if (c.rope.type == "yarn" && (!(c.rope.factor > 0) || c.rope.original_max_position <= 0))
    TETRA_FAIL(src, ": YaRN needs factor > 0 and original_max_position_embeddings > 0");
}

}  // namespace

std::string_view arch_hf_name(Arch a) {
  for (const auto& e : kArchs)
    if (e.arch == a) return e.hf_name;
  return "?";
}

std::string_view arch_model_type(Arch a) {
  for (const auto& e : kArchs)
    if (e.arch == a) return e.model_type;
  return "?";
}

std::optional<Arch> arch_from_name(std::string_view name) {
  for (const auto& e : kArchs)
    if (e.hf_name == name || e.model_type == name) return e.arch;
  return std::nullopt;
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const auto& e : kArchs) out.emplace_back(e.hf_name);
  return out;
}

int64_t ModelConfig::context_limit() const {
  if (rope.type != "yarn") return max_position_embeddings;
  const double scaled = double(rope.original_max_position) * rope.factor;
  return std::max(max_position_embeddings, int64_t(std::min(scaled, double(kMaxPositions))));
}

int64_t ModelConfig::num_moe_layers() const {
  return std::count(layer_is_moe.begin(), layer_is_moe.end(), true);
}

bool ModelConfig::layer_has_indexer(int64_t layer) const {
  if (index_n_heads <= 0) return false;
  if (indexer_types.empty()) return true;
  return indexer_types.at(static_cast<size_t>(layer)) == "full";
}

ModelConfig parse_model_config(const nlohmann::json& j, std::string_view source_label) {
  const std::string src(source_label);
  if (!j.is_object()) TETRA_FAIL(src, ": config must be a JSON object");
  ModelConfig c;
  c.arch = detect_arch(j, src);
  const std::string arch_name(arch_hf_name(c.arch));
  const Reader r(j, src, arch_name);
  c.model_type = r.opt_str("model_type", std::string(arch_model_type(c.arch)));
  c.torch_dtype = r.opt_str("dtype", r.opt_str("torch_dtype", "bfloat16"));
  const std::string act = r.opt_str("hidden_act", "silu");
  if (act != "silu")
    TETRA_FAIL(src, ": hidden_act '", act, "' is not supported (Tetra implements silu)");

  c.hidden_size = r.req_int("hidden_size");
  c.num_layers = r.req_int("num_hidden_layers");
  c.vocab_size = r.req_int("vocab_size");
  c.max_position_embeddings = r.req_int("max_position_embeddings");
  c.rms_norm_eps = r.req_num("rms_norm_eps");
  c.tie_word_embeddings = r.opt_bool("tie_word_embeddings", false);
  c.num_nextn_predict_layers = r.opt_int("num_nextn_predict_layers", 0);
  if (c.num_layers <= 0) r.fail("num_hidden_layers", "must be > 0");
  if (c.num_layers > kMaxLayers)
    r.fail("num_hidden_layers", str("is ", c.num_layers, "; Tetra takes at most ", kMaxLayers));

  // Experts: Qwen spells the count num_experts; GLM-5 accepts it for backward compatibility.
  if (r.has("n_routed_experts")) c.n_routed_experts = r.req_int("n_routed_experts");
  else if (r.has("num_experts")) c.n_routed_experts = r.req_int("num_experts");
  else TETRA_FAIL(src, ": missing key 'n_routed_experts' (or 'num_experts'; needed for ", arch_name, ")");
  c.num_experts_per_tok = r.req_int("num_experts_per_tok");
  c.moe_intermediate_size = r.req_int("moe_intermediate_size");
  c.intermediate_size = r.req_int("intermediate_size");
  if (c.arch == Arch::Qwen3Moe) {
    c.n_shared_experts = 0;  // Qwen3-MoE has none
  } else {
    if (!r.present("n_shared_experts")) r.require("n_shared_experts");
    c.n_shared_experts = r.opt_int("n_shared_experts", 0);  // null = none
  }
  c.layer_is_moe = parse_layer_pattern(r, c.arch, c.num_layers);

  c.num_attention_heads = r.req_int("num_attention_heads");
  c.attention_bias = r.opt_bool("attention_bias", false);
  if (c.arch == Arch::GlmMoeDsa || c.arch == Arch::DeepseekV3) {
    c.attention = AttentionKind::MLA;
    if (!r.present("q_lora_rank")) r.require("q_lora_rank");
    c.q_lora_rank = r.opt_int("q_lora_rank", 0);  // null = no q compression
    c.kv_lora_rank = r.req_int("kv_lora_rank");
    c.qk_nope_head_dim = r.req_int("qk_nope_head_dim");
    c.qk_rope_head_dim = r.req_int("qk_rope_head_dim");
    c.v_head_dim = r.req_int("v_head_dim");
    c.num_key_value_heads = r.opt_int("num_key_value_heads", c.num_attention_heads);
    c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  } else {
    c.attention = AttentionKind::GQA;
    c.num_key_value_heads = r.req_int("num_key_value_heads");
    if (r.has("head_dim")) {
      c.head_dim = r.req_int("head_dim");
    } else {
      if (c.num_attention_heads <= 0 || c.hidden_size % c.num_attention_heads != 0)
        TETRA_FAIL(src, ": no 'head_dim' and hidden_size ", c.hidden_size,
                   " is not a multiple of num_attention_heads ", c.num_attention_heads);
      c.head_dim = c.hidden_size / c.num_attention_heads;
    }
    c.use_qk_norm = c.arch == Arch::Qwen3Moe ? true : r.opt_bool("use_qk_norm", false);
  }

  if (c.arch == Arch::GlmMoeDsa) {
    c.index_n_heads = r.req_int("index_n_heads");
    c.index_head_dim = r.req_int("index_head_dim");
    c.index_topk = r.req_int("index_topk");
    c.indexer_types = parse_indexer_types(r, c.num_layers);
    c.indexer_rope_interleave = r.opt_bool("indexer_rope_interleave", false);
  }

  if (c.arch == Arch::Qwen3Moe) {
    // Softmax over all experts, plain top-k, no bias, no groups, no scaling.
    c.routing = RoutingConfig{RouterScoring::Softmax, "greedy", 1, 1,
                              r.req_bool("norm_topk_prob"), 1.0, false};
  } else {
    // transformers implements exactly one router for these: sigmoid + correction bias
    // ("noaux_tc"); refuse configs that ask for something else rather than run it wrongly.
    const std::string scoring = r.opt_str("scoring_func", "sigmoid");
    const std::string method = r.opt_str("topk_method", "noaux_tc");
    if (scoring != "sigmoid")
      TETRA_FAIL(src, ": scoring_func '", scoring, "' is not supported for ", arch_name,
                 " (expected \"sigmoid\")");
    if (method != "noaux_tc")
      TETRA_FAIL(src, ": topk_method '", method, "' is not supported for ", arch_name,
                 " (expected \"noaux_tc\")");
    c.routing = RoutingConfig{RouterScoring::Sigmoid, method, r.req_int("n_group"),
                              r.req_int("topk_group"), r.req_bool("norm_topk_prob"),
                              r.req_num("routed_scaling_factor"), true};
  }

  c.rope = parse_rope(r, j, c.arch, src, arch_name);
  validate(c, src);
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& dir) {
  if (!std::filesystem::is_directory(dir)) TETRA_FAIL("model directory not found: ", dir.string());
  const auto path = dir / "config.json";
  std::ifstream in(path);
  if (!in) TETRA_FAIL("cannot open ", path.string(), " (is ", dir.string(), " a model folder?)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    TETRA_FAIL(path.string(), " is not valid JSON: ", e.what());
  }
  return parse_model_config(j, path.string());
}

nlohmann::json model_config_to_json(const ModelConfig& c) {
  using nlohmann::json;
  const bool qwen = c.arch == Arch::Qwen3Moe;
  const bool mla = c.attention == AttentionKind::MLA;
  json j;
  j["architectures"] = json::array({std::string(arch_hf_name(c.arch))});
  j["model_type"] = c.model_type;
  // GLM-5 was published with the newer transformers spelling.
  j[c.arch == Arch::GlmMoeDsa ? "dtype" : "torch_dtype"] = c.torch_dtype;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_layers;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.num_nextn_predict_layers > 0 || !qwen)
    j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["norm_topk_prob"] = c.routing.norm_topk_prob;

  if (qwen) {
    j["num_experts"] = c.n_routed_experts;
    json only = json::array();
    for (int64_t i = 0; i < c.num_layers; ++i)
      if (!c.layer_is_moe[static_cast<size_t>(i)]) only.push_back(i);
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = only;
  } else {
    j["n_routed_experts"] = c.n_routed_experts;
    j["n_shared_experts"] = c.n_shared_experts;
    j["n_group"] = c.routing.n_group;
    j["topk_group"] = c.routing.topk_group;
    j["routed_scaling_factor"] = c.routing.routed_scaling_factor;
    if (mla) {
      j["scoring_func"] = "sigmoid";
      j["topk_method"] = c.routing.topk_method;
    }
    // A dense prefix then all-MoE is what first_k_dense_replace says; anything else needs
    // the explicit list.
    const int64_t first_k = c.num_dense_layers();
    bool prefix = true;
    for (int64_t i = 0; i < c.num_layers; ++i)
      prefix = prefix && c.layer_is_moe[static_cast<size_t>(i)] == (i >= first_k);
    if (prefix) {
      j["first_k_dense_replace"] = first_k;
      if (c.arch != Arch::Glm4Moe) j["moe_layer_freq"] = 1;
    } else {
      json types = json::array();
      for (bool m : c.layer_is_moe) types.push_back(m ? "sparse" : "dense");
      j["mlp_layer_types"] = types;
    }
  }

  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["attention_bias"] = c.attention_bias;
  if (mla) {
    j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["qk_nope_head_dim"] = c.qk_nope_head_dim;
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["v_head_dim"] = c.v_head_dim;
  } else {
    j["head_dim"] = c.head_dim;
    if (!qwen) j["use_qk_norm"] = c.use_qk_norm;
  }
  if (c.arch == Arch::GlmMoeDsa) {
    j["qk_head_dim"] = c.qk_nope_head_dim + c.qk_rope_head_dim;
    j["index_n_heads"] = c.index_n_heads;
    j["index_head_dim"] = c.index_head_dim;
    j["index_topk"] = c.index_topk;
    j["indexer_rope_interleave"] = c.indexer_rope_interleave;
    if (!c.indexer_types.empty()) j["indexer_types"] = c.indexer_types;
  }

  json scaling = nullptr;
  if (c.rope.type == "yarn") {
    scaling = json{{"type", "yarn"},
                   {"factor", c.rope.factor},
                   {"original_max_position_embeddings", c.rope.original_max_position},
                   {"beta_fast", c.rope.beta_fast},
                   {"beta_slow", c.rope.beta_slow}};
    if (c.rope.mscale != 0) scaling["mscale"] = c.rope.mscale;
    if (c.rope.mscale_all_dim != 0) scaling["mscale_all_dim"] = c.rope.mscale_all_dim;
  }
  if (c.arch == Arch::GlmMoeDsa) {
    json params = scaling.is_null() ? json::object() : scaling;
    params.erase("type");
    params["rope_type"] = c.rope.type;
    params["rope_theta"] = c.rope.theta;
    if (c.rope.partial_rotary_factor != 1.0)
      params["partial_rotary_factor"] = c.rope.partial_rotary_factor;
    j["rope_parameters"] = params;
  } else {
    j["rope_theta"] = c.rope.theta;
    j["rope_scaling"] = scaling;
    if (c.rope.partial_rotary_factor != 1.0)
      j["partial_rotary_factor"] = c.rope.partial_rotary_factor;
  }
  if (mla || c.rope.interleave) j["rope_interleave"] = c.rope.interleave;
  return j;
}

}  // namespace tetra
