// The model facts Tetra needs from a Hugging Face config.json, for the four supported
// architectures (MODELS.md). One struct for all of them; fields an architecture does not use
// are zero/empty. The parser reads every dialect MODELS.md lists and refuses what it cannot use
// with an error that names the file and the key.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tetra {

enum class Arch { GlmMoeDsa, Glm4Moe, DeepseekV3, Qwen3Moe };
// "GlmMoeDsaForCausalLM", "Glm4MoeForCausalLM", "DeepseekV3ForCausalLM", "Qwen3MoeForCausalLM".
std::string_view arch_hf_name(Arch);
// "glm_moe_dsa", "glm4_moe", "deepseek_v3", "qwen3_moe".
std::string_view arch_model_type(Arch);
// Accepts either spelling above; nullopt when neither names a supported architecture.
std::optional<Arch> arch_from_name(std::string_view name);

enum class AttentionKind { GQA, MLA };
enum class RouterScoring { Sigmoid, Softmax };

struct RopeConfig {
  double theta = 10000.0;
  std::string type = "default";  // "default" | "yarn"
  // YaRN fields; for "default" they keep these neutral values.
  double factor = 1.0;
  int64_t original_max_position = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;  // 0 = not given (the config left it out)
  // Fraction of each head that rotates (GLM-4.x: 0.5 -> first 64 of 128 dims).
  double partial_rotary_factor = 1.0;
  // GPT-J style interleaved pairs (true) or NeoX rotate-half (false): config "rope_interleave".
  bool interleave = false;
  friend bool operator==(const RopeConfig&, const RopeConfig&) = default;
};

struct RoutingConfig {
  RouterScoring scoring = RouterScoring::Softmax;
  std::string topk_method = "greedy";  // "noaux_tc" (sigmoid + correction bias) or "greedy"
  int64_t n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  bool has_correction_bias = false;  // mlp.gate.e_score_correction_bias exists
  friend bool operator==(const RoutingConfig&, const RoutingConfig&) = default;
};

// The largest config parse_model_config accepts (far above any published model): every size
// the layout, the roofline and the loaders compute from it then stays inside int64, and the
// per-expert tensor lists (layers x experts) inside memory.
inline constexpr int64_t kMaxLayers = 1024, kMaxHidden = 65536, kMaxVocab = int64_t(1) << 22,
                         kMaxPositions = int64_t(1) << 30, kMaxIntermediate = int64_t(1) << 20,
                         kMaxExperts = 4096, kMaxSharedExperts = 64, kMaxHeads = 1024,
                         kMaxHeadDim = 4096, kMaxExpertInstances = int64_t(1) << 20;

struct ModelConfig {
  Arch arch = Arch::Qwen3Moe;
  std::string model_type;   // as in config.json, e.g. "glm_moe_dsa"
  std::string torch_dtype;  // "bfloat16" unless the config says otherwise
  int64_t hidden_size = 0, num_layers = 0, vocab_size = 0, max_position_embeddings = 0;
  int64_t intermediate_size = 0;  // dense MLP width
  int64_t moe_intermediate_size = 0, n_routed_experts = 0, n_shared_experts = 0,
          num_experts_per_tok = 0;
  std::vector<bool> layer_is_moe;  // [num_layers] true = routed MoE block, false = dense MLP
  AttentionKind attention = AttentionKind::GQA;
  // GQA. For MLA, head_dim is the q/k head dim (qk_nope + qk_rope) and num_key_value_heads is
  // whatever the config says (it has no meaning there).
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  bool attention_bias = false, use_qk_norm = false;
  // MLA (q_lora_rank 0 = no q compression: a plain q_proj).
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0,
          v_head_dim = 0;
  // GLM-5 DSA indexer; 0 = none.
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  // GLM-5 per layer "full" (runs the indexer) / "shared" (reuses the previous layer's top-k);
  // [num_layers] or empty (= every layer "full").
  std::vector<std::string> indexer_types;
  bool indexer_rope_interleave = false;  // config "indexer_rope_interleave"
  RoutingConfig routing;
  RopeConfig rope;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t num_nextn_predict_layers = 0;  // MTP layers after the main ones; Tetra ignores them
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;

  int64_t num_moe_layers() const;
  // The longest sequence (prompt + generated tokens) the model is configured for, as vLLM
  // derives its max_model_len: max_position_embeddings, or with YaRN the original length times
  // the factor when that is longer.
  int64_t context_limit() const;
  int64_t num_dense_layers() const { return num_layers - num_moe_layers(); }
  // Layer L runs the DSA indexer itself (it has indexer weights).
  bool layer_has_indexer(int64_t layer) const;
};

// `source_label` names the file in errors ("<dir>/config.json"). Unknown keys are ignored; a
// missing key the architecture needs, a bad value or an unsupported architecture is an Error
// naming the key (and, for architectures, listing the supported ones).
ModelConfig parse_model_config(const nlohmann::json& j, std::string_view source_label);
ModelConfig load_model_config(const std::filesystem::path& dir);  // reads dir/config.json
// HF-style config.json (the dialect the real checkpoint of that architecture uses) that
// parse_model_config reads back equal.
nlohmann::json model_config_to_json(const ModelConfig&);
std::vector<std::string> supported_architectures();  // HF class names

}  // namespace tetra

// Presets are ModelConfigs too; callers that include this header get them as well.
#include "format/presets.h"
