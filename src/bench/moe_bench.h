// `tetra bench moe`: one full MoE layer of a preset's real shapes resident on the GPU (random
// weights generated there in each backend's format: NVFP4 for cuda-w4a16 and cuda-w4a4, BF16 for
// cuda-bf16), real routing of random activations, timed per token count.
//
// Method: per row, nbuf input buffers (enough that the experts they route to, and the inputs
// themselves, cannot stay in the 60 MB L2 between visits; at least 4), each forward captured in a
// CUDA graph (as a decode engine runs it); warm-up, then CUDA events around each graph launch;
// median and p90 of the launches. Bytes that must move = unique routed experts' weights in the
// backend's format (mean over the buffers' routings) + the shared expert's + the router weight +
// x read and out written (moe_bench_bytes). FLOPs = 2 * (T*top_k*3*H*I + T*3*H*Is + T*E*H). Floors: bytes / bandwidth and
// FLOPs / bf16 peak of the GPU (perf/gpu_spec: measured 4.46 TB/s and 785 TFLOP/s on the H200);
// the larger one binds; efficiency = floor / median.
//
// The layer's token path (moe::CudaTokenPath) can be changed for A/B runs through the environment:
// TETRA_MOE_TOKEN_PATH="persist=N,fused=N,slot=N,side=0|1,pdl=0|1,tpdl=0|1" (keys optional,
// others keep their defaults; persist: the one-launch layer up to N tokens, pdl: combine, tpdl:
// token path; "old" = all off, the launches before the small-T path). The
// report names the setting.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tetra::bench {

struct MoeBenchOptions {
  std::string preset = "glm5";
  std::vector<int> tokens = {1, 4, 16, 64, 256, 1024, 4096};
  std::string backend = "all";      // "all" or one backend name
  std::string routing = "uniform";  // "uniform" | "skewed" (bias +0.2 on every 8th expert)
  int iters = 0;                    // timed launches per row; 0 = about 0.3 s worth (10..200)
  std::string command_line;         // recorded in the report
};

struct MoeBenchRow {
  std::string backend;
  int tokens = 0;
  double unique_experts = 0;  // mean over the rotated inputs
  double median_us = 0, p90_us = 0;
  double bytes = 0, flops = 0;
  double gbs = 0, tflops = 0;
  double memory_floor_us = 0, compute_floor_us = 0, floor_us = 0;
  double efficiency = 0;  // floor_us / median_us
  std::string bound;      // "memory" | "compute"
  int buffers = 0, iters = 0;
};

// One forward split in parts (eager launches with events between them), median of the runs.
struct MoeBenchParts {
  std::string backend;
  int tokens = 0;
  double route_layout_us = 0, gemm1_us = 0, gemm2_us = 0, combine_us = 0, total_us = 0;
};

struct MoeBenchSkip {
  std::string backend, reason;
};

struct MoeBenchReport {
  std::string date, commit, gpu, command, preset, routing;
  std::string token_path;  // the layer's CudaTokenPath as "fused<=64 slot<=8 side=1 pdl=1"
  int experts = 0, hidden = 0, inter = 0, shared_inter = 0, top_k = 0;
  double bandwidth_bytes_per_s = 0, bf16_tflops = 0;
  std::vector<MoeBenchRow> rows;
  std::vector<MoeBenchParts> parts;
  std::vector<MoeBenchSkip> skipped;
};

// Checks the options (preset is a MoE model, tokens > 0, routing and backend known); throws
// tetra::Error with the reason. Needs no GPU.
void validate_moe_bench_options(const MoeBenchOptions& o);

// Bytes one forward of `tokens` tokens must move on `backend` when it routes to `unique` experts:
// those experts' weights in the backend's format (cuda-bf16: bf16; cuda-w4a16, cuda-w4a4: packed
// NVFP4 + scales), the shared expert's, the bf16 router weight, x read and out written (bf16).
double moe_bench_bytes(const std::string& preset, const std::string& backend, double unique,
                       int tokens);

// Why the benchmark cannot hold `backend`'s layer of o.preset (weights, scratch for the largest
// of o.tokens, its input buffers) in a GPU of `memory_bytes` ("" when it fits), against the share
// check leaves usable (perf/memory_fit.h). GLM-5 at BF16 is ~20 GB per layer.
std::string moe_bench_memory_reason(const MoeBenchOptions& o, const std::string& backend,
                                    int64_t memory_bytes);

// Runs the benchmark on GPU 0. Throws tetra::Error when there is no CUDA GPU.
MoeBenchReport run_moe_bench(const MoeBenchOptions& o);

std::string moe_bench_markdown(const MoeBenchReport& r);
nlohmann::json moe_bench_json(const MoeBenchReport& r);

}  // namespace tetra::bench
