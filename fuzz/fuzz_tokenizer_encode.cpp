// libFuzzer entry: the input is text to encode with the four tokenizers of tests/data/tokenizers.
// Invalid UTF-8 must be refused with tetra::Error; valid text must encode to in-range ids, the
// byte-level tokenizer without normalizer or added tokens (gpt2_style) must decode back to the
// exact input, and streaming decode must equal decode for every tokenizer.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

#ifndef TETRA_FUZZ_TOKENIZER_DIR
#error "build with -DTETRA_FUZZ_TOKENIZER_DIR=\"<repo>/tests/data/tokenizers\""
#endif

namespace {

using tetra::tok::Tokenizer;

struct Loaded {
  std::vector<Tokenizer> all;  // gpt2_style first
  Loaded() {
    for (const char* name : {"gpt2_style", "qwen2_style", "glm4_style", "deepseek_v3_style"})
      all.push_back(Tokenizer::from_file(std::string(TETRA_FUZZ_TOKENIZER_DIR) + "/" + name + ".json"));
  }
};

[[noreturn]] void violated(const std::string& what) {
  std::fprintf(stderr, "tokenizer invariant violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Loaded tokenizers;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  bool valid = true;
  try {
    tetra::tok::utf8_to_u32(text);
  } catch (const tetra::Error&) {
    valid = false;
  }
  for (size_t k = 0; k < tokenizers.all.size(); ++k) {
    const Tokenizer& t = tokenizers.all[k];
    std::vector<int32_t> ids;
    try {
      ids = t.encode(text);
    } catch (const tetra::Error&) {
      if (valid) violated("valid UTF-8 refused");
      continue;
    }
    if (!valid) violated("invalid UTF-8 accepted");
    for (int32_t id : ids)
      if (id < 0 || id >= t.vocab_size()) violated("id out of range");
    const std::string whole = t.decode(ids);
    if (k == 0 && whole != text) violated("gpt2_style decode(encode(x)) != x");
    tetra::tok::StreamDecoder s(t);
    std::string joined;
    for (int32_t id : ids) {
      const std::string piece = s.push(id);
      try {
        tetra::tok::utf8_to_u32(piece);
      } catch (const tetra::Error&) {
        violated("streaming piece is not valid UTF-8");
      }
      joined += piece;
    }
    joined += s.finish();
    if (joined != whole) violated("streaming decode differs from decode");
  }
  return 0;
}
