// `tetra check`: which MoE backends can run this model on this GPU, and every reason the others
// cannot. Reads config.json and the quant config only (no tensor data).
//
// Exit codes: 0  the requested backend (default: auto's pick) can run;
//             3  it cannot (the table says why);
//             1  bad input: unknown preset/GPU/backend, unreadable or unsupported config;
//             CLI11's own codes (>= 100) for malformed command lines.
#include <iostream>
#include <memory>

#include "cli/check_report.h"
#include "cli/commands.h"
#include "core/error.h"
#include "format/presets.h"
#include "dist/parallel_check.h"
#include "dist/rank_threads.h"
#include "format/model_config.h"
#include "format/quant_config.h"
#include "model/cuda/cuda_model_ops.h"
#include "model/model_weights.h"
#include "moe/backend_select.h"

namespace tetra::cli {
namespace {

constexpr int kExitCannotRun = 3;

struct CheckOptions {
  std::string model_dir, preset, quant = "nvfp4", gpu = "auto", backend = "auto";
  int tp = 1, ep = 1;
  bool json = false;
};

std::string known_backends() {
  std::string out = "auto, all";
  for (const std::string& n : backend_names()) out += ", " + n;
  return out;
}

int run_check(const CheckOptions& o) {
  if (o.backend != "auto" && o.backend != "all" && !find_backend(o.backend))
    TETRA_FAIL("unknown backend '", o.backend, "'; known: ", known_backends());
  if (o.tp < 1 || o.ep < 1) TETRA_FAIL("--tp and --ep must be at least 1 (got ", o.tp, ", ", o.ep, ")");

  ModelConfig cfg;
  QuantConfig quant;
  std::string label;
  if (!o.model_dir.empty()) {
    cfg = load_model_config(o.model_dir);
    quant = load_quant_config(o.model_dir);
    label = o.model_dir;
  } else {
    cfg = preset_config(o.preset);
    quant = preset_quant(o.quant, "tetra check --preset");
    label = o.preset;
  }

  Target target;
  target.gpu = resolve_gpu(o.gpu);
  target.host_memory_bytes = host_memory_bytes();

  CheckResult r;
  const ParallelPlan plan{o.tp, o.ep};
  r.workload = describe_workload(cfg, quant, plan, label);
  // TP/EP rules beyond divisibility: NVFP4 blocks cut by row splits; GPUs this machine lacks.
  std::vector<std::string>& problems = r.workload.model_problems;
  for (std::string& p : dist::new_sharding_problems(cfg, quant, plan, problems))
    problems.push_back(std::move(p));
  if (gpu_key(o.gpu) == "auto" && target.gpu)
    if (auto p = dist::gpu_count_problem(plan, dist::visible_gpu_count())) problems.push_back(*p);
  r.split_detail = dist::split_summary(cfg, plan);
  r.runtime_reasons = model::runtime_unsupported_reasons(cfg);
  if (target.gpu && r.runtime_reasons.empty())  // the CUDA limits assume a runnable architecture
    for (const std::string& why : model::cuda::cuda_model_unsupported_reasons(cfg))
      r.runtime_reasons.push_back("cuda backend: " + why);
  r.requested = o.backend;
  r.show_declarations = o.backend == "all";
  if (o.backend == "auto" || o.backend == "all") {
    r.verdicts = evaluate_all(r.workload, target);
  } else {
    r.verdicts = {evaluate(*find_backend(o.backend), r.workload, target)};
  }
  r.shared = shared_gpu_reasons(r.workload, target);
  r.auto_pick = auto_backend(r.workload, target);
  r.target = std::move(target);
  r.can_run = (o.backend == "auto" || o.backend == "all") ? r.auto_pick.has_value()
                                                          : r.verdicts.front().ok;
  const int code = r.can_run ? 0 : kExitCannotRun;
  if (o.json)
    std::cout << check_report_json(r, code).dump(2) << "\n";
  else
    std::cout << check_report_text(r);
  return code;
}

}  // namespace

static void add_check(CLI::App& app) {
  auto opts = std::make_shared<CheckOptions>();
  CLI::App* cmd = app.add_subcommand(
      "check",
      "Which MoE backends can run a model on a GPU, and why the others cannot "
      "(exit 0: runs, 3: cannot, 1: bad input)");
  auto* model = cmd->add_option("--model", opts->model_dir,
                                "checkpoint directory (reads config.json and the quant config only)");
  auto* preset = cmd->add_option("--preset", opts->preset, "a named model configuration instead");
  model->excludes(preset);
  auto* quant = cmd->add_option("--quant", opts->quant,
                                "with --preset: nvfp4 (default), w4a16_nvfp4 or bf16");
  quant->excludes(model);
  cmd->add_option("--gpu", opts->gpu,
                  "auto (detect this machine's GPU) or a table entry: h100, h200, b200, b300, gb200, "
                  "rtx-pro-6000, rtx-5090, dgx-spark, a100, l40s");
  cmd->add_option("--backend", opts->backend,
                  "auto (default), all (also print every declaration) or one backend's name");
  cmd->add_option("--tp", opts->tp, "tensor parallel GPUs (attention, dense, shared experts)");
  cmd->add_option("--ep", opts->ep, "expert parallel GPUs (GPUs = max(tp, ep))");
  cmd->add_flag("--json", opts->json, "print JSON instead of the table");
  cmd->callback([opts] {
    if (opts->model_dir.empty() && opts->preset.empty())
      TETRA_FAIL("tetra check needs --model DIR or --preset NAME; presets: ",
                 [] {
                   std::string s;
                   for (const std::string& n : preset_names()) s += (s.empty() ? "" : ", ") + n;
                   return s;
                 }());
    const int code = run_check(*opts);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

static const CommandRegistration kRegistration{"check", 40, &add_check};

}  // namespace tetra::cli
