// Streaming detokenization: text for each new token as soon as it is whole. Bytes that could
// still become a valid UTF-8 character are held back until the next token completes them;
// bytes that can never be valid become U+FFFD at once. What push() and finish() return, joined,
// equals Tokenizer::decode of all the ids, and every piece is valid UTF-8 on its own.
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace tetra::tok {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tok_(tokenizer), skip_special_(skip_special_tokens) {}
  std::string push(int32_t id);  // Error for an unknown id
  std::string finish();          // the held bytes as U+FFFD (empty when none)
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;  // at most 3 bytes: the start of an unfinished character
};

}  // namespace tetra::tok
