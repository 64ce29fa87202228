// `tetra roofline`: the theoretical per-token decode time of a model on a GPU and its parts
// (weights by kind, KV read, lm_head, communication), from perf/roofline.h.
//
// Exit codes: 0 printed; 1 bad input (unknown preset/GPU/quant, a tp/ep split `tetra check`
//             refuses, with its reasons, ...); CLI11's own codes (>= 100) for malformed command
//             lines.
//
// DESIGN.md's "~3.2 ms floor" for GLM-5 NVFP4 on Blackwell workstations: ~40B active params at
// 0.5625 B = 22.5 GB over four RTX PRO 6000 (4 x 1.792 TB/s) is 3.14 ms. Counted exactly
// (`--preset glm5 --gpu rtx-pro-6000 --tp 4`) the memory part is 3.51 ms (BF16 lm_head and
// router, KV read) and PCIe all-reduces add an estimated 3.9 ms, mostly latency.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "dist/sharding_plan.h"
#include "format/presets.h"
#include "format/model_config.h"
#include "format/quant_config.h"
#include "perf/gpu_spec.h"
#include "perf/roofline.h"

namespace tetra::cli {
namespace {

struct RooflineCliOptions {
  std::string model_dir, preset, quant = "nvfp4", gpu = "auto";
  int tp = 1, ep = 1;
  int64_t batch = 1, context = 1024;
  double bandwidth_tbs = 0, link_gbs = 0, link_latency_us = -1;
  bool json = false;
};

void run_roofline(const RooflineCliOptions& o) {
  if (o.model_dir.empty() && o.preset.empty()) {
    std::string names;
    for (const std::string& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    TETRA_FAIL("tetra roofline needs --model DIR or --preset NAME; presets: ", names);
  }
  ModelConfig cfg;
  QuantConfig quant;
  if (!o.model_dir.empty()) {
    cfg = load_model_config(o.model_dir);
    quant = load_quant_config(o.model_dir);
  } else {
    cfg = preset_config(o.preset);
    quant = preset_quant(o.quant, "tetra roofline --preset");
  }
  // The split rules `tetra check` lists (dist/sharding_plan.h), so a floor is only printed for
  // a split the model can run at.
  const std::vector<std::string> problems = dist::sharding_problems(cfg, quant, ParallelPlan{o.tp, o.ep});
  if (!problems.empty()) {
    std::string why;
    for (const std::string& p : problems) why += (why.empty() ? "" : "; ") + p;
    TETRA_FAIL("tp=", o.tp, " ep=", o.ep, " cannot split this model: ", why);
  }
  const std::optional<GpuSpec> gpu = resolve_gpu(o.gpu);
  if (!gpu) {
    std::string names;
    for (const std::string& n : gpu_names()) names += (names.empty() ? "" : ", ") + n;
    TETRA_FAIL("--gpu auto found no GPU on this machine; name one: ", names);
  }
  RooflineOptions ro;
  ro.tp = o.tp;
  ro.ep = o.ep;
  ro.batch = o.batch;
  ro.context = o.context;
  if (o.bandwidth_tbs != 0) {
    if (o.bandwidth_tbs < 0) TETRA_FAIL("--bandwidth must be positive (TB/s)");
    ro.bandwidth_bytes_per_s = o.bandwidth_tbs * 1e12;
  }
  if (o.link_gbs != 0) {
    if (o.link_gbs < 0) TETRA_FAIL("--link-bandwidth must be positive (GB/s)");
    ro.link_bytes_per_s = o.link_gbs * 1e9;
  }
  if (o.link_latency_us >= 0) ro.link_latency_s = o.link_latency_us * 1e-6;
  const DecodeRoofline r = decode_roofline(cfg, quant, *gpu, ro);
  if (o.json) {
    nlohmann::json j = decode_roofline_to_json(r);
    j["model"] = o.model_dir.empty() ? o.preset : o.model_dir;
    j["quant"] = std::string(quant_algo_name(quant.algo));
    j["interconnect"] = interconnect_of(*gpu).name;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "model " << (o.model_dir.empty() ? o.preset : o.model_dir) << " ("
              << quant_algo_name(quant.algo) << "), link " << interconnect_of(*gpu).name << "\n"
              << decode_roofline_table(r);
  }
}

}  // namespace

static void add_roofline(CLI::App& app) {
  auto opts = std::make_shared<RooflineCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "roofline",
      "Theoretical per-token decode time (bytes read / HBM bandwidth + communication) and its parts");
  auto* model = cmd->add_option("--model", opts->model_dir,
                                "checkpoint directory (reads config.json and the quant config only)");
  auto* preset = cmd->add_option("--preset", opts->preset, "a named model configuration instead");
  model->excludes(preset);
  auto* quant = cmd->add_option("--quant", opts->quant, "with --preset: nvfp4 (default), w4a16_nvfp4 or bf16");
  quant->excludes(model);
  cmd->add_option("--gpu", opts->gpu,
                  "auto (this machine's GPU) or a table entry: h100, h200, b200, b300, gb200, "
                  "rtx-pro-6000, rtx-5090, dgx-spark, a100, l40s");
  cmd->add_option("--tp", opts->tp, "tensor parallel GPUs (attention, dense, shared experts, vocab)");
  cmd->add_option("--ep", opts->ep, "expert parallel GPUs (GPUs = max(tp, ep))");
  cmd->add_option("--batch", opts->batch, "sequences decoding together (default 1)");
  cmd->add_option("--context", opts->context, "tokens in each sequence's KV cache (default 1024)");
  cmd->add_option("--bandwidth", opts->bandwidth_tbs, "HBM bandwidth in TB/s instead of the table's");
  cmd->add_option("--link-bandwidth", opts->link_gbs, "GPU-to-GPU GB/s per direction instead of the table's");
  cmd->add_option("--link-latency-us", opts->link_latency_us, "microseconds per collective");
  cmd->add_flag("--json", opts->json, "print JSON instead of the table");
  cmd->callback([opts] { run_roofline(*opts); });
}

static const CommandRegistration kRegistration{"roofline", 45, &add_roofline};

}  // namespace tetra::cli
