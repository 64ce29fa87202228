#include "cli/token_ids.h"

#include <charconv>

#include "core/error.h"

namespace tetra::cli {

std::vector<int32_t> parse_token_ids(const std::string& text, const char* option) {
  std::vector<int32_t> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      TETRA_FAIL(option, ": '", item, "' is not a token id (expected comma-separated integers, e.g. 1,2,3)");
    if (v < 0 || v > INT32_MAX) TETRA_FAIL(option, ": token id ", v, " is out of range");
    out.push_back(int32_t(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace tetra::cli
