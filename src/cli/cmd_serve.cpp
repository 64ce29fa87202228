// tetra serve: the OpenAI-compatible HTTP server (server/server.h) until SIGINT/SIGTERM.
// Without --model it serves the demo model (the one `tetra demo` caches).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "model/model_ops.h"
#include "server/demo_model.h"
#include "server/server.h"

namespace tetra::cli {
namespace {

struct ServeArgs {
  std::string model, host = "127.0.0.1", backend = "auto", name, cache_dir, profile_dir;
  std::string preset = "tiny-glm4.5-air";
  int port = 8000, max_running = 8, max_queued = 256, max_context = 2048;
  int max_prefill_tokens = 0, kv_blocks = 0, kv_block_size = 16, tp = 1, ep = 1;
  bool no_prefix_caching = false;
};

void run_serve(const ServeArgs& a) {
  // Block the stop signals in every thread (threads inherit the mask); sigwait takes them here.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  server::ServerOptions o;
  o.model_dir = a.model.empty() ? server::demo_model_dir(a.cache_dir, a.preset) : std::filesystem::path(a.model);
  o.served_model_name = a.name;
  o.engine.backend = model::resolve_model_ops_name(a.backend);
  o.engine.max_batch = a.max_running;
  o.engine.max_context = a.max_context;
  o.engine.max_prefill_tokens = a.max_prefill_tokens;
  o.engine.kv_num_blocks = a.kv_blocks;
  o.engine.kv_block_size = a.kv_block_size;
  o.engine.prefix_caching = !a.no_prefix_caching;
  o.engine.tp = a.tp;  // Model::load refuses tp/ep != 1 until the parallel model lands
  o.engine.ep = a.ep;
  if (!a.profile_dir.empty()) o.profile_dir = a.profile_dir;
  o.max_queued = a.max_queued;
  server::Server srv(o);
  const int port = srv.start(a.host, a.port);
  std::printf("tetra serve: model '%s' (%s backend, %s, chat format %s) listening on http://%s:%d\n",
              srv.model_name().c_str(), o.engine.backend.c_str(),
              srv.has_tokenizer() ? "tokenizer.json" : "no tokenizer: /generate only",
              std::string(server::chat_format_name(srv.chat_format())).c_str(), a.host.c_str(), port);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::printf("tetra serve: stopping (signal %d)\n", sig);
  srv.stop();
}

}  // namespace

static void add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, "
                                          "/generate, /metrics, profiling)");
  auto a = std::make_shared<ServeArgs>();
  cmd->add_option("--model", a->model, "checkpoint directory (default: the demo model)");
  cmd->add_option("--host", a->host, "address to bind")->capture_default_str();
  cmd->add_option("--port", a->port, "port (0: any free port, printed)")->capture_default_str();
  cmd->add_option("--backend", a->backend, "model backend: cpu, cuda, auto")->capture_default_str();
  cmd->add_option("--served-model-name", a->name, "model id in the API (default: directory name)");
  cmd->add_option("--max-running", a->max_running, "sequences decoded together")->capture_default_str();
  cmd->add_option("--max-queued", a->max_queued, "requests waiting beyond that (more get 429)")->capture_default_str();
  cmd->add_option("--max-context", a->max_context, "prompt + generated tokens per request")->capture_default_str();
  cmd->add_option("--max-prefill-tokens", a->max_prefill_tokens,
                  "tokens per prefill step; longer prompts are prefilled in chunks (0: max(max-context, 256))")
      ->capture_default_str();
  cmd->add_option("--kv-blocks", a->kv_blocks,
                  "KV cache blocks (0: max-running full contexts; fewer: requests are preempted and "
                  "recomputed when the pool runs out)")->capture_default_str();
  cmd->add_option("--kv-block-size", a->kv_block_size, "tokens per KV cache block")->capture_default_str();
  cmd->add_flag("--no-prefix-caching", a->no_prefix_caching,
                "prefill every prompt whole instead of reusing cached KV blocks of earlier equal prefixes");
  cmd->add_option("--tp", a->tp, "tensor parallel GPUs")->capture_default_str();
  cmd->add_option("--ep", a->ep, "expert parallel GPUs")->capture_default_str();
  cmd->add_option("--profile-dir", a->profile_dir,
                  "where /stop_profile writes its Chrome trace (default: the system temp directory)");
  cmd->add_option("--cache-dir", a->cache_dir, "demo model cache (default ~/.cache/tetra)");
  cmd->add_option("--preset", a->preset, "demo model preset when --model is not given")->capture_default_str();
  cmd->callback([a] { run_serve(*a); });
}

static const CommandRegistration kRegistration{"serve", 95, &add_serve};

}  // namespace tetra::cli
