// `tetra generate`: one prompt through the engine, given as text (--prompt, encoded with the
// checkpoint's tokenizer.json) or as token ids (--prompt-ids). Streams what it generates as it
// comes, as text or as ids (--output; by default the prompt's form), then a timing summary.
// Greedy unless --temperature > 0.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/token_ids.h"
#include "core/error.h"
#include "format/generation_config.h"
#include "runtime/engine.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace tetra::cli {
namespace {

struct GenerateOptions {
  std::string model_dir, prompt_text, prompt_ids, stop_ids, backend = "auto", moe_backend = "auto";
  std::string output = "auto";  // auto (the prompt's form), text or ids
  bool has_prompt_text = false;  // --prompt "" counts as given
  bool ignore_eos = false;       // do not stop at generation_config.json's eos_token_id
  int max_new_tokens = 16;
  int tp = 1, ep = 1;  // tensor / expert parallel GPUs
  ops::SamplingParams sampling;
};

// The checkpoint's tokenizer; when it is missing, the error names the flag that needs it and
// what to do instead.
tok::Tokenizer model_tokenizer(const std::filesystem::path& dir, const char* need,
                               const char* instead) {
  const std::filesystem::path file = dir / "tokenizer.json";
  if (!std::filesystem::exists(file))
    TETRA_FAIL(need, " needs the checkpoint's tokenizer, and ", file.string(), " does not exist; ",
               instead);
  return tok::Tokenizer::from_file(file);
}

// Prints each generated token as it comes: its id, or its text once the text is whole.
class TokenPrinter {
 public:
  explicit TokenPrinter(const tok::Tokenizer* text) {
    if (text) decoder_.emplace(*text, /*skip_special_tokens=*/true);  // as vLLM and `serve` do
  }
  void token(int32_t id) {
    if (!decoder_) {
      std::printf("%d ", id);
    } else {
      try {
        std::fputs(decoder_->push(id).c_str(), stdout);
      } catch (const Error&) {
        // An id the tokenizer lacks (vocabularies are padded past the tokenizer): no text.
      }
    }
    std::fflush(stdout);
  }
  void finish() {
    if (decoder_) std::fputs(decoder_->finish().c_str(), stdout);
  }

 private:
  std::optional<tok::StreamDecoder> decoder_;
};

void run_generate(const GenerateOptions& o) {
  const bool text_in = o.has_prompt_text;
  const bool text_out = o.output == "text" || (o.output == "auto" && text_in);
  std::optional<tok::Tokenizer> tokenizer;
  if (text_in)
    tokenizer = model_tokenizer(o.model_dir, "--prompt",
                                "give the prompt as token ids with --prompt-ids 1,2,3 instead");
  else if (text_out)
    tokenizer = model_tokenizer(o.model_dir, "--output text", "use --output ids");
  const std::vector<int32_t> prompt =
      text_in ? tokenizer->encode(o.prompt_text) : parse_token_ids(o.prompt_ids, "--prompt-ids");
  if (prompt.empty()) TETRA_FAIL("--prompt encodes to no tokens; give some text");
  std::vector<int32_t> stop =
      o.stop_ids.empty() ? std::vector<int32_t>{} : parse_token_ids(o.stop_ids, "--stop-ids");
  if (o.max_new_tokens < 1) TETRA_FAIL("--max-new-tokens must be at least 1");
  // The sampler reads temperature <= 0 as greedy; a negative one is a mistake, not a mode.
  if (!(o.sampling.temperature >= 0.0f))
    TETRA_FAIL("--temperature ", o.sampling.temperature, " must be >= 0 (0 = greedy)");
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
  if (!o.ignore_eos)  // as vLLM and `serve` do: the checkpoint's end-of-sequence ids stop it
    for (int32_t id : generation_config_eos_ids(o.model_dir, engine->config().vocab_size))
      if (std::find(stop.begin(), stop.end(), id) == stop.end()) stop.push_back(id);
  const int64_t id = engine->add_request(prompt, o.sampling, o.max_new_tokens, stop);
  TokenPrinter printer(text_out ? &*tokenizer : nullptr);
  while (engine->has_work())
    for (const runtime::TokenEvent& ev : engine->step()) printer.token(ev.token);
  printer.finish();
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
  CLI::App* cmd = app.add_subcommand(
      "generate", "Generate from a prompt given as text (with the checkpoint's tokenizer.json) or "
                  "as token ids");
  cmd->add_option("--model", o->model_dir, "checkpoint directory")->required();
  CLI::Option_group* prompt = cmd->add_option_group("prompt", "as text or as token ids");
  prompt->add_option("--prompt", o->prompt_text,
                     "prompt text, encoded with the model directory's tokenizer.json")
      ->each([o](const std::string&) { o->has_prompt_text = true; });
  prompt->add_option("--prompt-ids", o->prompt_ids, "prompt token ids, comma-separated (e.g. 1,2,3)");
  prompt->require_option(1);
  cmd->add_option("--output", o->output,
                  "how generated tokens are shown: auto (text for --prompt, ids for "
                  "--prompt-ids), text (needs tokenizer.json) or ids")
      ->check(CLI::IsMember({"auto", "text", "ids"}))
      ->capture_default_str();
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--stop-ids", o->stop_ids, "token ids that end generation, comma-separated");
  cmd->add_flag("--ignore-eos", o->ignore_eos,
                "keep generating past generation_config.json's eos_token_id (which stops it by default)");
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
