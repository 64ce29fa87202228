// `tetra bench serve`: load test of a running `tetra serve` (bench/serve_bench.h). It adds itself
// to the `bench` command when that is registered (order 60, before this one); otherwise it stands
// alone as `tetra bench-serve`.
#include <iostream>
#include <memory>

#include "bench/report_output.h"
#include "bench/serve_bench.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "core/error.h"

namespace tetra::cli {
namespace {

struct BenchServeArgs {
  bench::ServeBenchOptions opts;
  std::string concurrency = "1,8,64";
  std::string json_path, markdown_path;
};

void run_bench_serve(BenchServeArgs& a) {
  a.opts.concurrency = parse_int_list(a.concurrency, "--concurrency");
  bench::validate_serve_bench_options(a.opts);
  const auto points = bench::run_serve_bench(a.opts);
  const std::string md = bench::serve_bench_markdown(a.opts, points);
  std::cout << md;
  if (!a.markdown_path.empty()) bench::write_text_file(a.markdown_path, md);
  if (!a.json_path.empty())
    bench::write_text_file(a.json_path, bench::serve_bench_json(a.opts, points).dump(2) + "\n");
  for (const auto& p : points)
    if (p.completed == 0) TETRA_FAIL("every request failed at concurrency ", p.concurrency, ": ", p.first_error);
}

void add_serve_options(CLI::App* cmd) {
  auto a = std::make_shared<BenchServeArgs>();
  cmd->add_option("--url", a->opts.url, "server base URL")->capture_default_str();
  cmd->add_option("--concurrency", a->concurrency, "client counts, comma-separated")->capture_default_str();
  cmd->add_option("--requests", a->opts.requests, "requests per concurrency level")->capture_default_str();
  cmd->add_option("--input-len", a->opts.input_len, "prompt tokens per request")->capture_default_str();
  cmd->add_option("--output-len", a->opts.output_len, "generated tokens per request")->capture_default_str();
  cmd->add_option("--seed", a->opts.seed, "prompt seed")->capture_default_str();
  cmd->add_option("--json", a->json_path, "write results as JSON here");
  cmd->add_option("--markdown", a->markdown_path, "write the markdown table here");
  cmd->callback([a] { run_bench_serve(*a); });
}

}  // namespace

static void add_bench_serve(CLI::App& app) {
  const char* what = "Load-test a running `tetra serve` over HTTP (TTFT, TPOT, ITL, throughput)";
  CLI::App* bench = nullptr;
  for (CLI::App* sub : app.get_subcommands({}))
    if (sub->get_name() == "bench") bench = sub;
  add_serve_options(bench ? bench->add_subcommand("serve", what) : app.add_subcommand("bench-serve", what));
}

static const CommandRegistration kRegistration{"bench-serve", 61, &add_bench_serve};

}  // namespace tetra::cli
