#include "format/presets.h"

#include <cctype>
#include <functional>
#include <utility>

#include "core/error.h"

namespace tetra {
namespace {

using nlohmann::json;

// Each preset is written as the config.json keys of the real checkpoint (trimmed to what
// Tetra reads) and goes through the same parser as a file on disk, so presets can never
// hold a combination the parser would refuse.

json glm5() {  // zai-org/GLM-5 config.json
  return json{{"architectures", {"GlmMoeDsaForCausalLM"}}, {"model_type", "glm_moe_dsa"},
              {"dtype", "bfloat16"}, {"hidden_act", "silu"},
              {"hidden_size", 6144}, {"num_hidden_layers", 78}, {"vocab_size", 154880},
              {"max_position_embeddings", 202752}, {"rms_norm_eps", 1e-5},
              {"tie_word_embeddings", false}, {"num_nextn_predict_layers", 1},
              {"intermediate_size", 12288}, {"moe_intermediate_size", 2048},
              {"first_k_dense_replace", 3}, {"moe_layer_freq", 1},
              {"n_routed_experts", 256}, {"n_shared_experts", 1}, {"num_experts_per_tok", 8},
              {"n_group", 1}, {"topk_group", 1}, {"norm_topk_prob", true},
              {"routed_scaling_factor", 2.5}, {"scoring_func", "sigmoid"},
              {"topk_method", "noaux_tc"},
              {"num_attention_heads", 64}, {"num_key_value_heads", 64},
              {"attention_bias", false}, {"q_lora_rank", 2048}, {"kv_lora_rank", 512},
              {"qk_nope_head_dim", 192}, {"qk_rope_head_dim", 64}, {"v_head_dim", 256},
              {"qk_head_dim", 256}, {"head_dim", 64},
              {"index_n_heads", 32}, {"index_head_dim", 128}, {"index_topk", 2048},
              {"indexer_rope_interleave", true}, {"rope_interleave", true},
              {"rope_parameters", {{"rope_theta", 1000000}, {"rope_type", "default"}}}};
}

json glm45_air() {  // zai-org/GLM-4.5-Air config.json
  return json{{"architectures", {"Glm4MoeForCausalLM"}}, {"model_type", "glm4_moe"},
              {"torch_dtype", "bfloat16"}, {"hidden_act", "silu"},
              {"hidden_size", 4096}, {"num_hidden_layers", 46}, {"vocab_size", 151552},
              {"max_position_embeddings", 131072}, {"rms_norm_eps", 1e-5},
              {"tie_word_embeddings", false}, {"num_nextn_predict_layers", 1},
              {"intermediate_size", 10944}, {"moe_intermediate_size", 1408},
              {"first_k_dense_replace", 1},
              {"n_routed_experts", 128}, {"n_shared_experts", 1}, {"num_experts_per_tok", 8},
              {"n_group", 1}, {"topk_group", 1}, {"norm_topk_prob", true},
              {"routed_scaling_factor", 1.0},
              {"num_attention_heads", 96}, {"num_key_value_heads", 8}, {"head_dim", 128},
              {"attention_bias", true}, {"use_qk_norm", false},
              {"partial_rotary_factor", 0.5}, {"rope_theta", 1000000}, {"rope_scaling", nullptr}};
}

json glm47() {  // zai-org/GLM-4.7 config.json (same shape as GLM-4.5/4.6)
  return json{{"architectures", {"Glm4MoeForCausalLM"}}, {"model_type", "glm4_moe"},
              {"dtype", "bfloat16"}, {"hidden_act", "silu"},
              {"hidden_size", 5120}, {"num_hidden_layers", 92}, {"vocab_size", 151552},
              {"max_position_embeddings", 202752}, {"rms_norm_eps", 1e-5},
              {"tie_word_embeddings", false}, {"num_nextn_predict_layers", 1},
              {"intermediate_size", 12288}, {"moe_intermediate_size", 1536},
              {"first_k_dense_replace", 3},
              {"n_routed_experts", 160}, {"n_shared_experts", 1}, {"num_experts_per_tok", 8},
              {"n_group", 1}, {"topk_group", 1}, {"norm_topk_prob", true},
              {"routed_scaling_factor", 2.5},
              {"num_attention_heads", 96}, {"num_key_value_heads", 8}, {"head_dim", 128},
              {"attention_bias", true}, {"use_qk_norm", true},
              {"partial_rotary_factor", 0.5}, {"rope_theta", 1000000}, {"rope_scaling", nullptr}};
}

json deepseek_v3() {  // deepseek-ai/DeepSeek-V3 config.json
  return json{{"architectures", {"DeepseekV3ForCausalLM"}}, {"model_type", "deepseek_v3"},
              {"torch_dtype", "bfloat16"}, {"hidden_act", "silu"},
              {"hidden_size", 7168}, {"num_hidden_layers", 61}, {"vocab_size", 129280},
              {"max_position_embeddings", 163840}, {"rms_norm_eps", 1e-6},
              {"tie_word_embeddings", false}, {"num_nextn_predict_layers", 1},
              {"intermediate_size", 18432}, {"moe_intermediate_size", 2048},
              {"first_k_dense_replace", 3}, {"moe_layer_freq", 1},
              {"n_routed_experts", 256}, {"n_shared_experts", 1}, {"num_experts_per_tok", 8},
              {"n_group", 8}, {"topk_group", 4}, {"norm_topk_prob", true},
              {"routed_scaling_factor", 2.5}, {"scoring_func", "sigmoid"},
              {"topk_method", "noaux_tc"},
              {"num_attention_heads", 128}, {"num_key_value_heads", 128},
              {"attention_bias", false}, {"q_lora_rank", 1536}, {"kv_lora_rank", 512},
              {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64}, {"v_head_dim", 128},
              {"rope_theta", 10000},
              {"rope_scaling", {{"type", "yarn"}, {"factor", 40}, {"original_max_position_embeddings", 4096},
                                {"beta_fast", 32}, {"beta_slow", 1}, {"mscale", 1.0},
                                {"mscale_all_dim", 1.0}}}};
}

json qwen3_30b_a3b() {  // Qwen/Qwen3-30B-A3B config.json
  return json{{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"},
              {"torch_dtype", "bfloat16"}, {"hidden_act", "silu"},
              {"hidden_size", 2048}, {"num_hidden_layers", 48}, {"vocab_size", 151936},
              {"max_position_embeddings", 40960}, {"rms_norm_eps", 1e-6},
              {"tie_word_embeddings", false},
              {"intermediate_size", 6144}, {"moe_intermediate_size", 768},
              {"decoder_sparse_step", 1}, {"mlp_only_layers", json::array()},
              {"num_experts", 128}, {"num_experts_per_tok", 8}, {"norm_topk_prob", true},
              {"num_attention_heads", 32}, {"num_key_value_heads", 4}, {"head_dim", 128},
              {"attention_bias", false}, {"rope_theta", 1000000.0}, {"rope_scaling", nullptr}};
}

// Tiny versions: every dimension a multiple of 16 (NVFP4 blocks), the first layer dense
// where the real model has dense layers, the same attention/routing/RoPE features.
json tiny_common(json j) {
  j["hidden_size"] = 64;
  j["num_hidden_layers"] = 3;
  j["vocab_size"] = 512;
  j["max_position_embeddings"] = 4096;
  j["intermediate_size"] = 128;
  j["moe_intermediate_size"] = 64;  // the W4A16 GEMMs need a multiple of 64
  j["n_routed_experts"] = 16;
  j["num_experts_per_tok"] = 4;
  j["num_nextn_predict_layers"] = 0;  // tiny checkpoints carry no MTP layer
  if (j.contains("first_k_dense_replace")) j["first_k_dense_replace"] = 1;
  return j;
}

json tiny_mla(json j) {
  j = tiny_common(std::move(j));
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 4;
  j["q_lora_rank"] = 32;
  j["kv_lora_rank"] = 32;
  j["qk_nope_head_dim"] = 32;
  j["qk_rope_head_dim"] = 16;
  j["v_head_dim"] = 32;
  return j;
}

json tiny_gqa(json j) {
  j = tiny_common(std::move(j));
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 64;  // heads * head_dim (256) != hidden (64), as in the real GLM-4.x/Qwen3
  return j;
}

json tiny_glm5() {
  json j = tiny_mla(glm5());
  j.erase("qk_head_dim");
  j.erase("head_dim");
  j["index_n_heads"] = 4;
  j["index_head_dim"] = 32;
  j["index_topk"] = 16;  // small enough that a short test prompt exercises the sparse path
  return j;
}

json tiny_glm45_air() { return tiny_gqa(glm45_air()); }
json tiny_glm47() { return tiny_gqa(glm47()); }

json tiny_deepseek_v3() {
  json j = tiny_mla(deepseek_v3());
  j["n_group"] = 4;  // 4 groups of 4 experts, keep the best 2 groups
  j["topk_group"] = 2;
  j["rope_scaling"]["factor"] = 4;
  j["rope_scaling"]["original_max_position_embeddings"] = 1024;
  return j;
}

json tiny_qwen3_30b_a3b() {
  json j = tiny_gqa(qwen3_30b_a3b());
  j.erase("n_routed_experts");
  j["num_experts"] = 16;
  return j;
}

const std::vector<std::pair<std::string, std::function<json()>>>& presets() {
  static const std::vector<std::pair<std::string, std::function<json()>>> kPresets = {
      {"glm5", glm5},
      {"glm4.5-air", glm45_air},
      {"glm4.7", glm47},
      {"deepseek-v3", deepseek_v3},
      {"qwen3-30b-a3b", qwen3_30b_a3b},
      {"tiny-glm5", tiny_glm5},
      {"tiny-glm4.5-air", tiny_glm45_air},
      {"tiny-glm4.7", tiny_glm47},
      {"tiny-deepseek-v3", tiny_deepseek_v3},
      {"tiny-qwen3-30b-a3b", tiny_qwen3_30b_a3b},
  };
  return kPresets;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> out;
  for (const auto& p : presets()) out.push_back(p.first);
  return out;
}

namespace {
// A preset name as users write it, compared without case, hyphens and underscores:
// "GLM-4.5-Air" and "Qwen3-30B-A3B" (the Hugging Face names) find glm4.5-air and qwen3-30b-a3b.
std::string preset_key(std::string_view name) {
  std::string key;
  for (char c : name)
    if (c != '-' && c != '_') key += char(std::tolower(static_cast<unsigned char>(c)));
  return key;
}
}  // namespace

ModelConfig preset_config(std::string_view name) {
  for (const auto& p : presets())
    if (preset_key(p.first) == preset_key(name))
      return parse_model_config(p.second(), "preset '" + p.first + "'");
  std::string names;
  for (const auto& p : presets()) names += (names.empty() ? "" : ", ") + p.first;
  TETRA_FAIL("unknown preset '", name, "'; presets: ", names);
}

ModelConfig with_num_layers(ModelConfig c, int64_t n) {
  if (n < 1) TETRA_FAIL("with_num_layers: need at least 1 layer, got ", n);
  const size_t old_n = c.layer_is_moe.size();
  TETRA_CHECK(old_n > 0, "config has no layers");
  c.layer_is_moe.resize(static_cast<size_t>(n), c.layer_is_moe[old_n - 1]);
  if (!c.indexer_types.empty()) {
    const std::string last = c.indexer_types.back();
    c.indexer_types.resize(static_cast<size_t>(n), last);
  }
  c.num_layers = n;
  return c;
}

QuantConfig preset_quant(std::string_view name, const std::string& producer) {
  QuantConfig q;
  q.group_size = 16;
  q.producer = producer;
  if (name == "nvfp4")
    q.algo = QuantAlgo::NVFP4;
  else if (name == "w4a16_nvfp4")
    q.algo = QuantAlgo::W4A16_NVFP4;
  else if (name == "bf16")
    q.algo = QuantAlgo::None;
  else
    TETRA_FAIL("unknown --quant '", name, "'; known: nvfp4, w4a16_nvfp4, bf16");
  if (q.algo != QuantAlgo::None) q.exclude = {"lm_head"};
  return q;
}

}  // namespace tetra
