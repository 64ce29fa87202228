// Prefix caching in the paged KV cache's bookkeeping: registered full blocks found again by
// equal prefixes only (the whole chain, not just a block's own tokens), held by new sequences,
// kept while free and evicted least recently freed first (a sequence's tail before its head),
// a duplicate left unregistered, and nothing of it without prefix caching. A randomized run
// checks the reference counts and the free count against the tables after every operation.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/error.h"
#include "runtime/kv_cache.h"

namespace tetra::runtime {
namespace {

std::vector<int32_t> tokens(std::initializer_list<int32_t> t) { return t; }

// Writes `toks` as sequence seq (appended whole) and registers its full blocks.
void write(PagedKvCache& c, int64_t seq, const std::vector<int32_t>& toks) {
  c.add_sequence(seq);
  c.append(seq, int(toks.size()), nullptr);
  c.register_full_blocks(seq, [&](int i) { return toks[size_t(i)]; });
}

TEST(KvCachePrefix, FindsRegisteredBlocksByTheirWholePrefix) {
  PagedKvCache c(8, 4, true);
  const std::vector<int32_t> a = tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  write(c, 1, a);
  EXPECT_EQ(c.cached_blocks(), 2);  // two full blocks; the third holds 2 tokens
  EXPECT_EQ(c.find_prefix(a, 10).tokens, 8);
  EXPECT_EQ(c.find_prefix(a, 10).unheld, 0);  // still held by sequence 1
  EXPECT_EQ(c.find_prefix(a, 7).tokens, 4);   // at most 7 tokens: one block
  EXPECT_EQ(c.find_prefix(tokens({1, 2, 3, 4, 5, 6, 7, 0}), 8).tokens, 4);
  EXPECT_EQ(c.find_prefix(tokens({0, 2, 3, 4, 5, 6, 7, 8}), 8).tokens, 0);
  // Block 2's tokens after another block 1: not the cached block 2.
  write(c, 2, tokens({9, 9, 9, 9, 5, 6, 7, 8}));
  EXPECT_EQ(c.cached_blocks(), 4);
  EXPECT_EQ(c.find_prefix(tokens({9, 9, 9, 9, 5, 6, 7, 8}), 8).tokens, 8);
  EXPECT_EQ(c.find_prefix(tokens({1, 2, 3, 4, 5, 6, 7, 8}), 8).tokens, 8);
  EXPECT_NE(c.block_table(1)[1], c.block_table(2)[1]);
}

TEST(KvCachePrefix, FreedBlocksStayCachedAndAreHeldAgain) {
  PagedKvCache c(6, 4, true);
  const std::vector<int32_t> a = tokens({1, 2, 3, 4, 5, 6, 7, 8, 9});
  write(c, 1, a);
  const std::vector<int32_t> table = c.block_table(1);
  c.free_sequence(1);
  EXPECT_EQ(c.free_blocks(), 6);  // cached blocks count as free
  EXPECT_EQ(c.cached_blocks(), 2);
  const PrefixHit hit = c.find_prefix(a, 8);
  EXPECT_EQ(hit.tokens, 8);
  EXPECT_EQ(hit.unheld, 2);
  c.add_sequence_with_prefix(2, a, hit);
  EXPECT_EQ(c.seq_len(2), 8);
  EXPECT_EQ(c.block_table(2), (std::vector<int32_t>{table[0], table[1]}));
  EXPECT_EQ(c.ref_count(table[0]), 1);
  EXPECT_EQ(c.free_blocks(), 4);
  // A second holder of the same prefix takes no free block.
  const PrefixHit again = c.find_prefix(a, 8);
  EXPECT_EQ(again.unheld, 0);
  c.add_sequence_with_prefix(3, a, again);
  EXPECT_EQ(c.ref_count(table[1]), 2);
  EXPECT_EQ(c.free_blocks(), 4);
  // Appending after a full shared block takes a new block, no copy.
  std::vector<BlockCopy> copies;
  c.append(3, 1, &copies);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(c.block_table(3).size(), 3u);
}

TEST(KvCachePrefix, EvictsLeastRecentlyFreedTailFirst) {
  PagedKvCache c(4, 2, true);
  const std::vector<int32_t> a = tokens({1, 2, 3, 4}), b = tokens({5, 6, 7, 8});
  write(c, 1, a);
  write(c, 2, b);
  c.free_sequence(1);  // a's blocks: tail, then head, into the eviction order
  c.free_sequence(2);
  EXPECT_EQ(c.cached_blocks(), 4);
  c.add_sequence(3);
  c.append(3, 2, nullptr);  // one block: a's tail goes
  EXPECT_EQ(c.cached_blocks(), 3);
  EXPECT_EQ(c.find_prefix(a, 4).tokens, 2);
  EXPECT_EQ(c.find_prefix(b, 4).tokens, 4);
  c.append(3, 2, nullptr);  // a's head
  EXPECT_EQ(c.find_prefix(a, 4).tokens, 0);
  EXPECT_EQ(c.find_prefix(b, 4).tokens, 4);
  c.append(3, 3, nullptr);  // b's tail, then its head
  EXPECT_EQ(c.find_prefix(b, 4).tokens, 0);
  EXPECT_EQ(c.cached_blocks(), 0);
  EXPECT_THROW(c.append(3, 2, nullptr), Error);  // nothing left to evict
}

TEST(KvCachePrefix, DuplicateContentStaysUnregistered) {
  PagedKvCache c(8, 2, true);
  const std::vector<int32_t> a = tokens({1, 2, 3, 4});
  write(c, 1, a);
  write(c, 2, a);  // the same tokens prefilled again (both admitted before either registered)
  EXPECT_EQ(c.cached_blocks(), 2);
  c.free_sequence(2);  // its unregistered blocks go straight back to the free list
  EXPECT_EQ(c.cached_blocks(), 2);
  EXPECT_EQ(c.free_blocks(), 6);
  c.free_sequence(1);
  EXPECT_EQ(c.free_blocks(), 8);
  EXPECT_EQ(c.find_prefix(a, 4).tokens, 4);
}

TEST(KvCachePrefix, OffMeansNothingIsKept) {
  PagedKvCache c(4, 2);
  const std::vector<int32_t> a = tokens({1, 2, 3, 4});
  write(c, 1, a);
  EXPECT_EQ(c.cached_blocks(), 0);
  c.free_sequence(1);
  EXPECT_EQ(c.find_prefix(a, 4).tokens, 0);
  EXPECT_EQ(c.free_blocks(), 4);
}

TEST(KvCachePrefix, RandomOperationsReuseOnlyEqualContents) {
  constexpr int kBlocks = 24, kBlockSize = 3;
  PagedKvCache c(kBlocks, kBlockSize, true);
  std::mt19937 rng(17);
  std::map<int64_t, std::vector<int32_t>> seqs;  // what each live sequence holds, token by token
  // What each slot's KV stands for: its token's position and the whole prefix up to it (a
  // token's keys and values depend on every token before it, not only on its own).
  std::vector<uint64_t> device(kBlocks * kBlockSize, 0);
  auto kv_of = [](const std::vector<int32_t>& t, size_t i) {
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k <= i; ++k) h = (h ^ uint64_t(t[k] + 1)) * 1099511628211ull;
    return h;
  };
  int64_t next = 1, reused = 0;
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t;
    const int32_t family = int32_t(rng() % 3);  // a few shared prefixes
    for (int i = 0; i < n; ++i) t.push_back(i < 6 ? family * 10 + i : int32_t(rng() % 4));
    return t;
  };
  auto write_slots = [&](const std::vector<int64_t>& slots, const std::vector<int32_t>& t, size_t from) {
    for (size_t k = 0; k < slots.size(); ++k) device[size_t(slots[k])] = kv_of(t, from + k);
  };
  for (int op = 0; op < 4000; ++op) {
    const int kind = int(rng() % 4);
    if (kind == 0 || seqs.empty()) {  // admit, through the cache when it can
      std::vector<int32_t> t = random_tokens(1 + int(rng() % 10));
      const PrefixHit hit = c.find_prefix(t, int(t.size()) - 1);
      const int rest = int(t.size()) - hit.tokens;
      if (hit.unheld + (rest + kBlockSize - 1) / kBlockSize > c.free_blocks()) continue;
      const int64_t id = next++;
      c.add_sequence_with_prefix(id, t, hit);
      ASSERT_EQ(c.seq_len(id), hit.tokens);
      // The reused blocks hold exactly this sequence's first tokens.
      for (int i = 0; i < hit.tokens; ++i)
        ASSERT_EQ(device[size_t(c.block_table(id)[size_t(i / kBlockSize)] * kBlockSize + i % kBlockSize)], kv_of(t, size_t(i)))
            << "op " << op << " token " << i;
      reused += hit.tokens;
      write_slots(c.append(id, rest, nullptr), t, size_t(hit.tokens));
      c.register_full_blocks(id, [&](int i) { return t[size_t(i)]; });
      seqs[id] = t;
    } else if (kind == 1) {  // decode one token
      auto it = std::next(seqs.begin(), int64_t(rng() % seqs.size()));
      if (!c.can_append(it->first, 1)) continue;
      std::vector<BlockCopy> copies;
      const std::vector<int64_t> slot = c.append(it->first, 1, &copies);
      for (const BlockCopy& cp : copies)
        std::copy_n(device.begin() + cp.src * kBlockSize, kBlockSize, device.begin() + cp.dst * kBlockSize);
      it->second.push_back(int32_t(rng() % 4));
      write_slots(slot, it->second, it->second.size() - 1);
      c.register_full_blocks(it->first, [&](int i) { return it->second[size_t(i)]; });
    } else {  // free
      auto it = std::next(seqs.begin(), int64_t(rng() % seqs.size()));
      c.free_sequence(it->first);
      seqs.erase(it);
    }
    // Holders per block equal the tables; free = blocks nobody holds.
    std::vector<int> holders(kBlocks, 0);
    for (const auto& [id, t] : seqs) {
      ASSERT_EQ(c.seq_len(id), int(t.size()));
      for (int32_t b : c.block_table(id)) ++holders[size_t(b)];
    }
    int unheld = 0;
    for (int b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(c.ref_count(b), holders[size_t(b)]) << "block " << b << " op " << op;
      unheld += holders[size_t(b)] == 0;
    }
    ASSERT_EQ(c.free_blocks(), unheld) << "op " << op;
    ASSERT_LE(c.cached_blocks(), kBlocks);
  }
  EXPECT_GT(reused, 500);  // the run exercised reuse, not just fresh blocks
}

}  // namespace
}  // namespace tetra::runtime
