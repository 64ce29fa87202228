// Strict JSON parsing for safetensors headers and index files: nlohmann silently keeps the last
// of two equal keys, which would hide a duplicated tensor, so duplicates are refused here.
#pragma once
#include <nlohmann/json.hpp>
#include <string_view>

namespace tetra {

// Deepest nesting a safetensors header or index needs is 3 (object -> entry -> shape array);
// anything much deeper is garbage and is refused before it can cost stack or memory.
inline constexpr int kMaxSafetensorsJsonDepth = 16;

// Parses `text` as JSON; refuses syntax errors, duplicate keys in any object and nesting deeper
// than kMaxSafetensorsJsonDepth with a tetra::Error that starts with `label`.
nlohmann::json parse_strict_json(std::string_view text, std::string_view label);

}  // namespace tetra
