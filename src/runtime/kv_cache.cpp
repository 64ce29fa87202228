#include "runtime/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace tetra::runtime {

PagedKvCache::PagedKvCache(int num_blocks, int block_size, bool prefix_caching)
    : num_blocks_(num_blocks), block_size_(block_size), prefix_caching_(prefix_caching) {
  TETRA_CHECK(num_blocks > 0 && block_size > 0, "kv cache: num_blocks=", num_blocks,
              " block_size=", block_size);
  refs_.assign(num_blocks, 0);
  if (prefix_caching) {
    registered_.assign(size_t(num_blocks), false);
    hash_of_.resize(size_t(num_blocks));
    tokens_of_.resize(size_t(num_blocks) * size_t(block_size));
    evictable_at_.resize(size_t(num_blocks));
  }
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
  int32_t b = 0;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    // The least recently freed cached block: forgotten, then reused.
    TETRA_CHECK(!evictable_.empty(), "kv cache: out of blocks");
    b = evictable_.front();
    evictable_.pop_front();
    by_hash_.erase(hash_of_[size_t(b)]);
    registered_[size_t(b)] = false;
  }
  refs_[b] = 1;
  return b;
}

void PagedKvCache::release_block(int32_t b) {
  TETRA_CHECK(refs_[b] > 0, "kv cache: block ", b, " released while free");
  if (--refs_[b] > 0) return;
  if (prefix_caching_ && registered_[size_t(b)])
    evictable_at_[size_t(b)] = evictable_.insert(evictable_.end(), b);
  else
    free_.push_back(b);
}

int32_t PagedKvCache::cached_block(const BlockHash& parent, const int32_t* tokens, BlockHash* hash) const {
  *hash = chain_hash(parent, tokens, block_size_);
  const auto it = by_hash_.find(*hash);
  if (it == by_hash_.end()) return -1;
  const int32_t* held = tokens_of_.data() + size_t(it->second) * size_t(block_size_);
  return std::equal(tokens, tokens + block_size_, held) ? it->second : -1;
}

PrefixHit PagedKvCache::find_prefix(const std::vector<int32_t>& tokens, int max_tokens) const {
  PrefixHit hit;
  if (!prefix_caching_) return hit;
  BlockHash parent, h;
  for (int start = 0; start + block_size_ <= std::min<int>(max_tokens, int(tokens.size())); start += block_size_) {
    const int32_t b = cached_block(parent, tokens.data() + start, &h);
    if (b < 0) break;
    hit.tokens += block_size_;
    hit.unheld += refs_[b] == 0;
    parent = h;
  }
  return hit;
}

void PagedKvCache::add_sequence_with_prefix(int64_t seq, const std::vector<int32_t>& tokens,
                                            const PrefixHit& hit) {
  add_sequence(seq);
  Sequence& s = seqs_.at(seq);
  BlockHash parent, h;
  for (int start = 0; start < hit.tokens; start += block_size_) {
    const int32_t b = cached_block(parent, tokens.data() + start, &h);
    TETRA_CHECK(b >= 0, "kv cache: prefix block at token ", start, " is no longer cached");
    if (refs_[b]++ == 0) evictable_.erase(evictable_at_[size_t(b)]);
    s.blocks.push_back(b);
    s.hashes.push_back(h);
    s.len += block_size_;
    parent = h;
  }
}

void PagedKvCache::register_full_blocks(int64_t seq, const std::function<int32_t(int)>& token_at) {
  if (!prefix_caching_) return;
  Sequence& s = seqs_.at(seq);
  std::vector<int32_t> tokens(static_cast<size_t>(block_size_));  // [block_size]
  while (int(s.hashes.size() + 1) * block_size_ <= s.len) {
    const int i = int(s.hashes.size());
    for (int k = 0; k < block_size_; ++k) tokens[size_t(k)] = token_at(i * block_size_ + k);
    const BlockHash h = chain_hash(i ? s.hashes.back() : BlockHash{}, tokens.data(), block_size_);
    s.hashes.push_back(h);
    const int32_t b = s.blocks[size_t(i)];
    if (registered_[size_t(b)] || by_hash_.count(h)) continue;  // already cached (here or elsewhere)
    by_hash_.emplace(h, b);
    registered_[size_t(b)] = true;
    hash_of_[size_t(b)] = h;
    std::copy(tokens.begin(), tokens.end(), tokens_of_.begin() + int64_t(b) * block_size_);
  }
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
  // Last block first: cached blocks are evicted least recently freed first, so a prefix's tail
  // goes before its head, which more sequences share.
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) release_block(*b);
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
