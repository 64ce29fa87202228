// Shared pieces of the server tests: a tiny GLM-4.5-Air-shaped NVFP4 model, with or without
// a tokenizer.json (tokenizer_fixture.h), and small HTTP/JSON helpers.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "model_fixture.h"
#include "tokenizer_fixture.h"
#include "server/http_client.h"

namespace tetra::test {

// The tiny model without a tokenizer (made once per binary).
inline std::filesystem::path server_model_plain() { return tiny_model("tiny-glm4.5-air", "nvfp4"); }

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
