// A Hugging Face tokenizer.json as GLM, Qwen and DeepSeek ship it: byte-level BPE behind regex
// pre-tokenization, added and special tokens, an optional NFC/NFD normalizer, a template
// post-processor for BOS-style special tokens, and the byte-level decoder.
//
// Encode: split the text on added tokens (those with normalized=false on the raw text, then the
// others on the normalized text), normalize, pre-tokenize (Split regexes, ByteLevel), map each
// piece to the byte-level alphabet, BPE it; add the post-processor's special tokens.
// Decode: every token's bytes (byte-level tokens unmapped, other added tokens as their UTF-8),
// joined, invalid UTF-8 replaced by U+FFFD per maximal subpart (as the reference does).
// Anything else tokenizer.json can hold (WordPiece, Unigram, NFKC, Metaspace, ...) is refused
// when loading with an Error naming the file and the component.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tetra::tok {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

class Tokenizer {
 public:
  static Tokenizer from_file(const std::filesystem::path& path);
  // `label` names the source in errors.
  static Tokenizer from_json(const nlohmann::json& j, std::string_view label);
  static Tokenizer from_string(std::string_view json_text, std::string_view label);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Error when `text` is not valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // The raw bytes token `id` stands for (may be part of a UTF-8 sequence); Error when unknown.
  const std::string& token_bytes(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;  // vocab or added spelling
  bool is_special(int32_t id) const;
  int32_t vocab_size() const;  // one past the largest id
  const std::vector<AddedToken>& added_tokens() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tetra::tok
