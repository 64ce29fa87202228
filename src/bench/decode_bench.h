// `tetra bench decode`: the whole model's decode step (and a prefill) on the CUDA backend.
// With --random-weights the full-size model of a preset is built directly in GPU memory (random
// NVFP4 bytes and scales generated on the GPU, no file), as vLLM's dummy load format does.
//
// Method: one backend prepared for the largest batch and context asked for. A decode step at
// context C: every sequence has C tokens in its KV cache (cache contents are whatever is there:
// the bytes read and the work are the same as for real ones) and decodes one more. Steps are
// replayed as CUDA graphs (the runtime's normal path); each timed step is the forward, greedy
// sampling of its rows on the GPU and the tokens' copy to the host (what the runtime runs per
// token), wall clock, after warm-up; median and p90 over --iters steps. Prefill: one sequence of
// --prefill-tokens tokens, median of 3. Floor: perf/roofline.h's decode floor (active weight bytes
// incl. unique experts at that batch + KV read + lm_head) at the GPU's bandwidth from the GPU
// table (perf/gpu_spec.h: on the H200 the measured 4.46 TB/s of DEVICE.md);
// efficiency = floor / measured. Per-op times: one eager step with CUDA events around each op.
// tp/ep > 1: the model is split over max(tp, ep) GPUs (model/parallel/parallel_model_ops.h), each
// GPU's share of the random weights built on it; the floor is roofline's per-GPU HBM floor at that
// split (it splits lm_head tp ways, which Tetra replicates: that read is part of the gap); no
// per-op step (the ops run on the rank threads, not under the caller's events).
// Timeline (--timeline N): N more steps per row, the kernels the device ran recorded by CUPTI
// (graph replays included) and analysed by perf/step_timeline.h: per kernel its duration, the
// idle gap before it and how much it extended the step (one GPU only).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/model_config.h"
#include "model/model_weights.h"
#include "perf/prefill_flops.h"
#include "perf/step_timeline.h"

namespace tetra::bench {

struct DecodeBenchOptions {
  std::string model_dir;          // a checkpoint to load (instead of preset + random weights)
  std::string preset;             // preset name (random weights)
  int layers = 0;                 // 0: the preset's layer count
  bool nvfp4 = true;              // false: BF16 everywhere
  std::vector<int> batches = {1};
  std::vector<int> contexts = {1024};
  int prefill_tokens = 4096;      // 0: no prefill figure
  int iters = 30;
  int warmup = 3;
  bool graphs = true;
  bool rope_in_attention = true;  // CudaOpsOptions::rope_in_attention (false: --rope-kernel)
  bool per_op = true;             // one eager step timed per op
  int timeline_steps = 0;         // > 0: trace that many steps per row with CUPTI (one GPU)
  std::string block_stamps_path;  // non-empty: per-block stamps of one step per row to
                                  // PATH.b<batch>.c<context>.bin (perf/block_stamps.h, one GPU)
  int logprobs_top = -1;           // >= 0: a timed step also answers each row's logprobs with
                                  // that many alternatives (what a logprobs request adds)
  uint64_t seed = 1;
  double bandwidth = 0;           // bytes/s for the floor; 0: the detected GPU's (perf/gpu_spec.h)
  int tp = 1, ep = 1;             // tensor / expert parallel: GPUs 0 .. max(tp, ep) - 1
  std::string command_line;
};

struct DecodeOpTime {
  std::string op;  // "attention linears", "moe", ...
  double us = 0;
  int calls = 0;
};

struct DecodeBenchRow {
  int batch = 0, context = 0;
  double median_us = 0, p90_us = 0;   // per decode step (= per-token latency)
  double tokens_per_s = 0;            // batch / median step
  double floor_us = 0, floor_bytes = 0, efficiency = 0;  // floor: per GPU, HBM only
  double comm_us = 0;                 // the roofline's all-reduce estimate (tp/ep > 1), not in floor
  double unique_experts_per_layer = 0;
  std::vector<DecodeOpTime> ops;      // eager, per op kind
  double eager_us = 0;                // the eager step's total
  std::optional<perf::StepTimeline> timeline;  // timeline_steps > 0
  double traced_median_us = 0;        // wall time of the traced steps (tracing's own cost shows)
};

// The HBM bandwidth a row achieved: the floor's bytes (per GPU) over its median step. Equals
// efficiency times the floor's bandwidth; reported so a figure reads as bytes moved, not a ratio.
inline double achieved_bytes_per_s(const DecodeBenchRow& r) {
  return r.median_us > 0 ? r.floor_bytes / (r.median_us * 1e-6) : 0.0;
}

struct DecodeBenchReport {
  std::string preset;  // preset name, or the checkpoint directory
  std::string gpu, commit, date, command_line;
  double bandwidth_bytes_per_s = 0;  // the floor's
  std::string bandwidth_source;      // where that figure comes from
  ModelConfig config;
  bool nvfp4 = true;
  double weight_gb = 0;  // all GPUs together
  int tp = 1, ep = 1;
  int logprobs_top = -1;  // DecodeBenchOptions::logprobs_top
  int prefill_tokens = 0;
  double prefill_us = 0, prefill_tokens_per_s = 0;
  PrefillFlops prefill_model_flops;  // perf/prefill_flops.h, for the timed prompt
  std::vector<DecodeOpTime> prefill_ops;  // one eager prefill timed per op kind (per_op)
  double prefill_eager_us = 0;
  std::vector<DecodeBenchRow> rows;
  // Layers recorded with the one-token folds (eager steps and graph captures; replays add none):
  // the post-attention norm into o_proj, and of those the MoE router too (moe/router_fold.h).
  int64_t folded_post_norms = 0, folded_routers = 0;
  // Layers recorded with their input norm folded into q/k/v (CudaOpsOptions::fold_input_norm).
  int64_t folded_input_norms = 0;
};

// The prefill's achieved FLOP rate: its model FLOPs over its median time (0 without a prefill).
inline double prefill_flops_per_s(const DecodeBenchReport& r) {
  return r.prefill_us > 0 ? r.prefill_model_flops.total() / (r.prefill_us * 1e-6) : 0.0;
}

// The structure of a model (views without data): what prepare_random reads. NVFP4: every
// linear but lm_head and the router (ModelOpt's default excludes); BF16: none.
model::ModelWeights shape_only_weights(const ModelConfig& c, bool nvfp4);

DecodeBenchReport run_decode_bench(const DecodeBenchOptions& o);
std::string decode_bench_markdown(const DecodeBenchReport& r);
nlohmann::json decode_bench_json(const DecodeBenchReport& r);

}  // namespace tetra::bench
