// Short kernel names (see kernel_name.h).
#include "perf/kernel_name.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>

namespace tetra::perf {
namespace {

bool ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Removes every "qualifier::" (identifiers and "(anonymous namespace)").
std::string strip_qualifiers(std::string s) {
  for (size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;)
    s.erase(p, 23);
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (ident_char(s[i]) && (i == 0 || !ident_char(s[i - 1]))) {
      size_t j = i;
      while (j < s.size() && ident_char(s[j])) ++j;
      if (s.compare(j, 2, "::") == 0) {
        i = j + 2;  // drop the qualifier
        continue;
      }
      out.append(s, i, j - i);
      i = j;
      continue;
    }
    out.push_back(s[i++]);
  }
  return out;
}

}  // namespace

std::string short_kernel_name(const std::string& mangled) {
  std::string s = mangled;
  if (mangled.rfind("_Z", 0) == 0) {  // a plain name ("x") would demangle as a type
    int status = -1;
    char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
    if (status == 0 && d) s = d;
    std::free(d);
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  // Cut the parameter list: the first '(' outside template brackets after the name started.
  int angle = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++angle;
    else if (s[i] == '>') angle = std::max(0, angle - 1);
    else if (s[i] == '(' && angle == 0 && i > 0 && s.compare(i, 21, "(anonymous namespace)") != 0) {
      s.resize(i);
      break;
    }
  }
  return strip_qualifiers(s);
}

}  // namespace tetra::perf
