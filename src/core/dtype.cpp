#include "core/dtype.h"

#include <array>
#include <utility>

namespace tetra {
namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeInfo, 9> kInfo = {{
    {DType::F32, "F32", 4},
    {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::U8, "U8", 1},
    {DType::I8, "I8", 1},
    {DType::I32, "I32", 4},
    {DType::I64, "I64", 8},
    {DType::BOOL, "BOOL", 1},
}};
}  // namespace

size_t dtype_size(DType t) { return kInfo[static_cast<size_t>(t)].size; }
std::string_view dtype_name(DType t) { return kInfo[static_cast<size_t>(t)].name; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& info : kInfo)
    if (info.name == name) return info.type;
  return std::nullopt;
}

}  // namespace tetra
