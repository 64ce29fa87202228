// `tetra bench allreduce`: one-shot peer-memory all-reduce vs NCCL, latency per message size
// (dist/allreduce_bench.h says how it measures). Registered after `bench` (order 60) and hung
// under it, so cmd_bench.cpp needs no line for it; creates `bench` itself if that is absent.
//
// Exit codes: 0 done; 1 bad arguments or a missing requirement (NCCL, peer access);
//             4 fewer GPUs than --gpus.
#include <cstdio>
#include <iostream>
#include <memory>

#include "bench/report_output.h"
#include "cli/bench_commands.h"
#include "cli/commands.h"
#include "core/error.h"
#include "dist/allreduce_bench.h"
#include "dist/rank_threads.h"

namespace tetra::cli {
namespace {

struct BenchAllReduceArgs {
  std::string sizes = "2K..1M";
  dist::AllReduceBenchOptions opts;
  std::string json_path, markdown_path;
};

void run_bench_allreduce(BenchAllReduceArgs& a) {
  a.opts.sizes_bytes = dist::parse_byte_sizes(a.sizes);
  if (a.opts.reps < 1 || a.opts.calls_per_rep < 1) TETRA_FAIL("--reps must be at least 1");
  a.opts.command_line = str("tetra bench allreduce --sizes ", a.sizes, " --gpus ", a.opts.gpus,
                            " --reps ", a.opts.reps, a.opts.push ? " --push" : "");
  const int visible = dist::visible_gpu_count();
  if (visible < a.opts.gpus) {
    std::fprintf(stderr, "tetra: error: tetra bench allreduce --gpus %d needs %d CUDA GPUs; this "
                         "machine has %d\n", a.opts.gpus, a.opts.gpus, visible);
    throw CLI::RuntimeError(kExitNoGpu);
  }
  const dist::AllReduceBenchReport r = dist::run_allreduce_bench(a.opts);
  const std::string md = dist::allreduce_bench_markdown(r);
  std::cout << md;
  if (!a.markdown_path.empty()) bench::write_text_file(a.markdown_path, md);
  if (!a.json_path.empty()) bench::write_text_file(a.json_path, dist::allreduce_bench_json(r).dump(2) + "\n");
}

CLI::App* find_or_add_bench(CLI::App& app) {
  auto found = app.get_subcommands([](CLI::App* c) { return c->get_name() == "bench"; });
  if (!found.empty()) return found.front();
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: moe, decode, allreduce on the GPU (exit 4: no CUDA GPU here); serve over HTTP");
  bench->require_subcommand(1);
  return bench;
}

}  // namespace

static void add_bench_allreduce(CLI::App& app) {
  CLI::App* bench = find_or_add_bench(app);
  auto a = std::make_shared<BenchAllReduceArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "allreduce", "bf16 all-reduce latency across this machine's GPUs: one-shot peer memory vs NCCL");
  cmd->add_option("--sizes", a->sizes,
                  "message sizes in bytes: a doubling range 2K..1M (default), a list 4K,64K,1M, "
                  "or both");
  cmd->add_option("--gpus", a->opts.gpus, "GPUs to reduce across (default 2)");
  cmd->add_option("--reps", a->opts.reps, "timed repetitions per size and path (default 50)");
  cmd->add_flag("--push", a->opts.push,
                "one-shot variant that writes into peers' buffers instead of reading them");
  cmd->add_option("--json", a->json_path, "also write the results as JSON to this file");
  cmd->add_option("--markdown", a->markdown_path, "also write the markdown table to this file");
  cmd->callback([a] { run_bench_allreduce(*a); });
}

static const CommandRegistration kRegistration{"bench allreduce", 61, &add_bench_allreduce};

}  // namespace tetra::cli
