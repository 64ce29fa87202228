#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "format/generation_config.h"

namespace tetra::server {

Server::Server(const ServerOptions& opt) : opt_(opt) {
  model_name_ = opt.served_model_name.empty() ? std::filesystem::absolute(opt.model_dir).filename().string()
                                              : opt.served_model_name;
  if (model_name_.empty()) model_name_ = "tetra";
  auto engine = runtime::Engine::load(opt.model_dir, opt.engine);
  const int64_t vocab = engine->config().vocab_size;
  chat_format_ = chat_format_for(engine->config().arch);
  if (std::filesystem::exists(opt.model_dir / "tokenizer.json")) {
    tokenizer_ = tok::Tokenizer::from_file(opt.model_dir / "tokenizer.json");
    if (tokenizer_->vocab_size() > vocab)
      TETRA_FAIL(opt.model_dir / "tokenizer.json", " has ids up to ", tokenizer_->vocab_size() - 1,
                 " but the model's vocabulary is ", vocab);
    for (const std::string& t : chat_end_tokens(chat_format_))
      if (auto id = tokenizer_->token_to_id(t)) eos_ids_.push_back(*id);
  }
  for (int32_t id : generation_config_eos_ids(opt.model_dir, vocab))
    if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  SchedulerOptions so;
  so.max_queued = opt.max_queued;
  scheduler_ = std::make_unique<Scheduler>(std::move(engine), so, metrics_, profiler_);
}

Server::~Server() { stop(); }

int Server::start(const std::string& host, int port) {
  HttpServerOptions ho;
  ho.max_body_bytes = opt_.max_body_bytes;
  http_ = std::make_unique<HttpServer>([this](const HttpRequest& r, HttpConnection& c) { handle(r, c); }, ho);
  return http_->start(host, port);
}

void Server::stop() {
  if (http_) http_->stop();
}

void Server::handle(const HttpRequest& req, HttpConnection& conn) {
  auto reply_error = [&](int status, const std::string& msg, const std::string& code = "") {
    metrics_.request_rejected(status);
    conn.respond(status, "application/json", error_json(status, msg, "", code));
  };
  const std::string& p = req.path;
  auto require = [&](const char* method) {
    if (req.method == method) return true;
    reply_error(405, str(p, " takes ", method, ", not ", req.method));
    return false;
  };
  if (p == "/health") {
    if (require("GET")) conn.respond(200, "application/json", R"({"status":"ok"})");
  } else if (p == "/v1/models") {
    if (!require("GET")) return;
    nlohmann::json m = {{"id", model_name_}, {"object", "model"}, {"created", created_}, {"owned_by", "tetra"},
                        {"max_model_len", scheduler_->max_context()}};
    conn.respond(200, "application/json", nlohmann::json({{"object", "list"}, {"data", {m}}}).dump());
  } else if (p == "/metrics") {
    if (require("GET")) conn.respond(200, "text/plain; version=0.0.4", metrics_.prometheus_text());
  } else if (p == "/start_profile") {
    if (!require("POST")) return;
    // Per-kernel GPU events on the cuda backend (CUPTI); the cpu backend has none to record.
    const bool gpu = scheduler_->backend_name() == "cuda";
    try {
      if (!profiler_.start(gpu ? &cupti_ : nullptr, str("the ", scheduler_->backend_name(), " backend runs no GPU kernels")))
        return reply_error(400, "a profile is already running; POST /stop_profile first");
    } catch (const Error& e) {
      return reply_error(500, str("cannot start the per-kernel profile: ", e.what()));
    }
    conn.respond(200, "application/json",
                 nlohmann::json({{"status", "profiling"}, {"gpu_kernels", gpu}}).dump());
  } else if (p == "/stop_profile") {
    if (!require("POST")) return;
    if (!profiler_.active()) return reply_error(400, "no profile is running; POST /start_profile first");
    // The trace is the response body and also a file (for runs driven by scripts).
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch()).count();
    const std::filesystem::path file = opt_.profile_dir / ("tetra-trace-" + std::to_string(ms) + ".json");
    std::ofstream f(file);
    const nlohmann::json other = f ? nlohmann::json{{"trace_file", file.string()}}
                                   : nlohmann::json{{"trace_file_error", str("cannot write ", file)}};
    std::string trace;
    if (!profiler_.stop(trace, other)) return reply_error(400, "no profile is running; POST /start_profile first");
    if (f) f << trace;
    conn.respond(200, "application/json", trace);
  } else if (p == "/v1/completions") {
    if (require("POST")) handle_generation(Endpoint::Completions, req, conn);
  } else if (p == "/v1/chat/completions") {
    if (require("POST")) handle_generation(Endpoint::Chat, req, conn);
  } else if (p == "/generate") {
    if (require("POST")) handle_generation(Endpoint::Generate, req, conn);
  } else if (p == "/tokenize" || p == "/detokenize") {
    if (require("POST")) handle_tokenize(req, conn, p == "/detokenize");
  } else {
    reply_error(404, str("no route ", p));
  }
}

}  // namespace tetra::server
