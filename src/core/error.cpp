#include "core/error.h"

namespace tetra::detail {

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(str(msg, " [", file, ":", line, "]"));
}

}  // namespace tetra::detail
