// MoE backends declare what they can run as data. A backend implements the whole MoE layer
// (route, dispatch, GEMM1, activation, GEMM2, combine). `tetra check`, the `auto` choice and the
// runtime's refusal all read these declarations through `evaluate`, so they cannot disagree.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moe/moe_workload.h"
#include "perf/gpu_spec.h"

namespace tetra {

// Shared memory one block of the backend's kernels launches with. `from_moe_intermediate` > 0
// makes the need apply only from that intermediate size per GPU up (kernels that stage more),
// `from_experts` > 0 only from that many routed experts up.
struct SmemNeed {
  int64_t bytes = 0;
  int64_t from_moe_intermediate = 0;
  std::string source;
  int64_t from_experts = 0;
};

struct BackendCaps {
  std::string name;
  std::string summary;             // one line: what it is
  std::string origin;              // where its kernels live
  bool built = false;              // compiled into this version of Tetra
  std::vector<WeightFormat> weight_formats;  // expert weights it reads
  std::vector<ActFormat> act_formats;        // BF16 = W4A16, NVFP4 = W4A4
  bool needs_input_scale = false;  // W4A4: quantizes activations with the checkpoint's input_scale
  bool runs_on_cpu = false;        // no GPU needed
  std::vector<int> sms;            // allowed SM versions (90, 100, 103, 120, 121); GPU backends
  std::string sm_note;             // why, when it is a build fact: "binary built for sm_90a only"
  bool requires_tcgen05 = false;
  std::vector<SmemNeed> smem;      // largest applicable entry is the need
  std::string smem_unknown;        // GPU backends that declare no need: why there is none
  std::vector<TokenLayout> layouts;
  int64_t hidden_align = 1;        // hidden % hidden_align == 0
  int64_t inter_align = 1;         // moe intermediate per GPU % inter_align == 0
  int64_t max_tokens_per_launch = 0;  // 0 = no limit (the runtime chunks larger batches)
  bool multi_gpu = false;          // tp or ep > 1
  bool supports_ep = false;        // experts split across GPUs
  std::vector<std::string> activations;  // "silu" (SwiGLU), "relu2", ...
  int priority = 0;                // auto takes the highest-priority backend that can run
  std::vector<std::string> sources;  // where the facts above come from
};

// Every declared backend: Tetra's own first, then other engines' kernels (not built).
const std::vector<BackendCaps>& moe_backends();
std::vector<std::string> backend_names();
// nullptr when unknown.
const BackendCaps* find_backend(std::string_view name);

// Where the model would run: a GPU (from the table or detected; nullopt = this machine has
// none) and this machine's memory for the cpu backend.
struct Target {
  std::optional<GpuSpec> gpu;
  int64_t host_memory_bytes = 0;
};

struct Verdict {
  std::string backend;
  bool ok = false;
  std::vector<std::string> reasons;  // every reason it cannot run, empty when ok
  std::vector<std::string> unchecked;  // what could not be judged (an undeclared need), even when ok
};

// Shared memory the backend needs for this workload (0 = nothing declared).
int64_t smem_needed(const BackendCaps& caps, const MoeWorkload& w);
// The memory reason a GPU backend gives for this target, or nullopt when it fits. Every GPU
// backend gives the same one, so check prints it once.
std::optional<std::string> gpu_memory_reason(const MoeWorkload& w, const Target& t);

// All reasons the backend cannot run the workload on the target, not only the first.
Verdict evaluate(const BackendCaps& caps, const MoeWorkload& w, const Target& t);

// "12,345"
std::string format_count(int64_t n);

}  // namespace tetra
