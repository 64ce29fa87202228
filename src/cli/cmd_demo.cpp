// tetra demo: what the README's first command runs. Makes (and caches) a tiny NVFP4 model of
// a tiny preset, shows what Tetra sees in it (inspect + check), then generates a few tokens
// greedily on the best available backend (falling back to the cpu when a GPU backend refuses
// the tiny shapes, saying why) and prints the decode timing, its floor and the efficiency.
//
// The floor is `tetra bench decode`'s (perf/roofline.h's memory part: the bytes one token's
// step reads over the bandwidth of the memory it reads them from): the GPU table's bandwidth on
// cuda, this host's read bandwidth, measured on the spot (perf/host_bandwidth.h), on the cpu.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "cli/check_report.h"
#include "cli/commands.h"
#include "core/error.h"
#include "format/checkpoint.h"
#include "model/model_ops.h"
#include "moe/backend_select.h"
#include "moe/moe_workload.h"
#include "perf/gpu_spec.h"
#include "perf/host_bandwidth.h"
#include "perf/roofline.h"
#include "runtime/engine.h"
#include "tools/demo_model.h"
#include "tools/inspect_report.h"
#include "tools/model_writer.h"

namespace tetra::cli {
namespace {

void print_check(const Checkpoint& ck) {
  CheckResult r;
  Target target;
  target.gpu = resolve_gpu("auto");
  target.host_memory_bytes = host_memory_bytes();
  r.workload = describe_workload(ck.config(), ck.quant(), ParallelPlan{1, 1}, ck.dir().string());
  r.requested = "auto";
  r.verdicts = evaluate_all(r.workload, target);
  r.shared = shared_gpu_reasons(r.workload, target);
  r.auto_pick = auto_backend(r.workload, target);
  r.target = std::move(target);
  r.can_run = r.auto_pick.has_value();
  std::cout << check_report_text(r);
}

const std::vector<int32_t> kPrompt = {1, 2, 3, 4, 5, 6, 7, 8};

// What a greedy run measured, for the floor and efficiency lines.
struct DecodeRun {
  std::string backend;
  int64_t steps = 0;  // decode steps (the first token comes from the prefill)
  double ms_per_step = 0;
};

// Greedy generation from kPrompt on `backend`, streamed, then the timing.
DecodeRun generate(const std::filesystem::path& dir, const std::string& backend, int tokens) {
  runtime::EngineOptions eo;
  eo.backend = backend;
  eo.max_batch = 1;
  eo.max_context = int(kPrompt.size()) + tokens;
  auto engine = runtime::Engine::load(dir, eo);
  ops::SamplingParams greedy;
  greedy.temperature = 0.0f;
  const int64_t id = engine->add_request(kPrompt, greedy, tokens);
  std::printf("\ngenerate (%s backend, greedy, prompt ids 1..8):", engine->backend_name().c_str());
  while (engine->has_work())
    for (const runtime::TokenEvent& ev : engine->step()) {
      std::printf(" %d", ev.token);
      std::fflush(stdout);
    }
  const runtime::EngineStats& s = engine->stats();
  std::printf("\nfinish: %s; prefill %lld tokens at %.0f tokens/s; decode %.3f ms/token over %lld "
              "steps\n",
              runtime::finish_reason_name(engine->request(id).finish), (long long)s.prefill_tokens,
              s.prefill_tokens_per_s(), s.decode_ms_per_step(), (long long)s.decode_steps);
  return {engine->backend_name(), s.decode_steps, s.decode_ms_per_step()};
}

// The bandwidth the backend's decode reads its bytes at, and where the figure comes from.
struct Bandwidth {
  double bytes_per_s = 0;
  std::string source;
};

Bandwidth backend_bandwidth(const std::string& backend) {
  if (backend == "cpu") {
    const HostBandwidth h = measure_host_read_bandwidth();
    return {h.bytes_per_s, describe(h)};
  }
  const std::optional<GpuSpec> gpu = detect_local_gpu();
  if (!gpu) TETRA_FAIL("the ", backend, " backend ran but no GPU is detected");
  return {gpu->bandwidth_bytes_per_s, str(gpu->product, " memory: ", gpu->sources.bandwidth)};
}

// The per-token floor of the run's decode steps and the efficiency (floor / measured time).
// Step j reads the KV of the prompt, of j earlier tokens and its own, as bench decode counts.
void print_efficiency(const Checkpoint& ck, const DecodeRun& run) {
  if (run.steps < 1) return;  // stopped at the first token: no decode step was timed
  const Bandwidth bw = backend_bandwidth(run.backend);
  RooflineOptions ro;
  ro.bandwidth_bytes_per_s = bw.bytes_per_s;
  double seconds = 0, bytes = 0;
  for (int64_t j = 0; j < run.steps; ++j) {
    ro.context = int64_t(kPrompt.size()) + j + 1;
    const DecodeRoofline f = decode_roofline(ck.config(), ck.quant(), GpuSpec{}, ro);
    seconds += f.memory_seconds;
    bytes += f.memory_bytes;
  }
  const double floor_ms = 1e3 * seconds / double(run.steps);
  std::printf("decode floor %.4g ms/token: %.4g MB per token (the weights it touches + KV read, "
              "as tetra bench decode counts) at %.1f GB/s\n  bandwidth: %s\n",
              floor_ms, bytes / double(run.steps) / 1e6, bw.bytes_per_s / 1e9, bw.source.c_str());
  std::printf("decode efficiency %#.3g%% (floor / measured ms/token)\n",
              100.0 * floor_ms / run.ms_per_step);
}

void run_demo(const std::string& cache_dir, const std::string& preset, int tokens) {
  namespace fs = std::filesystem;
  const fs::path dir = demo_model_path(cache_dir, preset);
  if (!fs::exists(dir / "config.json")) {
    MakeModelOptions opt;
    opt.preset = preset;
    opt.dtype = "nvfp4";
    opt.seed = 1;
    const WriteResult r = make_model(dir, opt);
    std::printf("made %s (%lld tensors, %.2f MB) in %.2f s\n", dir.c_str(),
                (long long)r.tensors_written, r.bytes_out / 1e6, r.seconds);
  } else {
    std::printf("using cached %s\n", dir.c_str());
  }
  const Checkpoint ck = Checkpoint::open(dir);
  ck.validate();
  std::cout << format_inspect_report(inspect_report(ck)) << "\n";
  print_check(ck);

  const std::string best = model::resolve_model_ops_name("auto");
  DecodeRun run;
  try {
    run = generate(dir, best, tokens);
  } catch (const Error& e) {
    if (best == "cpu") throw;
    // A GPU backend may not take the tiny shapes (e.g. its attention kernels' head sizes):
    // say why and show the pipeline on the CPU instead.
    std::printf("\n%s backend cannot run this model: %s\nfalling back to the cpu backend\n",
                best.c_str(), e.what());
    run = generate(dir, "cpu", tokens);
  }
  print_efficiency(ck, run);
  std::printf("(random weights: the tokens are meaningless; the demo shows the pipeline runs)\n");
}

}  // namespace

static void add_demo(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Make (and cache) a tiny NVFP4 model, show what Tetra "
                                         "sees in it, and generate from it");
  auto cache = std::make_shared<std::string>();
  auto preset = std::make_shared<std::string>("tiny-glm4.5-air");
  auto tokens = std::make_shared<int>(16);
  cmd->add_option("--cache-dir", *cache, "where to keep the demo model (default ~/.cache/tetra)");
  cmd->add_option("--preset", *preset, "tiny preset to use")->capture_default_str();
  cmd->add_option("--tokens", *tokens, "tokens to generate")->capture_default_str();
  cmd->callback([cache, preset, tokens] { run_demo(*cache, *preset, *tokens); });
}

static const CommandRegistration kRegistration{"demo", 90, &add_demo};

}  // namespace tetra::cli
