// The BPE merge loop against a plain quadratic reference written here (repeatedly merge the
// lowest-rank adjacent pair, leftmost on ties), on random words over a small alphabet whose
// merges overlap and chain (lengths 0-39 cover both the short-word loop and the heap); and a very
// long piece, which a quadratic loop could not finish.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tokenizer/bpe.h"

using namespace tetra::tok;

namespace {

struct Case {
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};

// Alphabet a, b, c (ASCII: byte-level symbols are the letters themselves).
Case make_case() {
  Case c;
  for (const char* s : {"a", "b", "c"}) c.vocab.emplace(s, int32_t(c.vocab.size()));
  c.merges = {{"a", "a"}, {"a", "b"}, {"aa", "a"}, {"b", "c"}, {"aa", "b"}, {"ab", "c"},
              {"c", "c"}, {"aaa", "bc"}, {"b", "b"}, {"aa", "aa"}, {"cc", "a"}};
  for (const auto& [x, y] : c.merges) c.vocab.emplace(x + y, int32_t(c.vocab.size()));
  return c;
}

std::vector<int32_t> reference(const Case& c, const std::string& word) {
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t r = 0; r < c.merges.size(); ++r) rank.emplace(c.merges[r], r);
  std::vector<std::string> parts;
  for (char ch : word) parts.emplace_back(1, ch);
  while (true) {
    size_t best = std::numeric_limits<size_t>::max(), at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = rank.find({parts[i], parts[i + 1]});
      if (it != rank.end() && it->second < best) best = it->second, at = i;
    }
    if (best == std::numeric_limits<size_t>::max()) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + long(at) + 1);
  }
  std::vector<int32_t> ids;
  for (const auto& p : parts) ids.push_back(c.vocab.at(p));
  return ids;
}

}  // namespace

TEST(TokenizerBpe, MatchesTheQuadraticReference) {
  const Case c = make_case();
  const Bpe bpe(c.vocab, c.merges, false, "test");
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string word(rng() % 40, 'a');
    for (char& ch : word) ch = "aaabbc"[rng() % 6];
    std::vector<int32_t> got;
    bpe.encode_word(word, got);
    ASSERT_EQ(got, reference(c, word)) << word;
  }
}

TEST(TokenizerBpe, IgnoreMergesTakesWholeWordsFromTheVocab) {
  Case c = make_case();
  c.vocab.emplace("abcab", 99);
  std::vector<int32_t> with, without;
  Bpe(c.vocab, c.merges, true, "test").encode_word("abcab", with);
  Bpe(c.vocab, c.merges, false, "test").encode_word("abcab", without);
  EXPECT_EQ(with, std::vector<int32_t>{99});
  EXPECT_EQ(without, reference(c, "abcab"));
}

TEST(TokenizerBpe, LongPieceFinishes) {
  const Case c = make_case();
  const Bpe bpe(c.vocab, c.merges, false, "test");
  // 400k letters: "aaaa" (merge aa+aa) tokens; quadratic merging would take hours.
  std::vector<int32_t> got;
  bpe.encode_word(std::string(400000, 'a'), got);
  ASSERT_EQ(got.size(), 100000u);
  for (int32_t id : got) ASSERT_EQ(id, c.vocab.at("aaaa"));
}
