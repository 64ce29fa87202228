#include "tokenizer/bpe.h"

#include <limits>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace tetra::tok {
namespace {

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

}  // namespace

Bpe::Bpe(std::unordered_map<std::string, int32_t> vocab,
         const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
         std::string_view label)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const auto ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end())
      TETRA_FAIL(label, ": merge ", r, " '", a, " ", b, "' uses a token missing from the vocab");
    // A pair listed twice keeps its first (lowest) rank.
    merges_.try_emplace(pair_key(ia->second, ib->second), Merge{int32_t(r), im->second});
  }
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (const auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> sym;  // [symbols] current token ids
  for (size_t i = 0; i < word.size();) {
    size_t len = utf8_sequence_length(word, i);
    if (len == 0) len = 1;  // cannot happen for byte-level text; never loop forever
    const auto it = vocab_.find(std::string(word.substr(i, len)));
    if (it != vocab_.end()) sym.push_back(it->second);
    i += len;
  }
  while (sym.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max(), best_id = -1;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      const auto it = merges_.find(pair_key(sym[i], sym[i + 1]));
      if (it != merges_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank, best_id = it->second.merged, best_at = i;
      }
    }
    if (best_id < 0) break;
    sym[best_at] = best_id;
    sym.erase(sym.begin() + std::ptrdiff_t(best_at) + 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

}  // namespace tetra::tok
