#include "tokenizer/bpe.h"

#include <limits>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace tetra::tok {
namespace {

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

}  // namespace

Bpe::Bpe(std::unordered_map<std::string, int32_t> vocab,
         const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
         std::string_view label)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    std::string sym;
    append_utf8(sym, byte_to_char(static_cast<unsigned char>(b)));
    const auto it = vocab_.find(sym);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
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

void Bpe::encode_word(std::string_view raw_bytes, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (const auto it = vocab_.find(bytes_to_byte_level(raw_bytes)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> sym;  // [symbols] current token ids
  sym.reserve(raw_bytes.size());
  for (char b : raw_bytes)
    if (const int32_t id = byte_id_[static_cast<unsigned char>(b)]; id >= 0) sym.push_back(id);
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
