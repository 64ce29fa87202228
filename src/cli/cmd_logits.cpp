// `tetra logits`: logits of every prompt position plus N greedy decode steps, for comparison
// with a reference implementation (tests/reference/compare_hf.py). Prompts are prefilled
// together as one varlen batch, then decoded together, so batching is part of what is checked.
//   --prompts FILE.json  [[1,2,3], [4,5], ...]
//   --out PREFIX         writes PREFIX.bin: f32 rows, prompt after prompt, each
//                        [len + decode_steps, vocab]; PREFIX.json: vocab, and per prompt its
//                        ids, the generated ids (fed back, argmax of the row before) and rows.
#include <cstdio>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "runtime/engine.h"

namespace tetra::cli {
namespace {

struct LogitsOptions {
  std::string model_dir, prompts_file, out_prefix, backend = "cpu", moe_backend = "auto";
  int decode_steps = 0;
};

std::vector<std::vector<int32_t>> read_prompts(const std::string& path) {
  std::ifstream f(path);
  if (!f) TETRA_FAIL("cannot read --prompts file ", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    TETRA_FAIL("--prompts file ", path, " is not JSON: ", e.what());
  }
  if (!j.is_array() || j.empty()) TETRA_FAIL("--prompts file ", path, " must hold a non-empty list of id lists");
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : j) {
    if (!p.is_array() || p.empty()) TETRA_FAIL("--prompts file ", path, ": every prompt must be a non-empty list of ids");
    std::vector<int32_t> ids;
    for (const auto& v : p) {
      if (!v.is_number_integer()) TETRA_FAIL("--prompts file ", path, ": ids must be integers");
      ids.push_back(v.get<int32_t>());
    }
    out.push_back(std::move(ids));
  }
  return out;
}

void run_logits(const LogitsOptions& o) {
  const auto prompts = read_prompts(o.prompts_file);
  int longest = 0, total = 0;
  for (const auto& p : prompts) {
    longest = std::max(longest, int(p.size()));
    total += int(p.size());
  }
  runtime::EngineOptions eo;
  eo.backend = o.backend;
  eo.moe_backend = o.moe_backend;
  eo.max_batch = int(prompts.size());
  eo.max_context = longest + o.decode_steps + 1;
  eo.max_prefill_tokens = total;
  auto engine = runtime::Engine::load(o.model_dir, eo);
  const int64_t vocab = engine->config().vocab_size;
  for (const auto& p : prompts)
    for (int32_t t : p)
      if (t < 0 || t >= vocab) TETRA_FAIL("--prompts: token id ", t, " is outside the vocabulary [0, ", vocab, ")");
  std::vector<std::vector<int32_t>> generated;
  const auto logits = engine->score(prompts, o.decode_steps, &generated);
  std::ofstream bin(o.out_prefix + ".bin", std::ios::binary);
  nlohmann::json meta = {{"vocab", vocab}, {"decode_steps", o.decode_steps},
                         {"backend", engine->backend_name()}, {"prompts", nlohmann::json::array()}};
  for (size_t s = 0; s < prompts.size(); ++s) {
    bin.write(reinterpret_cast<const char*>(logits[s].data()), std::streamsize(logits[s].size() * 4));
    meta["prompts"].push_back({{"ids", prompts[s]}, {"generated", generated[s]},
                               {"rows", logits[s].size() / size_t(vocab)}});
  }
  if (!bin) TETRA_FAIL("cannot write ", o.out_prefix, ".bin");
  std::ofstream(o.out_prefix + ".json") << meta.dump(1) << "\n";
  std::printf("wrote %s.bin and %s.json (%zu prompts, backend %s)\n", o.out_prefix.c_str(),
              o.out_prefix.c_str(), prompts.size(), engine->backend_name().c_str());
}

}  // namespace

static void add_logits(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "logits", "Write the logits of prompts (+ greedy decode steps) for reference comparisons");
  cmd->add_option("--model", o->model_dir, "checkpoint directory")->required();
  cmd->add_option("--prompts", o->prompts_file, "JSON file: a list of token id lists")->required();
  cmd->add_option("--out", o->out_prefix, "output prefix (writes PREFIX.bin and PREFIX.json)")->required();
  cmd->add_option("--decode-steps", o->decode_steps, "greedy decode steps after the prompt")
      ->capture_default_str();
  cmd->add_option("--backend", o->backend, "cpu, cuda or auto")->capture_default_str();
  cmd->add_option("--moe-backend", o->moe_backend, "MoE runner of the backend")->capture_default_str();
  cmd->callback([o] { run_logits(*o); });
}

static const CommandRegistration kRegistration{"logits", 55, &add_logits};

}  // namespace tetra::cli
