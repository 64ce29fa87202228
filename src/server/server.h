// `tetra serve`: the OpenAI-compatible HTTP API over one Engine.
//   GET  /health, /v1/models, /metrics (Prometheus text)
//   POST /v1/completions, /v1/chat/completions (SSE when "stream": true), /generate (token ids)
//   POST /tokenize, /detokenize (the served tokenizer)
//   POST /start_profile, /stop_profile (Chrome trace JSON, also written to profile_dir; engine
//        steps and requests, plus one event per GPU kernel on the cuda backend via CUPTI;
//        stop without start: 400; CUPTI missing on the cuda backend: 500 at start)
// Text endpoints need tokenizer.json in the model directory; without one they answer 400.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "runtime/engine.h"
#include "server/chat_format.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/profiler.h"
#include "server/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace tetra::server {

struct ServerOptions {
  std::filesystem::path model_dir;
  std::string served_model_name;  // empty: the model directory's name
  runtime::EngineOptions engine;  // max_batch = max running, max_context
  int max_queued = 256;
  size_t max_body_bytes = 4u << 20;
  std::filesystem::path profile_dir = std::filesystem::temp_directory_path();  // /stop_profile's trace file
};

class Server {
 public:
  // Loads the model (and tokenizer.json when present); tetra::Error on bad input.
  explicit Server(const ServerOptions& opt);
  ~Server();
  // Starts listening; returns the bound port (port 0: an ephemeral one).
  int start(const std::string& host, int port);
  void stop();
  const std::string& model_name() const { return model_name_; }
  bool has_tokenizer() const { return tokenizer_.has_value(); }
  ChatFormat chat_format() const { return chat_format_; }

 private:
  void handle(const HttpRequest& req, HttpConnection& conn);
  void handle_generation(Endpoint ep, const HttpRequest& req, HttpConnection& conn);
  void handle_tokenize(const HttpRequest& req, HttpConnection& conn, bool detokenize);

  ServerOptions opt_;
  std::string model_name_;
  std::optional<tok::Tokenizer> tokenizer_;
  std::vector<int32_t> eos_ids_;  // end-of-turn / end-of-text ids the text endpoints stop on
  ChatFormat chat_format_ = ChatFormat::Qwen;
  int64_t created_ = 0;  // unix seconds at load, for /v1/models
  Metrics metrics_;
  Profiler profiler_;
  CuptiKernelSource cupti_;  // per-kernel events on the cuda backend
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace tetra::server
