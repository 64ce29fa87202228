// generation_config.json, the part Tetra reads: the ids that end a plain generation.
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

namespace tetra {

// eos_token_id (a number or a list) of DIR/generation_config.json, keeping the ids in
// [0, vocab); empty when the file or the field is missing or is not JSON.
std::vector<int32_t> generation_config_eos_ids(const std::filesystem::path& dir, int64_t vocab);

}  // namespace tetra
