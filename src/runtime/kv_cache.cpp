#include "runtime/kv_cache.h"

#include "core/error.h"

namespace tetra::runtime {

PagedKvCache::PagedKvCache(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  TETRA_CHECK(num_blocks > 0 && block_size > 0, "kv cache: num_blocks=", num_blocks,
              " block_size=", block_size);
  refs_.assign(num_blocks, 0);
  free_.reserve(num_blocks);
  // Pushed in reverse so the first blocks handed out are 0, 1, 2, ... (easier to read in dumps).
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

const PagedKvCache::Sequence& PagedKvCache::get(int64_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) TETRA_FAIL("kv cache: unknown sequence ", seq);
  return it->second;
}

void PagedKvCache::add_sequence(int64_t seq) {
  if (!seqs_.emplace(seq, Sequence{}).second) TETRA_FAIL("kv cache: sequence ", seq, " exists");
}

int PagedKvCache::seq_len(int64_t seq) const { return get(seq).len; }

const std::vector<int32_t>& PagedKvCache::block_table(int64_t seq) const {
  return get(seq).blocks;
}

int PagedKvCache::blocks_needed(int64_t seq, int n) const {
  TETRA_CHECK(n >= 0, "kv cache: append of ", n, " tokens");
  const Sequence& s = get(seq);
  const int64_t have = int64_t(s.blocks.size()) * block_size_;
  int64_t need = (int64_t(s.len) + n - have + block_size_ - 1) / block_size_;
  if (need < 0) need = 0;
  // A partly filled last block held by someone else must be copied before we write into it.
  const bool writes_into_last = n > 0 && s.len % block_size_ != 0;
  if (writes_into_last && refs_[s.blocks.back()] > 1) ++need;
  return int(need);
}

int32_t PagedKvCache::take_block() {
  TETRA_CHECK(!free_.empty(), "kv cache: out of blocks");
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  return b;
}

void PagedKvCache::release_block(int32_t b) {
  TETRA_CHECK(refs_[b] > 0, "kv cache: block ", b, " released while free");
  if (--refs_[b] == 0) free_.push_back(b);
}

std::vector<int64_t> PagedKvCache::append(int64_t seq, int n, std::vector<BlockCopy>* copies) {
  const int need = blocks_needed(seq, n);
  if (need > free_blocks())
    TETRA_FAIL("kv cache: sequence ", seq, " needs ", need, " blocks for ", n, " tokens, ",
               free_blocks(), " free");
  Sequence& s = seqs_.at(seq);
  if (n > 0 && s.len % block_size_ != 0 && refs_[s.blocks.back()] > 1) {
    TETRA_CHECK(copies != nullptr, "kv cache: copy-on-write needs a copy list");
    const int32_t shared = s.blocks.back();
    const int32_t own = take_block();
    copies->push_back(BlockCopy{shared, own});
    release_block(shared);
    s.blocks.back() = own;
  }
  std::vector<int64_t> slots(n);  // [n]
  for (int i = 0; i < n; ++i, ++s.len) {
    if (s.len == int64_t(s.blocks.size()) * block_size_) s.blocks.push_back(take_block());
    slots[i] = int64_t(s.blocks[s.len / block_size_]) * block_size_ + s.len % block_size_;
  }
  return slots;
}

void PagedKvCache::fork(int64_t parent, int64_t child) {
  const Sequence copy = get(parent);
  if (!seqs_.emplace(child, copy).second) TETRA_FAIL("kv cache: sequence ", child, " exists");
  for (int32_t b : copy.blocks) ++refs_[b];
}

void PagedKvCache::free_sequence(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) TETRA_FAIL("kv cache: unknown sequence ", seq);
  for (int32_t b : it->second.blocks) release_block(b);
  seqs_.erase(it);
}

void PagedKvCache::fill_block_tables(const std::vector<int64_t>& seqs, int max_blocks_per_seq,
                                     int32_t* block_tables, int32_t* seq_lens) const {
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = get(seqs[i]);
    if (int(s.blocks.size()) > max_blocks_per_seq)
      TETRA_FAIL("kv cache: sequence ", seqs[i], " holds ", s.blocks.size(),
                 " blocks, block table width is ", max_blocks_per_seq);
    int32_t* row = block_tables + i * size_t(max_blocks_per_seq);
    for (int j = 0; j < max_blocks_per_seq; ++j) row[j] = j < int(s.blocks.size()) ? s.blocks[j] : -1;
    seq_lens[i] = s.len;
  }
}

int PagedKvCache::ref_count(int32_t block) const {
  TETRA_CHECK(block >= 0 && block < num_blocks_, "kv cache: block ", block);
  return refs_[block];
}

}  // namespace tetra::runtime
