// Paged KV cache bookkeeping: slot arithmetic, refusal without side effects when blocks run out,
// fork + copy-on-write, block tables for the kernels, and a randomized run that checks the
// reference counts against the tables after every step and that freeing everything leaks nothing.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "runtime/kv_cache.h"

namespace tetra::runtime {
namespace {

TEST(KvCache, SlotsFillBlocksInOrder) {
  PagedKvCache c(8, 4);
  c.add_sequence(7);
  std::vector<BlockCopy> copies;
  EXPECT_EQ(c.append(7, 6, &copies), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(c.block_table(7), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(c.append(7, 3, &copies), (std::vector<int64_t>{6, 7, 8}));  // block 2 begins at slot 8
  EXPECT_EQ(c.block_table(7), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(c.seq_len(7), 9);
  EXPECT_EQ(c.free_blocks(), 5);
  EXPECT_TRUE(copies.empty());
}

TEST(KvCache, TwoSequencesInterleaveBlocks) {
  PagedKvCache c(4, 2);
  c.add_sequence(1);
  c.add_sequence(2);
  EXPECT_EQ(c.append(1, 1, nullptr), (std::vector<int64_t>{0}));
  EXPECT_EQ(c.append(2, 3, nullptr), (std::vector<int64_t>{2, 3, 4}));  // blocks 1, 2
  EXPECT_EQ(c.append(1, 2, nullptr), (std::vector<int64_t>{1, 6}));     // rest of block 0, block 3
  EXPECT_EQ(c.free_blocks(), 0);
}

TEST(KvCache, RefusesWithoutChangingAnything) {
  PagedKvCache c(2, 4);
  c.add_sequence(1);
  c.append(1, 5, nullptr);
  EXPECT_FALSE(c.can_append(1, 4));
  EXPECT_TRUE(c.can_append(1, 3));
  EXPECT_THROW(c.append(1, 4, nullptr), Error);
  EXPECT_EQ(c.seq_len(1), 5);
  EXPECT_EQ(c.free_blocks(), 0);
  EXPECT_THROW(c.add_sequence(1), Error);
  EXPECT_THROW(c.append(99, 1, nullptr), Error);
}

TEST(KvCache, ForkSharesAndCopiesOnWrite) {
  PagedKvCache c(10, 4);
  c.add_sequence(1);
  c.append(1, 6, nullptr);  // blocks 0 (full), 1 (2 of 4)
  c.fork(1, 2);
  EXPECT_EQ(c.ref_count(0), 2);
  EXPECT_EQ(c.ref_count(1), 2);
  EXPECT_EQ(c.free_blocks(), 8);
  EXPECT_EQ(c.blocks_needed(2, 1), 1);  // the copy of the shared partial block
  std::vector<BlockCopy> copies;
  const auto slots = c.append(2, 1, &copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, 1);
  const int32_t own = copies[0].dst;
  EXPECT_EQ(c.block_table(2), (std::vector<int32_t>{0, own}));
  EXPECT_EQ(slots, (std::vector<int64_t>{int64_t(own) * 4 + 2}));
  EXPECT_EQ(c.block_table(1), (std::vector<int32_t>{0, 1}));  // parent untouched
  EXPECT_EQ(c.ref_count(1), 1);
  EXPECT_EQ(c.ref_count(0), 2);  // full blocks stay shared
  copies.clear();
  c.append(1, 1, &copies);  // the parent now owns block 1 alone: no copy
  EXPECT_TRUE(copies.empty());
  c.free_sequence(1);
  c.free_sequence(2);
  EXPECT_EQ(c.free_blocks(), 10);
}

TEST(KvCache, ForkAtABlockBoundaryNeedsNoCopy) {
  PagedKvCache c(6, 4);
  c.add_sequence(1);
  c.append(1, 8, nullptr);
  c.fork(1, 2);
  std::vector<BlockCopy> copies;
  EXPECT_EQ(c.append(2, 1, &copies), (std::vector<int64_t>{8}));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(c.block_table(2), (std::vector<int32_t>{0, 1, 2}));
}

TEST(KvCache, FillsBlockTablesForKernels) {
  PagedKvCache c(8, 2);
  c.add_sequence(5);
  c.add_sequence(6);
  c.append(5, 3, nullptr);
  c.append(6, 1, nullptr);
  std::vector<int32_t> tables(2 * 3, 77), lens(2, 77);
  c.fill_block_tables({6, 5}, 3, tables.data(), lens.data());
  EXPECT_EQ(tables, (std::vector<int32_t>{2, -1, -1, 0, 1, -1}));
  EXPECT_EQ(lens, (std::vector<int32_t>{1, 3}));
  EXPECT_THROW(c.fill_block_tables({5}, 1, tables.data(), lens.data()), Error);
}

TEST(KvCache, RandomizedOperationsKeepCountsAndLeakNothing) {
  std::mt19937 rng(11);
  const int kBlocks = 64, kBlockSize = 5;
  PagedKvCache c(kBlocks, kBlockSize);
  std::set<int64_t> live;
  std::map<int64_t, int> len;  // expected lengths, kept independently
  int64_t next_id = 0;
  for (int step = 0; step < 3000; ++step) {
    const int op = rng() % 10;
    if (op == 0 || live.empty()) {
      c.add_sequence(next_id);
      live.insert(next_id);
      len[next_id++] = 0;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      const int64_t s = *it;
      if (op == 1) {
        c.fork(s, next_id);
        live.insert(next_id);
        len[next_id++] = len[s];
      } else if (op == 2) {
        c.free_sequence(s);
        live.erase(s);
      } else {
        const int n = rng() % 12;
        std::vector<BlockCopy> copies;
        if (c.can_append(s, n)) {
          const int free_before = c.free_blocks(), need = c.blocks_needed(s, n);
          const auto slots = c.append(s, n, &copies);
          EXPECT_EQ(c.free_blocks(), free_before - need);
          ASSERT_EQ(int(slots.size()), n);
          for (int i = 0; i < n; ++i) {  // slot j lives in table[j / bs] at offset j % bs
            const int j = len[s] + i;
            EXPECT_EQ(slots[i], int64_t(c.block_table(s)[j / kBlockSize]) * kBlockSize + j % kBlockSize);
          }
          len[s] += n;
        } else {
          EXPECT_THROW(c.append(s, n, &copies), Error);
        }
      }
    }
    // Invariants: every holder counted, every block free xor held, lengths match.
    std::vector<int> holders(kBlocks, 0);
    for (int64_t s : live) {
      EXPECT_EQ(c.seq_len(s), len[s]);
      EXPECT_EQ(int(c.block_table(s).size()), (len[s] + kBlockSize - 1) / kBlockSize);
      for (int32_t b : c.block_table(s)) ++holders[b];
    }
    int held = 0;
    for (int b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(c.ref_count(b), holders[b]) << "block " << b << " at step " << step;
      held += holders[b] > 0;
    }
    ASSERT_EQ(held + c.free_blocks(), kBlocks) << "step " << step;
  }
  for (int64_t s : live) c.free_sequence(s);
  EXPECT_EQ(c.free_blocks(), kBlocks);
}

}  // namespace
}  // namespace tetra::runtime
