#include "tokenizer/unicode.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "tokenizer/unicode_tables.h"

namespace tetra::tok {
namespace {

// Hangul syllables compose and decompose by arithmetic (Unicode 15, section 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

template <typename Range>
const Range* find_range(const Range* table, size_t n, char32_t cp) {
  const Range* end = table + n;
  const Range* it = std::upper_bound(table, end, cp, [](char32_t c, const Range& r) { return c < r.first; });
  if (it == table) return nullptr;
  --it;
  return cp <= it->last ? it : nullptr;
}

// Bytes a lead byte needs in all, and the allowed range of the second byte (Unicode Table 3-7).
bool lead_info(unsigned char b, size_t& len, unsigned char& lo, unsigned char& hi) {
  lo = 0x80, hi = 0xBF;
  if (b < 0x80) return len = 1, true;
  if (b >= 0xC2 && b <= 0xDF) return len = 2, true;
  if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // no surrogates
    return true;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
    return true;
  }
  return false;
}

// How many bytes from s[i] follow the pattern of a valid sequence (at most its length).
size_t matching_bytes(std::string_view s, size_t i, size_t& len) {
  unsigned char lo, hi;
  if (!lead_info(static_cast<unsigned char>(s[i]), len, lo, hi)) return 0;
  size_t n = 1;
  while (n < len && i + n < s.size()) {
    const auto b = static_cast<unsigned char>(s[i + n]);
    const unsigned char l = n == 1 ? lo : 0x80, h = n == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
    ++n;
  }
  return n;
}

char32_t decode_at(std::string_view s, size_t i, size_t len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (len == 1) return b0;
  char32_t cp = b0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

void decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* end = kDecompositions + kDecompositionCount;
  const Decomposition* it = std::lower_bound(kDecompositions, end, cp,
                                             [](const Decomposition& d, char32_t c) { return d.cp < c; });
  if (it == end || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);  // decompositions nest (e.g. U+1E69 -> U+1E63 + dot -> s + dots)
  if (it->second) decompose(it->second, out);
}

char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const Composition* end = kCompositions + kCompositionCount;
  const Composition* it = std::lower_bound(kCompositions, end, std::pair{a, b}, [](const Composition& c, auto key) {
    return c.first != key.first ? c.first < key.first : c.second < key.second;
  });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

namespace {

Category category_slow(char32_t cp) {
  const CategoryRange* r = find_range(kCategoryRanges, kCategoryRangeCount, cp);
  return r ? static_cast<Category>(r->group) : Category::Other;
}

// The Basic Multilingual Plane, where nearly all text lives, looked up in O(1): [65536] entries
// of category (low 3 bits), White_Space (bit 3), nonzero combining class (bit 4).
struct BmpTable {
  std::vector<unsigned char> bits;
  BmpTable() : bits(0x10000) {
    for (char32_t cp = 0; cp < 0x10000; ++cp) {
      unsigned char b = static_cast<unsigned char>(category_slow(cp));
      if (find_range(kWhiteSpace, kWhiteSpaceCount, cp)) b |= 8;
      if (find_range(kCombiningRanges, kCombiningRangeCount, cp)) b |= 16;
      bits[cp] = b;
    }
  }
};

const BmpTable& bmp() {
  static const BmpTable t;
  return t;
}

// The smallest second member of any composition pair: nothing below it can compose with its
// predecessor, so the pair search is skipped for it.
char32_t min_composition_second() {
  static const char32_t v = [] {
    char32_t m = kVBase;  // Hangul V jamo compose too
    for (size_t i = 0; i < kCompositionCount; ++i) m = std::min(m, kCompositions[i].second);
    return m;
  }();
  return v;
}

}  // namespace

Category category(char32_t cp) {
  if (cp < 0x10000) return static_cast<Category>(bmp().bits[cp] & 7);
  return category_slow(cp);
}

bool is_white_space(char32_t cp) {
  if (cp < 0x10000) return (bmp().bits[cp] & 8) != 0;
  return find_range(kWhiteSpace, kWhiteSpaceCount, cp) != nullptr;
}

int combining_class(char32_t cp) {
  if (cp < 0x10000 && !(bmp().bits[cp] & 16)) return 0;
  const CombiningRange* r = find_range(kCombiningRanges, kCombiningRangeCount, cp);
  return r ? r->ccc : 0;
}

size_t utf8_sequence_length(std::string_view s, size_t i) {
  size_t len = 0;
  const size_t n = matching_bytes(s, i, len);
  return n == len && n > 0 ? len : 0;
}

size_t utf8_incomplete_prefix(std::string_view s, size_t i) {
  size_t len = 0;
  const size_t n = matching_bytes(s, i, len);
  return n > 0 && n < len && i + n == s.size() ? n : 0;
}

std::u32string utf8_to_u32(std::string_view s, std::string_view what) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) TETRA_FAIL(what, ": invalid UTF-8 at byte ", i);
    out.push_back(decode_at(s, i, len));
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string u32_to_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) append_utf8(out, cp);
  return out;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const size_t n = matching_bytes(s, i, len);
    if (n > 0 && n == len) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD for the maximal subpart (at least one byte)
      i += std::max<size_t>(n, 1);
    }
  }
  return out;
}

std::u32string nfd(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t cp : s) {
    if (cp < 0xC0) out.push_back(cp);  // Basic Latin and Latin-1 symbols never decompose
    else decompose(cp, out);
  }
  // Canonical ordering: stable-sort each run of non-starters by combining class.
  for (size_t i = 0; i < out.size();) {
    if (combining_class(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && combining_class(out[j]) != 0) ++j;
    std::stable_sort(out.begin() + i, out.begin() + j,
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  return out;
}

std::u32string nfc(std::u32string_view s) {
  const std::u32string d = nfd(s);
  std::u32string out;
  out.reserve(d.size());
  size_t starter = std::u32string::npos;  // index in out of the last starter
  for (char32_t c : d) {
    const int cc = combining_class(c);
    if (starter != std::u32string::npos && c >= min_composition_second()) {
      const bool adjacent = starter + 1 == out.size();
      // Blocked when a character in between has a class >= this one (or is a starter).
      const bool blocked = !adjacent && combining_class(out.back()) >= cc;
      if (!blocked) {
        if (const char32_t comp = compose_pair(out[starter], c)) {
          out[starter] = comp;
          continue;
        }
      }
    }
    if (cc == 0) starter = out.size();
    out.push_back(c);
  }
  return out;
}

}  // namespace tetra::tok
