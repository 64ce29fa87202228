// `tetra generate`: one prompt (token ids) through the engine. Streams the generated ids as
// they come, then a timing summary. Greedy unless --temperature > 0.
#include <cstdio>
#include <limits>
#include <memory>

#include "cli/commands.h"
#include "cli/token_ids.h"
#include "core/error.h"
#include "runtime/engine.h"

namespace tetra::cli {
namespace {

struct GenerateOptions {
  std::string model_dir, prompt_ids, stop_ids, backend = "auto", moe_backend = "auto";
  int max_new_tokens = 16;
  int tp = 1, ep = 1;  // tensor / expert parallel GPUs
  ops::SamplingParams sampling;
};

void run_generate(const GenerateOptions& o) {
  const std::vector<int32_t> prompt = parse_token_ids(o.prompt_ids, "--prompt-ids");
  const std::vector<int32_t> stop =
      o.stop_ids.empty() ? std::vector<int32_t>{} : parse_token_ids(o.stop_ids, "--stop-ids");
  if (o.max_new_tokens < 1) TETRA_FAIL("--max-new-tokens must be at least 1");
  runtime::EngineOptions eo;
  eo.backend = o.backend;
  eo.moe_backend = o.moe_backend;
  eo.tp = o.tp;
  eo.ep = o.ep;
  eo.max_batch = 1;
  const int64_t context = int64_t(prompt.size()) + o.max_new_tokens;
  if (context > std::numeric_limits<int>::max())
    TETRA_FAIL("the prompt (", prompt.size(), " tokens) + --max-new-tokens (", o.max_new_tokens,
               ") is beyond any context");
  eo.max_context = int(context);
  auto engine = runtime::Engine::load(o.model_dir, eo);
  const int64_t id = engine->add_request(prompt, o.sampling, o.max_new_tokens, stop);
  while (engine->has_work()) {
    for (const runtime::TokenEvent& ev : engine->step()) {
      std::printf("%d ", ev.token);
      std::fflush(stdout);
    }
  }
  const runtime::EngineStats& s = engine->stats();
  std::printf("\nfinish: %s, %zu tokens, backend %s\n",
              runtime::finish_reason_name(engine->request(id).finish),
              engine->request(id).output.size(), engine->backend_name().c_str());
  std::printf("prefill: %lld tokens in %.2f ms (%.1f tokens/s)\n", (long long)s.prefill_tokens,
              1e3 * s.prefill_seconds, s.prefill_tokens_per_s());
  std::printf("decode: %lld steps in %.2f ms (%.3f ms/token)\n", (long long)s.decode_steps,
              1e3 * s.decode_seconds, s.decode_ms_per_step());
}

}  // namespace

static void add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  o->sampling.temperature = 0.0f;
  CLI::App* cmd = app.add_subcommand("generate", "Generate tokens from a prompt of token ids");
  cmd->add_option("--model", o->model_dir, "checkpoint directory")->required();
  cmd->add_option("--prompt-ids", o->prompt_ids, "prompt token ids, comma-separated (e.g. 1,2,3)")
      ->required();
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--stop-ids", o->stop_ids, "token ids that end generation, comma-separated");
  cmd->add_option("--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", o->sampling.top_k, "0 = off");
  cmd->add_option("--top-p", o->sampling.top_p, "1 = off");
  cmd->add_option("--min-p", o->sampling.min_p, "0 = off");
  cmd->add_option("--seed", o->sampling.seed, "sampling seed (0: the engine's)");
  cmd->add_option("--repetition-penalty", o->sampling.repetition_penalty, "1 = off");
  cmd->add_option("--frequency-penalty", o->sampling.frequency_penalty, "0 = off");
  cmd->add_option("--presence-penalty", o->sampling.presence_penalty, "0 = off");
  cmd->add_option("--backend", o->backend, "cpu, cuda or auto (cuda when built and a GPU is present)")
      ->capture_default_str();
  cmd->add_option("--moe-backend", o->moe_backend, "MoE runner of the backend (auto, cpu, cuda-w4a16, ...)")
      ->capture_default_str();
  cmd->add_option("--tp", o->tp, "tensor parallel GPUs (heads and MLP widths split over them)")
      ->capture_default_str();
  cmd->add_option("--ep", o->ep, "expert parallel GPUs (routed experts split in blocks); the "
                  "model runs on max(tp, ep) GPUs")
      ->capture_default_str();
  cmd->callback([o] { run_generate(*o); });
}

static const CommandRegistration kRegistration{"generate", 50, &add_generate};

}  // namespace tetra::cli
