// How a checkpoint is quantized, from ModelOpt's hf_quant_config.json and/or the
// "quantization_config" block of config.json (NVFP4.md "Quantization config").
#pragma once
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tetra {

// FP8 is only recognised (e.g. DeepSeek-V3's native block-FP8 release) so `tetra check` can
// say why it will not load; Tetra reads NVFP4 (W4A4) and W4A16_NVFP4 (weight-only) checkpoints.
enum class QuantAlgo { None, NVFP4, W4A16_NVFP4, FP8 };
std::string_view quant_algo_name(QuantAlgo);  // "NONE", "NVFP4", "W4A16_NVFP4", "FP8"

struct QuantConfig {
  QuantAlgo algo = QuantAlgo::None;  // NVFP4, W4A16_NVFP4, FP8 or None; MIXED_PRECISION sets `mixed`
  bool mixed = false;
  std::map<std::string, QuantAlgo> quantized_layers;  // MIXED_PRECISION: module -> algo
  int group_size = 16;
  std::string kv_cache_quant_algo;  // "" (none), "FP8", "NVFP4", ...
  std::string producer;             // producer name, e.g. "modelopt"; "" when not given
  std::string producer_version;     // e.g. "0.29.0"; "" when not given
  std::vector<std::string> exclude;  // wildcard patterns (exclude_modules / ignore)

  // The algorithm of one module (e.g. "model.layers.3.mlp.experts.7.gate_proj"): None when
  // an exclude pattern matches it or one of its parents, or (MIXED_PRECISION) when neither it
  // nor a parent is listed in quantized_layers (exact name first, then patterns); otherwise
  // `algo` or its quantized_layers entry.
  QuantAlgo algo_for(std::string_view module) const;
  bool quantized() const;  // any module quantized at all
  friend bool operator==(const QuantConfig&, const QuantConfig&) = default;
};

// Reads dir/hf_quant_config.json and/or the "quantization_config" of dir/config.json. When
// both are present the ModelOpt file is the source and config.json must agree on the
// algorithm. Neither present: QuantConfig{} (not quantized). Unsupported methods/algorithms
// are an Error naming the file and the value.
QuantConfig load_quant_config(const std::filesystem::path& dir);
// The same from already-parsed JSON; either may be null. Labels name the files in errors.
QuantConfig parse_quant_config(const nlohmann::json& hf_quant_config,
                               const nlohmann::json& config_json,
                               std::string_view hf_label = "hf_quant_config.json",
                               std::string_view config_label = "config.json");
nlohmann::json quant_config_to_hf_json(const QuantConfig&);      // hf_quant_config.json content
nlohmann::json quant_config_to_config_json(const QuantConfig&);  // config.json "quantization_config"

}  // namespace tetra
