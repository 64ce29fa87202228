#include "tokenizer/bpe.h"

#include <cstdint>
#include <queue>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/unicode.h"

namespace tetra::tok {
namespace {

// Pieces up to this many symbols take the simple quadratic loop; longer ones the heap.
constexpr int kShortWord = 16;

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
  std::vector<int32_t> sym;  // [symbols] current token ids; merged-away slots are left behind
  sym.reserve(raw_bytes.size());
  for (char b : raw_bytes)
    if (const int32_t id = byte_id_[static_cast<unsigned char>(b)]; id >= 0) sym.push_back(id);
  const int n = int(sym.size());
  if (n < 2) {
    out.insert(out.end(), sym.begin(), sym.end());
    return;
  }
  if (n <= kShortWord) {
    // Most pieces are a few symbols: rescanning every pair per merge beats building a heap.
    while (sym.size() > 1) {
      int32_t best_rank = INT32_MAX, best_id = -1;
      size_t best_at = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        const auto it = merges_.find(pair_key(sym[i], sym[i + 1]));
        if (it != merges_.end() && it->second.rank < best_rank)
          best_rank = it->second.rank, best_id = it->second.merged, best_at = i;
      }
      if (best_id < 0) break;
      sym[best_at] = best_id;
      sym.erase(sym.begin() + std::ptrdiff_t(best_at) + 1);
    }
    out.insert(out.end(), sym.begin(), sym.end());
    return;
  }
  // A doubly linked list over the symbols and a min-heap of candidate pairs ordered by (rank,
  // position): O(n log n), so one huge piece (a long run of letters) cannot stall encoding.
  // Heap entries go stale when a neighbour merges; they carry the ids they were made from and
  // are skipped when those no longer hold.
  std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));  // [n] neighbours, -1 / n at the ends
  for (int i = 0; i < n; ++i) prev[size_t(i)] = i - 1, next[size_t(i)] = i + 1;
  struct Candidate {
    int32_t rank;
    int left, right;
    int32_t left_id, right_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int left, int right) {
    if (left < 0 || right >= n) return;
    const auto it = merges_.find(pair_key(sym[size_t(left)], sym[size_t(right)]));
    if (it != merges_.end()) heap.push({it->second.rank, left, right, sym[size_t(left)], sym[size_t(right)]});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i, i + 1);
  std::vector<char> alive(static_cast<size_t>(n), 1);  // [n]
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const size_t l = size_t(c.left), r = size_t(c.right);
    if (!alive[l] || !alive[r] || next[l] != c.right || sym[l] != c.left_id || sym[r] != c.right_id) continue;
    sym[l] = merges_.at(pair_key(c.left_id, c.right_id)).merged;
    alive[r] = 0;
    next[l] = next[r];
    if (next[r] < n) prev[size_t(next[r])] = c.left;
    consider(prev[l], c.left);
    consider(c.left, next[l]);
  }
  for (int i = 0; i < n; i = next[size_t(i)]) out.push_back(sym[size_t(i)]);
}

}  // namespace tetra::tok
