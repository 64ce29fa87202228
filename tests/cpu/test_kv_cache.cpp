// Paged KV cache bookkeeping: slot arithmetic, refusal without side effects when blocks run out,
// fork + copy-on-write, block tables for the kernels, and a randomized run that checks the
// reference counts against the tables after every step and that freeing everything leaks nothing.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "core/half.h"
#include "ops/attention/attention.h"
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

// The whole decode-side workflow on the CPU: prefill a prompt into the paged cache, fork it,
// let parent and child append different tokens (copy-on-write of the shared partial block done
// with copy_kv_blocks_cpu), then paged decode over each block table must equal plain causal
// attention over that sequence's own token list.
TEST(KvCache, ForkedSequencesDecodeTheirOwnHistory) {
  const int Hk = 2, Hq = 4, D = 16, bs = 4, num_blocks = 12;
  const ops::AttentionShape s{Hq, Hk, D, 0.25f, 0, 0};
  const int64_t row = int64_t(Hk) * D, block_elems = int64_t(bs) * row;
  std::vector<uint16_t> kc(num_blocks * block_elems, 0xffff), vc(kc.size(), 0xffff);  // NaN
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-1, 1);
  auto token_kv = [&](int n) {
    std::vector<uint16_t> x(n * row);
    for (auto& e : x) e = float_to_bf16(u(rng));
    return x;
  };
  PagedKvCache c(num_blocks, bs);
  std::vector<BlockCopy> copies;
  auto append = [&](int64_t seq, const std::vector<uint16_t>& k, const std::vector<uint16_t>& v) {
    const int n = int(k.size() / row);
    copies.clear();
    const auto slots = c.append(seq, n, &copies);
    for (const BlockCopy& cp : copies) {
      const int32_t pair[2] = {cp.src, cp.dst};
      ops::copy_kv_blocks_cpu(kc.data(), vc.data(), pair, 1, num_blocks, block_elems);
    }
    ops::write_kv_cache_cpu(k.data(), v.data(), slots.data(), n, s, num_blocks, bs, kc.data(), vc.data());
    return copies.size();
  };
  const auto pk = token_kv(6), pv = token_kv(6);  // prompt: 6 tokens, block 2 half full
  c.add_sequence(1);
  append(1, pk, pv);
  c.fork(1, 2);
  const auto ak = token_kv(3), av = token_kv(3), bk = token_kv(5), bv = token_kv(5);
  EXPECT_EQ(append(2, bk, bv), 1u);  // the child copies the shared partial block
  EXPECT_EQ(append(1, ak, av), 0u);  // the parent now owns it alone
  struct Want { int64_t seq; std::vector<uint16_t> k, v; };
  std::vector<Want> wants = {{1, pk, pv}, {2, pk, pv}};
  wants[0].k.insert(wants[0].k.end(), ak.begin(), ak.end());
  wants[0].v.insert(wants[0].v.end(), av.begin(), av.end());
  wants[1].k.insert(wants[1].k.end(), bk.begin(), bk.end());
  wants[1].v.insert(wants[1].v.end(), bv.begin(), bv.end());
  for (const Want& w : wants) {
    const int n = int(w.k.size() / row);
    std::vector<uint16_t> q(n * Hq * D);  // only the last query matters
    for (auto& e : q) e = float_to_bf16(u(rng));
    const std::vector<int32_t> cu = {0, n};
    std::vector<uint16_t> ref(q.size());
    ops::prefill_attention_cpu(q.data(), w.k.data(), w.v.data(), cu.data(), 1, s, ref.data());
    std::vector<int32_t> table(4), len(1);
    c.fill_block_tables({w.seq}, 4, table.data(), len.data());
    ASSERT_EQ(len[0], n);
    const ops::PagedKv kv{kc.data(), vc.data(), table.data(), len.data(), num_blocks, bs, 4};
    std::vector<uint16_t> out(Hq * D);
    ops::paged_decode_attention_cpu(q.data() + (n - 1) * Hq * D, kv, 1, s, out.data());
    for (int i = 0; i < Hq * D; ++i) ASSERT_EQ(out[i], ref[(n - 1) * Hq * D + i]) << "seq " << w.seq;
  }
  c.free_sequence(1);
  c.free_sequence(2);
  EXPECT_EQ(c.free_blocks(), num_blocks);
}

}  // namespace
}  // namespace tetra::runtime
