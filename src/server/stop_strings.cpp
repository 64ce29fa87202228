#include "server/stop_strings.h"

#include <algorithm>

namespace tetra::server {

std::string StopStringMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  size_t first = std::string::npos, matched = 0;  // the earliest match, and its length
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at < first || (at == first && at != std::string::npos && s.size() > matched)) {
      first = at;
      matched = s.size();
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first + (keep_stop_ ? matched : 0));
    held_.clear();
    return out;
  }
  // Longest suffix of held_ that is a proper prefix of some stop string stays held. Stop strings
  // and text are valid UTF-8, so such a suffix starts on a character boundary.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace tetra::server
