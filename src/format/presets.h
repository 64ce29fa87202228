// Named model configurations: the real architectures' numbers (as their config.json files
// publish them) for sizing, benchmarks and `tetra check --preset`, and tiny versions that keep
// every architectural feature at sizes where a whole checkpoint is under 2 MB (tests).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/model_config.h"
#include "format/quant_config.h"

namespace tetra {

// glm5, glm4.5-air, glm4.7, deepseek-v3, qwen3-30b-a3b and tiny-<each of those>.
std::vector<std::string> preset_names();
// Error listing the presets when `name` is unknown.
ModelConfig preset_config(std::string_view name);
// The same model with n main layers: layer i < n keeps its original MLP kind and indexer type
// (so the dense-first prefix stays); layers past the original depth copy the last layer's.
ModelConfig with_num_layers(ModelConfig c, int64_t n);
// A preset has no checkpoint: the ModelOpt export to assume for it. "nvfp4" (W4A4 with
// input_scale), "w4a16_nvfp4" (weights only) or "bf16"; the NVFP4 ones quantize everything
// quantizable and exclude lm_head, as `tetra quantize` does. Error on any other name.
QuantConfig preset_quant(std::string_view name, const std::string& producer);

}  // namespace tetra
