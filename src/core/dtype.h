// Element types as Hugging Face safetensors spells them, plus sizes and names.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tetra {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, U8, I8, I32, I64, BOOL };

size_t dtype_size(DType t);
// safetensors' spelling: "F32", "BF16", "F8_E4M3", ...
std::string_view dtype_name(DType t);
std::optional<DType> parse_dtype(std::string_view name);

}  // namespace tetra
