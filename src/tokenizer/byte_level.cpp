#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/unicode.h"

namespace tetra::tok {
namespace {

bool printable(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

struct Alphabet {
  std::array<char32_t, 256> to_char{};   // [256] byte -> code point
  std::array<unsigned char, 68> remapped{};  // [68] code point - U+0100 -> byte
  Alphabet() {
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      if (printable(b)) {
        to_char[size_t(b)] = char32_t(b);
      } else {
        remapped[next - 0x100] = static_cast<unsigned char>(b);
        to_char[size_t(b)] = next++;
      }
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

char32_t byte_to_char(unsigned char b) { return alphabet().to_char[b]; }

std::optional<unsigned char> char_to_byte(char32_t c) {
  if (c < 0x100) {
    if (printable(int(c))) return static_cast<unsigned char>(c);
    return std::nullopt;
  }
  if (c - 0x100 < 68) return alphabet().remapped[c - 0x100];
  return std::nullopt;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) append_utf8(out, byte_to_char(static_cast<unsigned char>(b)));
  return out;
}

std::string byte_level_to_bytes(std::string_view token) {
  const std::u32string chars = utf8_to_u32(token, "token");
  std::string out;
  out.reserve(chars.size());
  for (char32_t c : chars) {
    const auto b = char_to_byte(c);
    if (!b) return std::string(token);
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

}  // namespace tetra::tok
