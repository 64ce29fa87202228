// A tiny GLM-4.5-Air-shaped NVFP4 checkpoint with a tokenizer.json, for the tests of what takes
// or gives text (serve's OpenAI endpoints, generate --prompt).
#pragma once
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "model_fixture.h"

namespace tetra::test {

// The tiny model's weights (linked, made once per binary) plus tokenizer.json: the GLM-style test
// tokenizer, extended with <|system|>/<|assistant|> specials and plain added tokens up to the
// model's 512 ids, so every id the model can draw decodes to text.
inline std::filesystem::path tiny_model_with_tokenizer() {
  static TempDir root("tokenizer-model");
  static std::filesystem::path dir;
  if (!dir.empty()) return dir;
  const std::filesystem::path src = tiny_model("tiny-glm4.5-air", "nvfp4");
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

}  // namespace tetra::test
