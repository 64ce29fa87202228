// Stop strings over streamed text: text goes in piece by piece; what is safe to send comes out.
// The tail that could still be the start of a stop string is held back; when a stop string
// appears, everything before it is released and the rest (stop string included) dropped.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace tetra::server {

class StopStringMatcher {
 public:
  // keep_stop: the matched stop string is emitted too (vLLM's include_stop_str_in_output).
  explicit StopStringMatcher(std::vector<std::string> stops, bool keep_stop = false)
      : stops_(std::move(stops)), keep_stop_(keep_stop) {}
  // Adds text; returns the text now safe to emit. After a match, stopped() is true and further
  // pushes return nothing. Where stop strings match at the same place, the longest counts.
  std::string push(std::string_view text);
  // End of generation without a match: the held-back tail.
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  bool keep_stop_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace tetra::server
