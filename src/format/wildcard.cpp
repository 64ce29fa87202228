#include "format/wildcard.h"

#include <cstddef>

namespace tetra {

bool wildcard_match(std::string_view pattern, std::string_view name) {
  // Greedy scan with one backtrack point (the last '*'): linear in practice, and never
  // exponential because a later '*' makes earlier choices irrelevant.
  size_t p = 0, n = 0;
  size_t star = std::string_view::npos;  // position of the last '*' seen in pattern
  size_t star_n = 0;                     // name position that '*' currently extends to
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_n = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string_view::npos) {
      p = star + 1;  // let the last '*' swallow one more character and retry
      n = ++star_n;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool wildcard_match_module(std::string_view pattern, std::string_view module) {
  if (wildcard_match(pattern, module)) return true;
  for (size_t dot = module.rfind('.'); dot != std::string_view::npos && dot > 0;
       dot = module.rfind('.', dot - 1)) {
    if (wildcard_match(pattern, module.substr(0, dot))) return true;
  }
  return false;
}

}  // namespace tetra
