// WIP measurement knob (not for main): TETRA_ABLATE=a,b,... skips those launches so a step's
// graph time shows each op's marginal cost. Outputs become meaningless.
#pragma once
#include <cstdlib>
#include <cstring>
#include <string>

namespace tetra {
inline bool ablated(const char* what) {
  static const std::string list = [] {
    const char* e = std::getenv("TETRA_ABLATE");
    return std::string(",") + (e ? e : "") + ",";
  }();
  return list.find(std::string(",") + what + ",") != std::string::npos;
}
}  // namespace tetra
