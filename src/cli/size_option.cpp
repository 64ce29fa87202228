#include "cli/size_option.h"

#include <cctype>
#include <cmath>

#include "core/error.h"

namespace tetra::cli {

uint64_t parse_size(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    TETRA_FAIL("invalid size '", text, "' (examples: 5GB, 500MB, 1048576)");
  }
  std::string unit = text.substr(pos);
  for (char& ch : unit) ch = char(std::toupper(uint8_t(ch)));
  double mult = 1;
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB") mult = 1e3;
  else if (unit == "M" || unit == "MB") mult = 1e6;
  else if (unit == "G" || unit == "GB") mult = 1e9;
  else if (unit == "KIB") mult = 1024.0;
  else if (unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else TETRA_FAIL("invalid size unit in '", text, "' (use B, KB, MB, GB, KiB, MiB, GiB)");
  if (!(value > 0) || !std::isfinite(value)) TETRA_FAIL("size must be positive: '", text, "'");
  return uint64_t(value * mult);
}

}  // namespace tetra::cli
