// The two jobs that write whole checkpoints: `tetra quantize` (HF high precision -> ModelOpt
// NVFP4) and `tetra make-model` (random weights with a real architecture's config).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "format/model_config.h"
#include "tools/checkpoint_writer.h"

namespace tetra {

struct QuantizeOptions {
  std::vector<std::string> exclude;  // extra module patterns kept high precision
  std::string device = "auto";       // auto | cpu | cuda
  uint64_t max_shard_bytes = 5ull << 30;
  bool progress = true;
};

// Refuses an input that is already quantized, or whose tensors don't match its config.
WriteResult quantize_checkpoint(const std::filesystem::path& in_dir,
                                const std::filesystem::path& out_dir, const QuantizeOptions& opt);

struct MakeModelOptions {
  std::string preset;
  int64_t layers = 0;       // 0: the preset's own count
  std::string dtype = "bf16";  // bf16 | nvfp4
  uint64_t seed = 0;
  uint64_t max_shard_bytes = 5ull << 30;
  bool progress = false;
};

WriteResult make_model(const std::filesystem::path& out_dir, const MakeModelOptions& opt);

// Writes config.json (with quantization_config when quantized) and hf_quant_config.json.
void write_model_configs(const std::filesystem::path& out_dir, nlohmann::json config_json,
                         const WriteResult& written, const std::vector<std::string>& exclude,
                         bool quantized);

}  // namespace tetra
