// Byte-pair encoding of one pre-tokenized word (already in the byte-level alphabet): start from
// single characters and repeatedly merge the adjacent pair with the lowest merge rank, the
// leftmost one on ties, until no listed pair remains.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tetra::tok {

class Bpe {
 public:
  // vocab: token (UTF-8) -> id. merges: pairs in rank order; both parts and their
  // concatenation must be in vocab (Error naming `label` and the merge otherwise).
  Bpe(std::unordered_map<std::string, int32_t> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges,
      std::string_view label);

  // Appends the ids of one pre-tokenized piece given as raw bytes (each byte is one symbol of
  // the byte-level alphabet). Bytes whose symbol is missing from the vocabulary are dropped
  // (byte-level vocabularies have all 256; Hugging Face drops missing ones too).
  void encode_word(std::string_view raw_bytes, std::vector<int32_t>& out) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge { int32_t rank, merged; };
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank, result
  bool ignore_merges_;
  int32_t byte_id_[256];  // [256] id of each byte's one-symbol token, -1 when missing
};

}  // namespace tetra::tok
