#include "cli/cli_util.h"

#include <sstream>

#include "core/error.h"

namespace tetra::cli {

std::vector<int> parse_int_list(const std::string& text, const std::string& option,
                                int min_value) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string piece;
  while (std::getline(ss, piece, ',')) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(piece, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (piece.empty() || used != piece.size())
      TETRA_FAIL(option, ": '", piece, "' is not a whole number (expected e.g. 1,8,64)");
    if (v < min_value) TETRA_FAIL(option, ": ", v, " is below the minimum ", min_value);
    out.push_back(v);
  }
  if (out.empty()) TETRA_FAIL(option, ": give at least one value");
  return out;
}

}  // namespace tetra::cli
