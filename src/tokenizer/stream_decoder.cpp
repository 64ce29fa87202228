#include "tokenizer/stream_decoder.h"

#include "tokenizer/unicode.h"

namespace tetra::tok {

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.token_bytes(id);
  // Hold back a trailing proper prefix of a valid sequence; everything before it is final.
  size_t keep_from = pending_.size();
  for (size_t back = 1; back <= 3 && back <= pending_.size(); ++back) {
    const size_t at = pending_.size() - back;
    if (utf8_incomplete_prefix(pending_, at) == back) {
      keep_from = at;
      break;
    }
  }
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, keep_from));
  pending_.erase(0, keep_from);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace tetra::tok
