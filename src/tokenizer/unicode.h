// Code point level Unicode for the tokenizer: UTF-8 <-> code points, general category groups,
// White_Space, and canonical normalization (NFD, NFC) from the generated tables.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>


namespace tetra::tok {

enum class Category : unsigned char { Letter, Mark, Number, Punctuation, Symbol, Separator, Other };
Category category(char32_t cp);  // unassigned code points are Other
bool is_white_space(char32_t cp);  // the White_Space property (what \s matches)
int combining_class(char32_t cp);  // canonical combining class, 0 for starters

// Strict UTF-8 (no surrogates, overlongs or values past U+10FFFF). Error naming `what` and the
// byte offset otherwise.
std::u32string utf8_to_u32(std::string_view s, std::string_view what = "text");
std::string u32_to_utf8(std::u32string_view s);
void append_utf8(std::string& out, char32_t cp);
// Length of the valid UTF-8 sequence starting at s[i]: 1-4, or 0 when invalid there.
size_t utf8_sequence_length(std::string_view s, size_t i);
// Bytes of s[i..] that are a proper prefix of some valid sequence (could still complete), or 0.
size_t utf8_incomplete_prefix(std::string_view s, size_t i);
// Rust String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view s);

std::u32string nfd(std::u32string_view s);
std::u32string nfc(std::u32string_view s);

}  // namespace tetra::tok
