// libFuzzer entry: the input is a tokenizer.json text. A finding is anything but a clean load or
// a tetra::Error: another exception, a sanitizer report, or a loaded tokenizer that breaks an
// invariant on a few short texts (refusing valid text, ids out of range, decode or streaming decode not valid UTF-8,
// streaming decode different from decode).
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

[[noreturn]] void violated(const std::string& what) {
  std::fprintf(stderr, "tokenizer invariant violated: %s\n", what.c_str());
  std::abort();
}

void check(const tetra::tok::Tokenizer& t) {
  // Short texts: a hostile pattern may backtrack exponentially in their length.
  for (std::string_view text : {"hello world", "a\n\n b!!", "\xC3\xA9 12", "<|x|>"}) {
    const std::vector<int32_t> ids = t.encode(text);  // valid UTF-8: must not be refused
    for (int32_t id : ids)
      if (id < 0 || id >= t.vocab_size()) violated("id out of range");
    const std::string whole = t.decode(ids);
    tetra::tok::utf8_to_u32(whole);  // throws (-> reported below) when not valid UTF-8
    tetra::tok::StreamDecoder s(t);
    std::string joined;
    for (int32_t id : ids) joined += s.push(id);
    joined += s.finish();
    if (joined != whole) violated("streaming decode differs from decode");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<tetra::tok::Tokenizer> t;
  try {
    t.emplace(tetra::tok::Tokenizer::from_string(text, "fuzz.json"));
  } catch (const tetra::Error&) {
    return 0;  // a clean refusal
  }
  try {
    check(*t);
  } catch (const tetra::Error& e) {
    violated(std::string("accepted tokenizer failed on plain text: ") + e.what());
  }
  return 0;
}
