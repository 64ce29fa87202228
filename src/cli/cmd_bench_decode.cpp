// `tetra bench decode`: the whole model's decode step on the CUDA backend (bench/decode_bench.h).
// Registered after `bench` (order 62) and hung under it, so cmd_bench.cpp needs no line for it.
// Exit codes: 0 done; 1 bad arguments; 4 no CUDA GPU here.
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "bench/decode_bench.h"
#include "perf/block_stamps.h"
#include "cli/bench_commands.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/cuda_check.h"
#include "core/error.h"
#include "ops/sampling/logprobs.h"

namespace tetra::cli {
namespace {

struct BenchDecodeArgs {
  bench::DecodeBenchOptions opts;
  std::string batches = "1", contexts = "1024", dtype = "nvfp4";
  bool random_weights = false, no_graphs = false, no_per_op = false, rope_kernel = false;
  bench::ReportOutput output;
};

void run_bench_decode(BenchDecodeArgs& a) {
  if (a.opts.model_dir.empty() == a.opts.preset.empty())
    TETRA_FAIL("give either --model DIR or --preset NAME --random-weights");
  if (!a.opts.preset.empty() && !a.random_weights)
    TETRA_FAIL("--preset needs --random-weights (the full-size model is built in GPU memory)");
  if (!a.opts.model_dir.empty() && (a.random_weights || a.opts.layers > 0))
    TETRA_FAIL("--random-weights and --layers go with --preset, not --model");
  if (a.dtype != "nvfp4" && a.dtype != "bf16") TETRA_FAIL("--dtype must be nvfp4 or bf16");
  a.opts.nvfp4 = a.dtype == "nvfp4";
  a.opts.batches = parse_int_list(a.batches, "--batch");
  a.opts.contexts = parse_int_list(a.contexts, "--context");
  if (a.opts.prefill_tokens < 0) TETRA_FAIL("--prefill-tokens must be >= 0");
  a.opts.graphs = !a.no_graphs;
  a.opts.rope_in_attention = !a.rope_kernel;
  a.opts.per_op = !a.no_per_op;
  std::ostringstream cmd;
  cmd << "tetra bench decode";
  if (!a.opts.model_dir.empty()) cmd << " --model " << a.opts.model_dir;
  else cmd << " --preset " << a.opts.preset << " --random-weights --dtype " << a.dtype;
  if (a.opts.layers > 0) cmd << " --layers " << a.opts.layers;
  cmd << " --batch " << a.batches << " --context " << a.contexts << " --prefill-tokens "
      << a.opts.prefill_tokens << " --iters " << a.opts.iters;
  if (a.opts.tp != 1) cmd << " --tp " << a.opts.tp;
  if (a.opts.ep != 1) cmd << " --ep " << a.opts.ep;
  if (a.no_graphs) cmd << " --no-graphs";
  if (a.rope_kernel) cmd << " --rope-kernel";
  if (a.opts.timeline_steps > 0) cmd << " --timeline " << a.opts.timeline_steps;
  if (a.opts.timeline_steps < 0) TETRA_FAIL("--timeline must be >= 0");
  if (a.opts.timeline_steps > 0 && a.opts.tp * a.opts.ep > 1)
    TETRA_FAIL("--timeline traces one GPU; drop --tp/--ep");
  if (!a.opts.block_stamps_path.empty()) {
    cmd << " --block-stamps " << a.opts.block_stamps_path;
    if (!perf::block_stamps_compiled())
      TETRA_FAIL("--block-stamps: this build has no block stamps (configure with "
                 "-DTETRA_BLOCK_STAMPS=ON)");
    if (a.opts.tp * a.opts.ep > 1) TETRA_FAIL("--block-stamps records one GPU; drop --tp/--ep");
  }
  a.opts.command_line = cmd.str();
  if (!cuda_available()) {
    std::fprintf(stderr, "tetra: error: tetra bench decode needs a CUDA GPU; none was found on "
                         "this machine\n");
    throw CLI::RuntimeError(kExitNoGpu);
  }
  const bench::DecodeBenchReport r = bench::run_decode_bench(a.opts);
  bench::emit_report(a.output, bench::decode_bench_markdown(r), bench::decode_bench_json(r),
                     std::cout);
}

CLI::App* find_or_add_bench(CLI::App& app) {
  auto found = app.get_subcommands([](CLI::App* c) { return c->get_name() == "bench"; });
  if (!found.empty()) return found.front();
  CLI::App* bench = app.add_subcommand("bench", "GPU benchmarks (exit 4: no CUDA GPU here)");
  bench->require_subcommand(1);
  return bench;
}

}  // namespace

static void add_bench_decode(CLI::App& app) {
  CLI::App* bench = find_or_add_bench(app);
  auto a = std::make_shared<BenchDecodeArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "decode", "Whole-model decode steps on the GPU: latency, tokens/s, floor, efficiency");
  cmd->add_option("--model", a->opts.model_dir, "checkpoint directory to load");
  cmd->add_option("--preset", a->opts.preset, "model preset (with --random-weights)");
  cmd->add_flag("--random-weights", a->random_weights,
                "build the preset's full-size model in GPU memory with random weights");
  cmd->add_option("--layers", a->opts.layers, "with --preset: keep only the first N layers");
  cmd->add_option("--dtype", a->dtype, "with --preset: nvfp4 (default) or bf16");
  cmd->add_option("--batch", a->batches, "comma-separated batch sizes (default 1)");
  cmd->add_option("--context", a->contexts, "comma-separated context lengths (default 1024)");
  cmd->add_option("--prefill-tokens", a->opts.prefill_tokens,
                  "tokens of the one-sequence prefill figure (default 4096; 0: none)");
  cmd->add_option("--iters", a->opts.iters, "timed decode steps per row (default 30)");
  cmd->add_option("--logprobs", a->opts.logprobs_top,
                  "each timed step also computes every row's logprobs with N alternatives "
                  "(0-20; what an OpenAI logprobs request adds to a step)")
      ->check(CLI::Range(0, ops::kMaxTopLogprobs));
  cmd->add_option("--tp", a->opts.tp, "tensor parallel GPUs (default 1)");
  cmd->add_option("--ep", a->opts.ep, "expert parallel GPUs (default 1); runs on max(tp, ep) GPUs");
  cmd->add_flag("--no-graphs", a->no_graphs, "run decode steps eagerly (no CUDA graphs)");
  cmd->add_flag("--rope-kernel", a->rope_kernel,
                "decode: RoPE + KV-cache write as its own launch before the attention (default: "
                "inside the split decode attention where the rotary shape allows)");
  cmd->add_flag("--no-per-op", a->no_per_op, "skip the per-op timing step");
  cmd->add_option("--timeline", a->opts.timeline_steps,
                  "trace N more steps per row with CUPTI: per-kernel duration, gap and exposed "
                  "time inside the step (needs libcupti)");
  cmd->add_option("--block-stamps", a->opts.block_stamps_path,
                  "write per-block time stamps of the attention and MoE chains' kernels, one "
                  "step per row, to PATH.b<batch>.c<context>.bin (builds with "
                  "-DTETRA_BLOCK_STAMPS=ON; read with scripts/gpu/block_stamps.py)");
  add_report_options(*cmd, a->output);
  cmd->callback([a] { run_bench_decode(*a); });
}

static const CommandRegistration kRegistration{"bench decode", 62, &add_bench_decode};

}  // namespace tetra::cli
