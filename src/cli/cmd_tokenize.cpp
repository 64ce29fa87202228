// `tetra tokenize`: encode text to ids or decode ids to text with a tokenizer.json.
//   --text T              prints the ids, comma separated
//   --decode 1,2,3        prints the text
//   --batch-json F        F holds a JSON array of strings; prints a JSON array of id arrays
//   --decode-batch-json F F holds a JSON array of id arrays; prints a JSON array of strings
// Exit codes: 0 done; 1 bad input (unreadable or unsupported tokenizer, bad ids, invalid UTF-8);
//             CLI11's own codes (>= 100) for malformed command lines.
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace tetra::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer, text, decode, batch_json, decode_batch_json;
  bool has_text = false, no_special = false, skip_special = false;
};

std::vector<int32_t> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || v < 0 || v > INT32_MAX)
      TETRA_FAIL("--decode: '", item, "' is not a token id (expected e.g. 1,2,3)");
    ids.push_back(int32_t(v));
  }
  return ids;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) TETRA_FAIL("cannot open ", path);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    TETRA_FAIL(path, ": not valid JSON (", e.what(), ")");
  }
}

void run_tokenize(const TokenizeOptions& o) {
  const int modes = int(o.has_text) + int(!o.decode.empty()) + int(!o.batch_json.empty()) +
                    int(!o.decode_batch_json.empty());
  if (modes != 1) TETRA_FAIL("tetra tokenize needs exactly one of --text, --decode, --batch-json, --decode-batch-json");
  const tok::Tokenizer t = tok::Tokenizer::from_file(o.tokenizer);
  if (o.has_text) {
    const std::vector<int32_t> ids = t.encode(o.text, !o.no_special);
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
    std::cout << "\n";
  } else if (!o.decode.empty()) {
    std::cout << t.decode(parse_ids(o.decode), o.skip_special) << "\n";
  } else if (!o.batch_json.empty()) {
    const nlohmann::json in = read_json(o.batch_json);
    if (!in.is_array()) TETRA_FAIL(o.batch_json, ": expected a JSON array of strings");
    nlohmann::json out = nlohmann::json::array();
    for (const auto& s : in) {
      if (!s.is_string()) TETRA_FAIL(o.batch_json, ": expected a JSON array of strings");
      out.push_back(t.encode(s.get<std::string>(), !o.no_special));
    }
    std::cout << out.dump() << "\n";
  } else {
    const nlohmann::json in = read_json(o.decode_batch_json);
    if (!in.is_array()) TETRA_FAIL(o.decode_batch_json, ": expected a JSON array of id arrays");
    nlohmann::json out = nlohmann::json::array();
    for (const auto& row : in) {
      std::vector<int32_t> ids;
      if (!row.is_array()) TETRA_FAIL(o.decode_batch_json, ": expected a JSON array of id arrays");
      for (const auto& v : row) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
          TETRA_FAIL(o.decode_batch_json, ": ids must be non-negative integers");
        ids.push_back(int32_t(v.get<int64_t>()));
      }
      out.push_back(t.decode(ids, o.skip_special));
    }
    std::cout << out.dump() << "\n";
  }
}

}  // namespace

static void add_tokenize(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text to token ids or decode ids with a tokenizer.json");
  cmd->add_option("--tokenizer", opts->tokenizer, "tokenizer.json (Hugging Face format)")->required();
  cmd->add_option("--text", opts->text, "text to encode; prints ids, comma separated")
      ->each([opts](const std::string&) { opts->has_text = true; });
  cmd->add_option("--decode", opts->decode, "ids to decode, comma separated");
  cmd->add_option("--batch-json", opts->batch_json, "JSON array of strings to encode");
  cmd->add_option("--decode-batch-json", opts->decode_batch_json, "JSON array of id arrays to decode");
  cmd->add_flag("--no-special", opts->no_special, "do not add the post-processor's special tokens (BOS, ...)");
  cmd->add_flag("--skip-special-tokens", opts->skip_special, "leave special tokens out of decoded text");
  cmd->callback([opts] { run_tokenize(*opts); });
}

static const CommandRegistration kRegistration{"tokenize", 60, &add_tokenize};

}  // namespace tetra::cli
