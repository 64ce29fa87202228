// GPT-2's byte-level alphabet: each of the 256 byte values is shown as one printable code point
// so BPE can work on text. Printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF)
// stand for themselves; the other 68 bytes, in increasing order, become U+0100, U+0101, ...
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace tetra::tok {

char32_t byte_to_char(unsigned char b);
std::optional<unsigned char> char_to_byte(char32_t c);  // nullopt outside the alphabet
// The byte-level spelling of raw bytes, as UTF-8 ("hi there" -> "hiĠthere").
std::string bytes_to_byte_level(std::string_view bytes);
// Back to raw bytes. A token with any character outside the alphabet (an added token such as
// "<｜begin▁of▁sentence｜>") is returned as its own UTF-8, as the Hugging Face decoder does.
std::string byte_level_to_bytes(std::string_view token);

}  // namespace tetra::tok
