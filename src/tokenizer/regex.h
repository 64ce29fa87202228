// A small backtracking regex matcher over code points for the pre-tokenizer patterns that
// GLM, Qwen and DeepSeek tokenizer.json files ship (std::regex has no Unicode classes).
// Constructs: literals, ., alternation, (?:...), (...) (not captured), (?i:...) (simple case
// folding), (?!...), (?=...), classes [...] / [^...] with ranges, \p{L} \p{M} \p{N} \p{P} \p{S}
// \p{Z} \p{C} and \P{..}, \s \S, \r \n \t \f \v and escaped punctuation; quantifiers ? * + {m}
// {m,} {m,n}, each optionally lazy (?). Semantics are leftmost-first with greedy backtracking,
// as Oniguruma (what Hugging Face tokenizers uses). Anything else is refused at construction
// with an Error naming the construct and its offset.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tetra::tok {

class Regex {
 public:
  explicit Regex(std::string_view pattern);  // UTF-8 pattern
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // The first match starting at or after `from`: [begin, end) in code points, or nullopt-like
  // {npos, npos}. Empty matches are skipped (none of the supported patterns needs them).
  std::pair<size_t, size_t> find(std::u32string_view text, size_t from) const;
  // Every non-overlapping match, left to right.
  std::vector<std::pair<size_t, size_t>> find_all(std::u32string_view text) const;
  const std::string& pattern() const { return pattern_; }

  struct Node;

 private:
  std::string pattern_;
  std::unique_ptr<Node> root_;
};

}  // namespace tetra::tok
