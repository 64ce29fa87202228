// Unicode pieces of the tokenizer: categories and White_Space from the generated tables, strict
// UTF-8, lossy replacement by maximal subpart, NFD/NFC, and the pre-tokenizer regex matcher.
// Expected values are facts from the Unicode standard, written out by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

using namespace tetra;
using namespace tetra::tok;

TEST(TokenizerUnicode, Categories) {
  EXPECT_EQ(category(U'A'), Category::Letter);
  EXPECT_EQ(category(U'\u00E9'), Category::Letter);   // é
  EXPECT_EQ(category(U'\u4E2D'), Category::Letter);   // 中 (inside a First/Last range)
  EXPECT_EQ(category(U'\uAC01'), Category::Letter);   // a Hangul syllable (range)
  EXPECT_EQ(category(U'\u0663'), Category::Number);   // Arabic-Indic three
  EXPECT_EQ(category(U'\u2167'), Category::Number);   // Roman numeral eight (Nl)
  EXPECT_EQ(category(U'\u00BD'), Category::Number);   // ½ (No)
  EXPECT_EQ(category(U'\u0301'), Category::Mark);
  EXPECT_EQ(category(U'\u20AC'), Category::Symbol);   // €
  EXPECT_EQ(category(U'\U0001F600'), Category::Symbol);  // 😀
  EXPECT_EQ(category(U'\uFF01'), Category::Punctuation);  // ！
  EXPECT_EQ(category(U'_'), Category::Punctuation);
  EXPECT_EQ(category(U' '), Category::Separator);
  EXPECT_EQ(category(U'\n'), Category::Other);
  EXPECT_EQ(category(char32_t(0x10FFFF)), Category::Other);  // noncharacter, unassigned
}

TEST(TokenizerUnicode, WhiteSpaceAndCombiningClass) {
  for (char32_t c : {U'\t', U'\n', U'\v', U'\f', U'\r', U' ', U'\u0085', U'\u00A0', U'\u1680',
                     U'\u2000', U'\u200A', U'\u2028', U'\u2029', U'\u202F', U'\u205F', U'\u3000'})
    EXPECT_TRUE(is_white_space(c)) << std::hex << uint32_t(c);
  for (char32_t c : {U'a', U'\u200B', U'\u180E', U'\uFEFF', U'_'}) EXPECT_FALSE(is_white_space(c)) << std::hex << uint32_t(c);
  EXPECT_EQ(combining_class(U'\u0301'), 230);
  EXPECT_EQ(combining_class(U'\u0323'), 220);
  EXPECT_EQ(combining_class(U'a'), 0);
}

TEST(TokenizerUnicode, StrictUtf8) {
  EXPECT_EQ(utf8_to_u32("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"), (std::u32string{U'a', U'\u00E9', U'\u4E2D', U'\U0001F600'}));
  EXPECT_EQ(u32_to_utf8(U"a\u00E9\u4E2D\U0001F600"), "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80");
  for (const char* bad : {"\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82", "\x80", "\xFF"})
    EXPECT_THROW(utf8_to_u32(bad), Error) << bad;
}

TEST(TokenizerUnicode, LossyReplacesMaximalSubparts) {
  EXPECT_EQ(utf8_lossy("\xE2\x82" "A"), "\xEF\xBF\xBD" "A");               // one subpart of 2
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");                   // truncated emoji
  EXPECT_EQ(utf8_lossy("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");           // C0 never valid
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8_lossy("ok\xC3\xA9"), "ok\xC3\xA9");
  EXPECT_EQ(utf8_incomplete_prefix("\xF0\x9F\x98", 0), 3u);
  EXPECT_EQ(utf8_incomplete_prefix("\xE2\x82" "A", 0), 0u);  // cannot complete any more
  EXPECT_EQ(utf8_incomplete_prefix("\xED\xA0", 0), 0u);      // would be a surrogate
}

TEST(TokenizerUnicode, Normalization) {
  EXPECT_EQ(nfc(U"e\u0301"), U"\u00E9");
  EXPECT_EQ(nfd(U"\u00E9"), U"e\u0301");
  // ḋ + dot below: canonical order puts the below mark (220) first, then recomposes to ḍ + dot above.
  EXPECT_EQ(nfd(U"\u1E0B\u0323"), U"d\u0323\u0307");
  EXPECT_EQ(nfc(U"\u1E0B\u0323"), U"\u1E0D\u0307");
  EXPECT_EQ(nfc(U"\u2126"), U"\u03A9");                 // Ohm sign: singleton decomposition
  EXPECT_EQ(nfc(U"\u0958"), U"\u0915\u093C");           // composition exclusion stays apart
  EXPECT_EQ(nfc(U"\u1100\u1161\u11A8"), U"\uAC01");     // Hangul L V T -> one syllable
  EXPECT_EQ(nfd(U"\uAC01"), U"\u1100\u1161\u11A8");
  EXPECT_EQ(nfc(U"a\u0301\u0301"), U"\u00E1\u0301");    // the second acute is blocked
  EXPECT_EQ(nfc(U"\u00C5"), U"\u00C5");
  EXPECT_EQ(nfc(U"\u212B"), U"\u00C5");                 // Angstrom sign
}

namespace {

std::vector<std::string> split(const Regex& re, const std::string& text) {
  const std::u32string u = utf8_to_u32(text);
  std::vector<std::string> out;
  size_t from = 0;
  for (const auto& [b, e] : re.find_all(u)) {
    if (b > from) out.push_back("<gap>" + u32_to_utf8(u.substr(from, b - from)));
    out.push_back(u32_to_utf8(u.substr(b, e - b)));
    from = e;
  }
  if (from < u.size()) out.push_back("<gap>" + u32_to_utf8(u.substr(from)));
  return out;
}

const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

TEST(TokenizerRegex, Qwen2PatternPieces) {
  const Regex re(kQwen2);
  using V = std::vector<std::string>;
  EXPECT_EQ(split(re, "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split(re, "it'S we'LL"), (V{"it", "'S", " we", "'LL"}));
  EXPECT_EQ(split(re, "a  123"), (V{"a", " ", " ", "1", "2", "3"}));
  EXPECT_EQ(split(re, "x   "), (V{"x", "   "}));
  EXPECT_EQ(split(re, "a\n\n b"), (V{"a", "\n\n", " b"}));
  EXPECT_EQ(split(re, "hi!!!\n\nok"), (V{"hi", "!!!\n\n", "ok"}));
  EXPECT_EQ(split(re, "(x) {"), (V{"(x", ")", " {"}));
  EXPECT_EQ(split(re, "\u4E2D\u6587 \U0001F600\U0001F600!"), (V{"\u4E2D\u6587", " \U0001F600\U0001F600!"}));
  EXPECT_EQ(split(re, "\u00A0x"), (V{"\u00A0x"}));  // NBSP is not \r\n, not L/N: joins the word
  EXPECT_EQ(split(re, "a \t\n"), (V{"a", " \t\n"}));
}

TEST(TokenizerRegex, QuantifiersClassesAndLookahead) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split(Regex(R"(\p{N}{1,3})"), "12345a6"), (V{"123", "45", "<gap>a", "6"}));
  EXPECT_EQ(split(Regex(R"([a-c]+?x|b)"), "abx b"), (V{"abx", "<gap> ", "b"}));
  EXPECT_EQ(split(Regex(R"(\s+(?=x))"), "a  x  y"), (V{"<gap>a", "  ", "<gap>x  y"}));
  EXPECT_EQ(split(Regex(R"([\-\]]+)"), "a-]b"), (V{"<gap>a", "-]", "<gap>b"}));
  EXPECT_EQ(split(Regex(R"([一-龥]+)"), "ab\u4E2D\u6587c"), (V{"<gap>ab", "\u4E2D\u6587", "<gap>c"}));
  EXPECT_EQ(split(Regex(R"(\P{L}+)"), "ab12c"), (V{"<gap>ab", "12", "<gap>c"}));
  EXPECT_EQ(split(Regex(R"((?i:'s))"), "'s'S'\u017F'x"), (V{"'s", "'S", "'\u017F", "<gap>'x"}));
  EXPECT_EQ(split(Regex(R"((?:ab){1,3})"), "abababab"), (V{"ababab", "ab"}));
}

TEST(TokenizerRegex, RefusesUnsupportedConstructs) {
  for (const char* p : {R"(\d+)", R"(\w)", R"(^a)", R"(a$)", R"(\p{Lu})", R"(\p{Han})", R"(a++)",
                        R"((?<=a)b)", R"((?i)a)", R"([a)", R"(a{2,1})", R"(\1)", R"(*a)", R"(a))",
                        R"((?:ab)+)", R"(((((((((((((((((((((((((((((((((((a))))))))))))))))))))))))))))))))))"}) {
    try {
      Regex r(p);
      ADD_FAILURE() << "accepted " << p;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("unsupported"), std::string::npos) << e.what();
    }
  }
}
