// GPU facts that decide which kernels can run and how fast: a table of known GPUs (every number
// cited) and detection of the local GPU. `tetra check` and the roofline read these.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tetra {

// Where each number of one row comes from: a datasheet, the CUDA programming guide, a
// measurement in DEVICE.md, or this machine's driver. Printed by `tetra check --json`.
struct GpuSpecSources {
  std::string arch;       // compute capability and the feature flags
  std::string sms;
  std::string smem;       // max shared memory per block
  std::string memory;
  std::string bandwidth;
  std::string bf16;
  std::string fp4;
};

struct GpuSpec {
  std::string name;                // table key ("h200"), or "local" for the detected GPU
  std::string product;             // marketing name ("NVIDIA H200 SXM")
  int cc_major = 0, cc_minor = 0;  // compute capability: 9.0, 10.0, 12.0, ...
  int sms = 0;                     // streaming multiprocessors
  int64_t smem_per_block = 0;      // bytes of shared memory one block may opt in to
  int64_t memory_bytes = 0;        // device memory (datasheet GB taken as 10^9 bytes)
  double bandwidth_bytes_per_s = 0;
  double bf16_dense_tflops = 0;    // dense tensor-core BF16 (FP32 accumulate); 0 = not published
  double fp4_dense_tflops = 0;     // dense FP4 tensor core; 0 = no FP4 tensor cores / unknown
  bool has_tcgen05 = false;        // SM100-family tensor memory MMA
  bool has_wgmma = false;          // SM90 warpgroup MMA
  bool has_fp4_mma = false;        // any block-scaled FP4 tensor-core instruction
  bool nvlink = false;             // GPU-to-GPU NVLink in the usual system
  bool detected = false;           // read from this machine's driver, not the table
  GpuSpecSources sources;

  int sm() const { return cc_major * 10 + cc_minor; }  // 90, 100, 103, 120, 121
};

// "SM90", "SM120": how reasons name an architecture.
std::string sm_label(int sm);

const std::vector<GpuSpec>& gpu_table();
std::vector<std::string> gpu_names();  // table keys, in table order
// The table key a user's name means: lower case, spaces and underscores as hyphens, without a
// leading "NVIDIA" ("NVIDIA H200" -> "h200", "RTX PRO 6000" -> "rtx-pro-6000").
std::string gpu_key(std::string_view name);
// Table row by name (as gpu_key reads it); Error listing the known names when unknown.
const GpuSpec& gpu_spec(std::string_view name);

// The local GPU (device 0) from cudaGetDeviceProperties; nullopt on a machine without CUDA.
// Peak rates come from the table row with the same compute capability, SM count and product name.
std::optional<GpuSpec> detect_local_gpu();

// "auto": the detected GPU or nullopt; otherwise the table row (Error when unknown).
std::optional<GpuSpec> resolve_gpu(std::string_view name);

// Installed physical memory of this machine, bytes (what the cpu backend has to work with).
int64_t host_memory_bytes();

nlohmann::json gpu_spec_to_json(const GpuSpec& gpu);

}  // namespace tetra
