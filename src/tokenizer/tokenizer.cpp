#include "tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace tetra::tok {
namespace {

using nlohmann::json;

// GPT-2's pattern, what a ByteLevel pre-tokenizer with use_regex splits with.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Normalization { None, NFC, NFD };
enum class SplitBehavior { Isolated, Removed, MergedWithPrevious, MergedWithNext };

struct SplitStep {
  std::unique_ptr<Regex> regex;  // a Regex pattern, or a String pattern escaped into one
  SplitBehavior behavior = SplitBehavior::Isolated;
};

// A template item: a special token's ids, or the sequence itself.
struct TemplateItem {
  bool sequence = false;
  std::vector<int32_t> ids;
};

std::string escape_literal(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\.^$|?*+()[]{}-").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

const json& member(const json& j, const char* key, std::string_view where) {
  if (!j.is_object() || !j.contains(key)) TETRA_FAIL(where, ": missing \"", key, "\"");
  return j.at(key);
}

std::string get_string(const json& j, const char* key, std::string_view where) {
  const json& v = member(j, key, where);
  if (!v.is_string()) TETRA_FAIL(where, ": \"", key, "\" must be a string");
  return v.get<std::string>();
}

bool get_bool(const json& j, const char* key, bool fallback, std::string_view where) {
  if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return fallback;
  if (!j.at(key).is_boolean()) TETRA_FAIL(where, ": \"", key, "\" must be true or false");
  return j.at(key).get<bool>();
}

// The largest token id taken: the decoder keeps tables indexed by id up to the largest one, so
// a file naming id 2^31 - 1 would otherwise ask for tens of GB (a fuzz finding). Real
// vocabularies stay far below (GLM-4.x ~151k, Gemma ~262k).
constexpr int64_t kMaxTokenId = (int64_t(1) << 22) - 1;

int32_t get_id(const json& v, std::string_view where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    TETRA_FAIL(where, ": token id must be a non-negative integer");
  if (v.get<int64_t>() > kMaxTokenId)
    TETRA_FAIL(where, ": token id ", v.get<int64_t>(), " is over ", kMaxTokenId,
               ", the largest id Tetra takes (its tables are indexed by id)");
  return static_cast<int32_t>(v.get<int64_t>());
}

bool is_word_char(char32_t c) {
  const Category cat = category(c);
  return cat == Category::Letter || cat == Category::Number || c == '_';
}

}  // namespace

struct Tokenizer::Impl {
  std::string label;
  Normalization normalization = Normalization::None;
  std::vector<SplitStep> pre;  // run in order on every piece
  std::unique_ptr<Bpe> bpe;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;  // id -> index in `added`
  std::vector<std::vector<size_t>> added_by_first_byte = std::vector<std::vector<size_t>>(256);  // [256] -> indices in `added`
  std::vector<std::string> bytes_of;               // [vocab_size] raw bytes per id
  std::vector<char> known;                         // [vocab_size] id has a token
  std::vector<TemplateItem> single;                // empty: no post-processing

  void parse_normalizer(const json& n, std::string_view where);
  void parse_pre_tokenizer(const json& p, std::string_view where, bool& byte_level);
  void parse_post_processor(const json& p, std::string_view where);
  void parse_decoder(const json& d, std::string_view where);

  std::string normalize(std::string_view s) const {
    if (normalization == Normalization::None) return std::string(s);
    const std::u32string u = utf8_to_u32(s, label);
    return u32_to_utf8(normalization == Normalization::NFC ? nfc(u) : nfd(u));
  }

  // Splits `text` on the added tokens whose `normalized` flag equals `normalized_stage`.
  // Pieces: {text, added index or -1}.
  void split_added(std::string_view text, bool normalized_stage,
                   std::vector<std::pair<std::string, int>>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::parse_normalizer(const json& n, std::string_view where) {
  if (n.is_null()) return;
  const std::string type = get_string(n, "type", where);
  if (type == "Sequence") {
    for (const json& sub : member(n, "normalizers", where)) parse_normalizer(sub, where);
  } else if (type == "NFC" || type == "NFD") {
    if (normalization != Normalization::None) TETRA_FAIL(where, ": more than one Unicode normalizer");
    normalization = type == "NFC" ? Normalization::NFC : Normalization::NFD;
  } else {
    TETRA_FAIL(where, ": normalizer '", type, "' is not supported (supported: NFC, NFD, Sequence)");
  }
}

void Tokenizer::Impl::parse_pre_tokenizer(const json& p, std::string_view where, bool& byte_level) {
  if (p.is_null()) return;
  const std::string type = get_string(p, "type", where);
  if (type == "Sequence") {
    for (const json& sub : member(p, "pretokenizers", where)) parse_pre_tokenizer(sub, where, byte_level);
  } else if (type == "Split") {
    if (get_bool(p, "invert", false, where)) TETRA_FAIL(where, ": Split with invert is not supported");
    const json& pat = member(p, "pattern", where);
    SplitStep step;
    if (pat.is_object() && pat.contains("Regex") && pat.at("Regex").is_string())
      step.regex = std::make_unique<Regex>(pat.at("Regex").get<std::string>());
    else if (pat.is_object() && pat.contains("String") && pat.at("String").is_string())
      step.regex = std::make_unique<Regex>(escape_literal(pat.at("String").get<std::string>()));
    else
      TETRA_FAIL(where, ": Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
    const std::string behavior = get_string(p, "behavior", where);
    if (behavior == "Isolated") step.behavior = SplitBehavior::Isolated;
    else if (behavior == "Removed") step.behavior = SplitBehavior::Removed;
    else if (behavior == "MergedWithPrevious") step.behavior = SplitBehavior::MergedWithPrevious;
    else if (behavior == "MergedWithNext") step.behavior = SplitBehavior::MergedWithNext;
    else TETRA_FAIL(where, ": Split behavior '", behavior, "' is not supported");
    pre.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    if (get_bool(p, "add_prefix_space", false, where))
      TETRA_FAIL(where, ": ByteLevel add_prefix_space is not supported (GLM/Qwen/DeepSeek leave it off)");
    if (get_bool(p, "use_regex", true, where)) pre.push_back({std::make_unique<Regex>(kGpt2Pattern), SplitBehavior::Isolated});
    byte_level = true;
  } else {
    TETRA_FAIL(where, ": pre-tokenizer '", type, "' is not supported (supported: Split, ByteLevel, Sequence)");
  }
}

void Tokenizer::Impl::parse_post_processor(const json& p, std::string_view where) {
  if (p.is_null()) return;
  const std::string type = get_string(p, "type", where);
  if (type == "ByteLevel") return;  // offsets only: ids unchanged
  if (type == "Sequence") {
    for (const json& sub : member(p, "processors", where)) parse_post_processor(sub, where);
    return;
  }
  if (type != "TemplateProcessing")
    TETRA_FAIL(where, ": post-processor '", type, "' is not supported (supported: TemplateProcessing, ByteLevel)");
  if (!single.empty()) TETRA_FAIL(where, ": more than one TemplateProcessing");
  const json& specials = p.contains("special_tokens") ? p.at("special_tokens") : json::object();
  bool has_sequence = false;
  for (const json& item : member(p, "single", where)) {
    TemplateItem t;
    if (item.contains("Sequence")) {
      t.sequence = true;
      has_sequence = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = get_string(item.at("SpecialToken"), "id", where);
      if (!specials.is_object() || !specials.contains(name))
        TETRA_FAIL(where, ": template special token '", name, "' is not in special_tokens");
      for (const json& id : member(specials.at(name), "ids", where)) t.ids.push_back(get_id(id, where));
    } else {
      TETRA_FAIL(where, ": template item must be Sequence or SpecialToken");
    }
    single.push_back(std::move(t));
  }
  if (!has_sequence) TETRA_FAIL(where, ": template 'single' has no Sequence item");
}

void Tokenizer::Impl::parse_decoder(const json& d, std::string_view where) {
  if (d.is_null()) TETRA_FAIL(where, ": a ByteLevel decoder is required");
  const std::string type = get_string(d, "type", where);
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& subs = member(d, "decoders", where);
    if (subs.empty()) TETRA_FAIL(where, ": a ByteLevel decoder is required");
    for (const json& sub : subs) parse_decoder(sub, where);
    return;
  }
  TETRA_FAIL(where, ": decoder '", type, "' is not supported (supported: ByteLevel)");
}

void Tokenizer::Impl::split_added(std::string_view text, bool normalized_stage,
                                  std::vector<std::pair<std::string, int>>& out) const {
  size_t plain_from = 0;
  size_t i = 0;
  auto boundary_ok = [&](size_t at_byte, bool before) {
    // single_word: the neighbouring character must not be a word character.
    if (before ? at_byte == 0 : at_byte >= text.size()) return true;
    size_t s = at_byte;
    if (before) {
      s = at_byte - 1;
      while (s > 0 && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
    }
    const size_t len = utf8_sequence_length(text, s);
    if (len == 0) return true;
    return !is_word_char(utf8_to_u32(text.substr(s, len))[0]);
  };
  while (i < text.size()) {
    int best = -1;
    size_t best_len = 0;
    for (size_t t : added_by_first_byte[static_cast<unsigned char>(text[i])]) {
      const AddedToken& a = added[t];
      if (a.normalized != normalized_stage || a.content.empty()) continue;
      if (a.content.size() <= best_len || text.compare(i, a.content.size(), a.content) != 0) continue;
      if (a.single_word && (!boundary_ok(i, true) || !boundary_ok(i + a.content.size(), false))) continue;
      best = int(t), best_len = a.content.size();
    }
    if (best < 0) {
      const size_t len = utf8_sequence_length(text, i);
      i += len ? len : 1;
      continue;
    }
    size_t start = i, end = i + best_len;
    const AddedToken& a = added[size_t(best)];
    // lstrip/rstrip: the token swallows the whitespace next to it.
    auto space_before = [&](size_t at) -> size_t {
      if (at <= plain_from) return 0;
      size_t s = at - 1;
      while (s > plain_from && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
      const size_t len = utf8_sequence_length(text, s);
      return len && is_white_space(utf8_to_u32(text.substr(s, len))[0]) ? at - s : 0;
    };
    if (a.lstrip)
      while (const size_t n = space_before(start)) start -= n;
    if (a.rstrip) {
      while (end < text.size()) {
        const size_t len = utf8_sequence_length(text, end);
        if (!len || !is_white_space(utf8_to_u32(text.substr(end, len))[0])) break;
        end += len;
      }
    }
    if (start > plain_from) out.push_back({std::string(text.substr(plain_from, start - plain_from)), -1});
    out.push_back({a.content, best});
    plain_from = i = end;
  }
  if (plain_from < text.size()) out.push_back({std::string(text.substr(plain_from)), -1});
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<std::string> pieces{std::string(text)};
  for (const SplitStep& step : pre) {
    std::vector<std::string> next;
    for (const std::string& piece : pieces) {
      const std::u32string u = utf8_to_u32(piece, label);
      size_t from = 0;
      std::string carry;  // MergedWithNext: a match waiting for the following gap
      auto emit = [&](std::u32string_view part) {
        if (!part.empty()) next.push_back(u32_to_utf8(part));
      };
      for (const auto& [b, e] : step.regex->find_all(u)) {
        const std::u32string_view gap(u.data() + from, b - from), hit(u.data() + b, e - b);
        switch (step.behavior) {
          case SplitBehavior::Isolated: emit(gap), emit(hit); break;
          case SplitBehavior::Removed: emit(gap); break;
          case SplitBehavior::MergedWithPrevious: {
            std::u32string joined(gap);
            joined += hit;
            emit(joined);
            break;
          }
          case SplitBehavior::MergedWithNext: {
            if (!gap.empty() || !carry.empty()) next.push_back(carry + u32_to_utf8(gap));
            carry = u32_to_utf8(hit);
            break;
          }
        }
        from = e;
      }
      const std::u32string_view tail(u.data() + from, u.size() - from);
      if (step.behavior == SplitBehavior::MergedWithNext) {
        if (!carry.empty() || !tail.empty()) next.push_back(carry + u32_to_utf8(tail));
      } else {
        emit(tail);
      }
    }
    pieces = std::move(next);
  }
  for (const std::string& piece : pieces) bpe->encode_word(piece, out);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) TETRA_FAIL("cannot open tokenizer file ", path.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return from_string(ss.str(), path.string());
}

Tokenizer Tokenizer::from_string(std::string_view text, std::string_view label) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    TETRA_FAIL(label, ": not valid JSON (", e.what(), ")");
  }
  return from_json(j, label);
}

Tokenizer Tokenizer::from_json(const json& j, std::string_view label) {
  auto impl = std::make_unique<Impl>();
  impl->label = std::string(label);
  const std::string where(label);
  if (!j.is_object()) TETRA_FAIL(where, ": the top level must be an object");
  try {
    const json& model = member(j, "model", where);
    const std::string mwhere = where + " model";
    if (model.contains("type") && get_string(model, "type", mwhere) != "BPE")
      TETRA_FAIL(mwhere, ": type '", model.at("type").get<std::string>(), "' is not supported (supported: BPE)");
    if (model.contains("dropout") && !model.at("dropout").is_null() &&
        !(model.at("dropout").is_number() && model.at("dropout").get<double>() == 0.0))
      TETRA_FAIL(mwhere, ": BPE dropout is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && !model.at(key).is_null() &&
          !(model.at(key).is_string() && model.at(key).get<std::string>().empty()))
        TETRA_FAIL(mwhere, ": ", key, " is not supported");
    if (get_bool(model, "byte_fallback", false, mwhere)) TETRA_FAIL(mwhere, ": byte_fallback is not supported");

    std::unordered_map<std::string, int32_t> vocab;
    const json& v = member(model, "vocab", mwhere);
    if (!v.is_object()) TETRA_FAIL(mwhere, ": vocab must be an object");
    int32_t max_id = -1;
    for (const auto& [tok, id] : v.items()) {
      const int32_t i = get_id(id, mwhere + " vocab");
      vocab.emplace(tok, i);
      max_id = std::max(max_id, i);
    }
    std::vector<std::pair<std::string, std::string>> merges;
    const json& m = member(model, "merges", mwhere);
    if (!m.is_array()) TETRA_FAIL(mwhere, ": merges must be an array");
    for (const json& e : m) {
      if (e.is_string()) {  // "a b"
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          TETRA_FAIL(mwhere, ": merge '", s, "' is not two tokens separated by one space");
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
        merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        TETRA_FAIL(mwhere, ": a merge must be \"a b\" or [\"a\", \"b\"]");
      }
    }
    impl->bpe = std::make_unique<Bpe>(std::move(vocab), merges, get_bool(model, "ignore_merges", false, mwhere), mwhere);

    // Hugging Face re-adds the listed tokens when loading: a token already in the vocabulary
    // keeps that id, a new one gets the next id after the vocabulary (its "id" is not read).
    // A file whose ids disagree would tokenize differently there, so it is refused.
    int32_t next_added = int32_t(impl->bpe->vocab().size());
    std::unordered_map<std::string, int32_t> added_ids;
    if (j.contains("added_tokens") && !j.at("added_tokens").is_null()) {
      const json& list = j.at("added_tokens");
      if (!list.is_array()) TETRA_FAIL(where, ": added_tokens must be an array");
      for (const json& a : list) {
        const std::string awhere = where + " added_tokens";
        AddedToken t;
        t.id = get_id(member(a, "id", awhere), awhere);
        t.content = get_string(a, "content", awhere);
        if (t.content.empty()) TETRA_FAIL(awhere, ": token ", t.id, " has empty content");
        utf8_to_u32(t.content, awhere);  // must be valid UTF-8
        t.single_word = get_bool(a, "single_word", false, awhere);
        t.lstrip = get_bool(a, "lstrip", false, awhere);
        t.rstrip = get_bool(a, "rstrip", false, awhere);
        t.normalized = get_bool(a, "normalized", false, awhere);
        t.special = get_bool(a, "special", false, awhere);
        int32_t expected;
        if (const auto in_vocab = impl->bpe->vocab().find(t.content); in_vocab != impl->bpe->vocab().end())
          expected = in_vocab->second;
        else if (const auto seen = added_ids.find(t.content); seen != added_ids.end())
          expected = seen->second;
        else
          expected = next_added++;
        added_ids.emplace(t.content, expected);
        if (t.id != expected)
          TETRA_FAIL(awhere, ": '", t.content, "' has id ", t.id, " but would get id ", expected,
                     " (added tokens not in the vocabulary must follow it in order)");
        if (impl->added_by_id.count(t.id)) TETRA_FAIL(awhere, ": id ", t.id, " listed twice");
        impl->added_by_id[t.id] = impl->added.size();
        impl->added_by_first_byte[static_cast<unsigned char>(t.content[0])].push_back(impl->added.size());
        max_id = std::max(max_id, t.id);
        impl->added.push_back(std::move(t));
      }
    }
    if (max_id < 0) TETRA_FAIL(where, ": the vocabulary is empty");
    impl->bytes_of.assign(size_t(max_id) + 1, {});
    impl->known.assign(size_t(max_id) + 1, 0);
    for (const auto& [tok, id] : impl->bpe->vocab()) {
      impl->bytes_of[size_t(id)] = byte_level_to_bytes(tok);
      impl->known[size_t(id)] = 1;
    }
    for (const AddedToken& a : impl->added) {
      impl->bytes_of[size_t(a.id)] = byte_level_to_bytes(a.content);
      impl->known[size_t(a.id)] = 1;
    }

    impl->parse_normalizer(j.value("normalizer", json()), where + " normalizer");
    bool byte_level = false;
    impl->parse_pre_tokenizer(j.value("pre_tokenizer", json()), where + " pre_tokenizer", byte_level);
    if (!byte_level) TETRA_FAIL(where, ": only byte-level BPE is supported (no ByteLevel pre-tokenizer)");
    impl->parse_post_processor(j.value("post_processor", json()), where + " post_processor");
    for (const TemplateItem& t : impl->single)
      for (int32_t id : t.ids)
        if (size_t(id) >= impl->known.size() || !impl->known[size_t(id)])
          TETRA_FAIL(where, " post_processor: special token id ", id, " is not in the vocabulary");
    impl->parse_decoder(j.value("decoder", json()), where + " decoder");
  } catch (const json::exception& e) {
    TETRA_FAIL(where, ": malformed tokenizer.json (", e.what(), ")");
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  utf8_to_u32(text, "text to encode");  // refuse invalid UTF-8 up front
  std::vector<int32_t> body;
  std::vector<std::pair<std::string, int>> raw, normed;
  im.split_added(text, false, raw);
  for (const auto& [piece, added] : raw) {
    if (added >= 0) {
      body.push_back(im.added[size_t(added)].id);
      continue;
    }
    normed.clear();
    im.split_added(im.normalize(piece), true, normed);
    for (const auto& [sub, sub_added] : normed) {
      if (sub_added >= 0) body.push_back(im.added[size_t(sub_added)].id);
      else im.encode_plain(sub, body);
    }
  }
  if (!add_special_tokens || im.single.empty()) return body;
  std::vector<int32_t> out;
  for (const TemplateItem& t : im.single) {
    if (t.sequence) out.insert(out.end(), body.begin(), body.end());
    else out.insert(out.end(), t.ids.begin(), t.ids.end());
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  return utf8_lossy(bytes);
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->known.size() || !impl_->known[size_t(id)])
    TETRA_FAIL(impl_->label, ": token id ", id, " is not in the vocabulary (size ", vocab_size(), ")");
  return impl_->bytes_of[size_t(id)];
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  const auto& v = impl_->bpe->vocab();
  if (const auto it = v.find(std::string(token)); it != v.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  const auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->known.size()); }

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

}  // namespace tetra::tok
