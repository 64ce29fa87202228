// Errors: one exception type, check macros that name both operands and file:line.
// The CLI turns a tetra::Error into one line and a non-zero exit.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace tetra {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

// Builds a message from any streamable pieces: tetra::str("layer ", i, " has ", n).
template <typename... Args>
std::string str(const Args&... args) {
  return detail::concat(args...);
}

}  // namespace tetra

// User-facing failure (bad input): the message alone, no file:line.
#define TETRA_FAIL(...) throw ::tetra::Error(::tetra::str(__VA_ARGS__))

// Internal invariant: names the condition and where it failed.
#define TETRA_CHECK(cond, ...)                                                   \
  do {                                                                           \
    if (!(cond))                                                                 \
      ::tetra::detail::throw_error(__FILE__, __LINE__,                           \
                                   ::tetra::str("check failed: " #cond " ", ##__VA_ARGS__)); \
  } while (0)

#define TETRA_CHECK_OP(a, op, b, ...)                                             \
  do {                                                                            \
    const auto& tetra_a_ = (a);                                                   \
    const auto& tetra_b_ = (b);                                                   \
    if (!(tetra_a_ op tetra_b_))                                                  \
      ::tetra::detail::throw_error(                                               \
          __FILE__, __LINE__,                                                     \
          ::tetra::str("check failed: " #a " " #op " " #b " (", tetra_a_, " vs ", \
                       tetra_b_, ") ", ##__VA_ARGS__));                           \
  } while (0)

#define TETRA_CHECK_EQ(a, b, ...) TETRA_CHECK_OP(a, ==, b, ##__VA_ARGS__)
#define TETRA_CHECK_LE(a, b, ...) TETRA_CHECK_OP(a, <=, b, ##__VA_ARGS__)
#define TETRA_CHECK_LT(a, b, ...) TETRA_CHECK_OP(a, <, b, ##__VA_ARGS__)
