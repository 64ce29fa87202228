// `tetra bench`: GPU benchmarks that write markdown and JSON results (bench/results/).
// One function per benchmark subcommand; see bench_commands.h.
//
// Exit codes: 0 done; 1 bad arguments (unknown preset, backend, routing, token list);
//             4 no CUDA GPU on this machine; CLI11's own codes (>= 100) for malformed lines.
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "bench/moe_bench.h"
#include "cli/bench_commands.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/cuda_check.h"
#include "core/error.h"

namespace tetra::cli {
namespace {

struct BenchMoeArgs {
  bench::MoeBenchOptions opts;
  std::string tokens = "1,4,16,64,256,1024,4096";
  bench::ReportOutput output;
};

void run_bench_moe(BenchMoeArgs& a) {
  a.opts.tokens = parse_int_list(a.tokens, "--tokens");
  bench::validate_moe_bench_options(a.opts);
  std::ostringstream cmd;
  cmd << "tetra bench moe --preset " << a.opts.preset << " --tokens " << a.tokens << " --backend "
      << a.opts.backend << " --routing " << a.opts.routing;
  if (a.opts.iters > 0) cmd << " --iters " << a.opts.iters;
  a.opts.command_line = cmd.str();
  if (!cuda_available()) {
    std::fprintf(stderr, "tetra: error: tetra bench moe needs a CUDA GPU; none was found on this "
                         "machine\n");
    throw CLI::RuntimeError(kExitNoGpu);
  }
  const bench::MoeBenchReport r = bench::run_moe_bench(a.opts);
  bench::emit_report(a.output, bench::moe_bench_markdown(r), bench::moe_bench_json(r), std::cout);
}

}  // namespace

void add_bench_moe(CLI::App& bench) {
  auto a = std::make_shared<BenchMoeArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "moe", "One MoE layer of a preset's real shapes on the GPU: time, GB/s, TFLOP/s, floors");
  cmd->add_option("--preset", a->opts.preset, "model preset (default glm5)");
  cmd->add_option("--tokens", a->tokens, "comma-separated token counts (default 1,4,...,4096)");
  cmd->add_option("--backend", a->opts.backend, "all (default) or one MoE backend's name");
  cmd->add_option("--routing", a->opts.routing,
                  "uniform (default) or skewed (correction bias +0.2 on every 8th expert)");
  cmd->add_option("--iters", a->opts.iters, "timed runs per row (default: about 0.3 s worth)");
  add_report_options(*cmd, a->output);
  cmd->callback([a] { run_bench_moe(*a); });
}

static void add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: moe, decode, allreduce on the GPU (exit 4: no CUDA GPU here); serve over HTTP");
  bench->require_subcommand(1);
  add_bench_moe(*bench);
}

static const CommandRegistration kRegistration{"bench", 60, &add_bench};

}  // namespace tetra::cli
