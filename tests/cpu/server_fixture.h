// Shared pieces of the server tests: a tiny GLM-4.5-Air-shaped NVFP4 model with a 512-id
// tokenizer.json made from the GLM-style test tokenizer, and small HTTP/JSON helpers.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "model_fixture.h"
#include "server/http_client.h"

namespace tetra::test {

// The tiny model without a tokenizer (made once per binary).
inline std::filesystem::path server_model_plain() { return tiny_model("tiny-glm4.5-air", "nvfp4"); }

// The same weights plus tokenizer.json: the GLM-style test tokenizer, extended with
// <|system|>/<|assistant|> specials and plain added tokens up to the model's 512 ids, so every
// id the model can draw decodes to text.
inline std::filesystem::path server_model_with_tokenizer() {
  static TempDir root("server-model");
  static std::filesystem::path dir;
  if (!dir.empty()) return dir;
  const std::filesystem::path src = server_model_plain();
  dir = root.path() / "tiny-glm-chat";
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(src))
    std::filesystem::create_symlink(e.path(), dir / e.path().filename());
  std::ifstream in(std::filesystem::path(TETRA_TEST_DATA_DIR) / "tokenizers" / "glm4_style.json");
  nlohmann::json tok = nlohmann::json::parse(in);
  int next = 0;
  for (const auto& a : tok["added_tokens"]) next = std::max(next, a["id"].get<int>() + 1);
  auto add = [&](const std::string& content, bool special) {
    tok["added_tokens"].push_back({{"id", next++}, {"content", content}, {"single_word", false},
                                   {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                   {"special", special}});
  };
  add("<|system|>", true);
  add("<|assistant|>", true);
  while (next < 512) add("<w" + std::to_string(next) + ">", false);
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  return dir;
}

inline nlohmann::json parse_json(const std::string& s) {
  return nlohmann::json::parse(s, nullptr, false);
}

// POSTs JSON; returns the response.
inline server::HttpResponse post(int port, const std::string& path, const nlohmann::json& body) {
  return server::http_call("127.0.0.1", port, "POST", path, body.dump());
}

inline server::HttpResponse get(int port, const std::string& path) {
  return server::http_call("127.0.0.1", port, "GET", path);
}

// Prometheus text -> {"name{labels}": value}; fails the test on a line that does not parse.
inline std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    EXPECT_NE(sp, std::string::npos) << line;
    if (sp == std::string::npos) continue;
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(line.substr(sp + 1), &used);
    } catch (...) {
      used = 0;
    }
    EXPECT_EQ(used, line.size() - sp - 1) << "value does not parse: " << line;
    out[line.substr(0, sp)] = v;
  }
  return out;
}

// The SSE events of a streamed response body, "[DONE]" included.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> events;
  server::SseReader reader;
  reader.feed(body, [&](const std::string& d) { events.push_back(d); });
  return events;
}

}  // namespace tetra::test
