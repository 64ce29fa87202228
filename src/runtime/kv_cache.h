// Paged KV cache bookkeeping, host side: which device blocks each sequence owns.
// The device storage this indexes is, per layer, k_cache / v_cache
//   [num_blocks, block_size, n_kv_heads, head_dim] bf16;
// token j of a sequence lives in block table[j / block_size] at offset j % block_size, i.e. at
// slot table[j / block_size] * block_size + j % block_size (what the cache-write op takes).
// Blocks are reference counted so a fork (parallel sampling, beam search, prefix reuse) shares
// its parent's blocks; the first append into a shared, partly filled last block copies it
// (copy-on-write) and reports the copy for the caller to do on the device before writing.
// Prefix caching (when on): full blocks whose contents the caller has written are registered by
// their chain hash (block_hash.h); when no sequence holds one any more it stays cached, counted
// as free, until a take needs it (least recently freed first). A new sequence whose first tokens
// match cached full blocks starts holding them, so its prefill begins after them.
#pragma once
#include <cstdint>
#include <functional>
#include <list>
#include <unordered_map>
#include <vector>

#include "runtime/block_hash.h"

namespace tetra::runtime {

// Device work an append asks for: copy every layer's block `src` into block `dst`.
struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

// A cached prefix found for a sequence's tokens.
struct PrefixHit {
  int tokens = 0;  // tokens covered (whole blocks)
  int unheld = 0;  // of its blocks, those no sequence holds: taking the prefix uses that many free blocks
};

class PagedKvCache {
 public:
  PagedKvCache(int num_blocks, int block_size, bool prefix_caching = false);

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  // Blocks a take may use: never handed out, or cached with no holder (then evicted).
  int free_blocks() const { return int(free_.size() + evictable_.size()); }
  int cached_blocks() const { return int(by_hash_.size()); }  // registered, held or not

  bool has_sequence(int64_t seq) const { return seqs_.count(seq) != 0; }
  // Starts an empty sequence; an id already present is an error.
  void add_sequence(int64_t seq);
  // Tokens stored for seq.
  int seq_len(int64_t seq) const;
  // seq's blocks in token order: [ceil(seq_len / block_size)] block ids.
  const std::vector<int32_t>& block_table(int64_t seq) const;

  // New blocks an append of n tokens to seq would take from the free list (copy-on-write included).
  int blocks_needed(int64_t seq, int n) const;
  bool can_append(int64_t seq, int n) const { return blocks_needed(seq, n) <= free_blocks(); }

  // Reserves n more tokens at the end of seq and returns their slots [n] in token order. Any
  // copy-on-write is appended to *copies (which must then run before the new tokens are written).
  // Without enough free blocks it throws and changes nothing.
  std::vector<int64_t> append(int64_t seq, int n, std::vector<BlockCopy>* copies);

  // child (new id) starts as a copy of parent, sharing all of parent's blocks.
  void fork(int64_t parent, int64_t child);

  // Drops seq; blocks nobody else holds return to the free list (cached ones stay cached).
  void free_sequence(int64_t seq);

  // The longest run of cached full blocks that starts `tokens`, at most max_tokens tokens (0
  // without prefix caching).
  PrefixHit find_prefix(const std::vector<int32_t>& tokens, int max_tokens) const;
  // Starts seq (a new id) holding the blocks of `hit` (find_prefix of the same tokens, nothing
  // changed since): its length is hit.tokens.
  void add_sequence_with_prefix(int64_t seq, const std::vector<int32_t>& tokens, const PrefixHit& hit);
  // Registers seq's full blocks not registered yet, once their contents are written; token_at(i)
  // is seq's token i. A block whose prefix another block already caches stays unregistered.
  void register_full_blocks(int64_t seq, const std::function<int32_t(int)>& token_at);

  // For the attention kernels: block_tables [seqs.size(), max_blocks_per_seq] int32 (unused
  // entries -1) and seq_lens [seqs.size()] int32. A sequence needing more blocks is an error.
  void fill_block_tables(const std::vector<int64_t>& seqs, int max_blocks_per_seq,
                         int32_t* block_tables, int32_t* seq_lens) const;

  // Holders of a block (0 when free); for tests and leak checks.
  int ref_count(int32_t block) const;

 private:
  struct Sequence {
    int len = 0;
    std::vector<int32_t> blocks;     // [ceil(len / block_size)]
    std::vector<BlockHash> hashes;   // chain hashes of its first full blocks (registered or not)
  };
  const Sequence& get(int64_t seq) const;
  int32_t take_block();
  void release_block(int32_t b);
  // The cached block holding `tokens` [block_size] after the prefix hashed `parent`, or -1.
  int32_t cached_block(const BlockHash& parent, const int32_t* tokens, BlockHash* hash) const;

  int num_blocks_;
  int block_size_;
  bool prefix_caching_;
  std::vector<int32_t> free_;  // stack of free block ids (not cached)
  std::vector<int32_t> refs_;  // [num_blocks] holders per block
  std::unordered_map<int64_t, Sequence> seqs_;
  // Prefix caching: registered blocks by chain hash; their hash and tokens; those without a
  // holder, least recently freed first, with each one's place in that list.
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> by_hash_;
  std::vector<bool> registered_;         // [num_blocks]
  std::vector<BlockHash> hash_of_;       // [num_blocks]
  std::vector<int32_t> tokens_of_;       // [num_blocks, block_size]
  std::list<int32_t> evictable_;
  std::vector<std::list<int32_t>::iterator> evictable_at_;  // [num_blocks]
};

}  // namespace tetra::runtime
