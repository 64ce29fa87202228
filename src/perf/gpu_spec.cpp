#include "perf/gpu_spec.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>

#include <cuda_runtime.h>

#include "core/cuda_check.h"
#include "core/error.h"

namespace tetra {
namespace {

// Shared memory per block (opt-in maximum) by compute capability, from the CUDA C++ Programming
// Guide, "Technical Specifications per Compute Capability": 8.0: 163 KB, 8.9: 99 KB,
// 9.0: 227 KB, 10.x: 227 KB, 12.x: 99 KB (1 KB = 1024 B).
constexpr int64_t kSmem163K = 163 * 1024;  // 166,912 B
constexpr int64_t kSmem99K = 99 * 1024;    // 101,376 B
constexpr int64_t kSmem227K = 227 * 1024;  // 232,448 B
constexpr const char* kGuideSmem =
    "CUDA C++ Programming Guide, Technical Specifications per Compute Capability "
    "(https://docs.nvidia.com/cuda/cuda-c-programming-guide/#features-and-technical-specifications)";

constexpr double kGB = 1e9;
constexpr double kTB = 1e12;

std::vector<GpuSpec> build_table() {
  std::vector<GpuSpec> t;

  {  // H100 SXM5 80 GB
    GpuSpec g;
    g.name = "h100";
    g.product = "NVIDIA H100 SXM 80GB";
    g.cc_major = 9, g.cc_minor = 0;
    g.sms = 132;
    g.smem_per_block = kSmem227K;
    g.memory_bytes = int64_t(80 * kGB);
    g.bandwidth_bytes_per_s = 3.35 * kTB;
    g.bf16_dense_tflops = 989.5;  // datasheet: 1,979 TFLOPS with sparsity
    g.fp4_dense_tflops = 0;
    g.has_wgmma = true, g.nvlink = true;
    g.sources = {"Hopper: wgmma/TMA, no FP4 MMA (NVIDIA Hopper architecture whitepaper; KERNELS.md)",
                 "NVIDIA H100 Tensor Core GPU architecture whitepaper: 132 SMs on H100 SXM5",
                 kGuideSmem,
                 "NVIDIA H100 datasheet (https://www.nvidia.com/en-us/data-center/h100/): 80 GB",
                 "NVIDIA H100 datasheet: 3.35 TB/s",
                 "NVIDIA H100 datasheet: BF16 1,979 TFLOPS with sparsity, half dense",
                 "no FP4 tensor cores on SM90 (NVFP4.md)"};
    t.push_back(g);
  }
  {  // H200 SXM 141 GB: the measured machine of DEVICE.md, measured ceilings preferred
    GpuSpec g;
    g.name = "h200";
    g.product = "NVIDIA H200 SXM 141GB";
    g.cc_major = 9, g.cc_minor = 0;
    g.sms = 132;
    g.smem_per_block = kSmem227K;
    g.memory_bytes = int64_t(139.8 * 1024 * 1024 * 1024);  // 139.8 GiB usable, measured
    g.bandwidth_bytes_per_s = 4.46 * kTB;                   // measured; datasheet 4.8 TB/s
    g.bf16_dense_tflops = 785;                              // measured; datasheet 989 dense
    g.fp4_dense_tflops = 0;
    g.has_wgmma = true, g.nvlink = true;
    g.sources = {"Hopper: wgmma/TMA, no FP4 MMA (KERNELS.md)",
                 "DEVICE.md, measured on the H200: 132 SMs",
                 kGuideSmem,
                 "DEVICE.md, measured: 139.8 GiB usable (datasheet "
                 "https://www.nvidia.com/en-us/data-center/h200/: 141 GB)",
                 "DEVICE.md, measured: 4.46 TB/s HBM read (datasheet: 4.8 TB/s)",
                 "DEVICE.md, measured: 785 TFLOP/s bf16 GEMM 8192^3 (datasheet: 1,979 sparse)",
                 "no FP4 tensor cores on SM90 (NVFP4.md)"};
    t.push_back(g);
  }
  {  // HGX B200 (1,000 W)
    GpuSpec g;
    g.name = "b200";
    g.product = "NVIDIA B200 (HGX)";
    g.cc_major = 10, g.cc_minor = 0;
    g.sms = 148;
    g.smem_per_block = kSmem227K;
    g.memory_bytes = int64_t(180 * kGB);
    g.bandwidth_bytes_per_s = 8 * kTB;
    g.bf16_dense_tflops = 2250;
    g.fp4_dense_tflops = 9000;
    g.has_tcgen05 = true, g.has_fp4_mma = true, g.nvlink = true;
    g.sources = {"SM100: tcgen05 MMA with tensor memory, native block-scaled FP4 (KERNELS.md)",
                 "Chips and Cheese, \"Nvidia's B200: Keeping the CUDA Juggernaut Rolling\": "
                 "74 SMs enabled per die, 148 per GPU",
                 kGuideSmem,
                 "NVIDIA DGX B200 datasheet: 1,440 GB HBM3e for 8 GPUs = 180 GB each",
                 "NVIDIA DGX B200 datasheet: 64 TB/s for 8 GPUs = 8 TB/s each",
                 "NVIDIA HGX B200 specifications as tabulated at "
                 "https://glennklockwood.com/garden/processors/B200: BF16 2,250 dense",
                 "same source: FP4 9,000 TFLOPS dense (18,000 sparse)"};
    t.push_back(g);
  }
  {  // HGX B300 (Blackwell Ultra)
    GpuSpec g;
    g.name = "b300";
    g.product = "NVIDIA B300 (Blackwell Ultra, HGX)";
    g.cc_major = 10, g.cc_minor = 3;
    g.sms = 148;
    g.smem_per_block = kSmem227K;
    g.memory_bytes = int64_t(288 * kGB);
    g.bandwidth_bytes_per_s = 8 * kTB;
    g.bf16_dense_tflops = 2250;
    g.fp4_dense_tflops = 15000;
    g.has_tcgen05 = true, g.has_fp4_mma = true, g.nvlink = true;
    g.sources = {"SM103: tcgen05 + block-scaled FP4 (NVFP4.md: SM100/SM103 have tcgen05)",
                 "NVIDIA blog \"Inside NVIDIA Blackwell Ultra\" gives 160 SMs for the full die; the "
                 "enabled count of B300 products is not published: 148 assumed as on B200",
                 kGuideSmem,
                 "NVIDIA blog \"Inside NVIDIA Blackwell Ultra\" "
                 "(https://developer.nvidia.com/blog/inside-nvidia-blackwell-ultra-the-chip-powering-the-ai-factory-era): 288 GB HBM3e",
                 "same NVIDIA blog: 8 TB/s per GPU",
                 "HGX B300 specifications as tabulated at "
                 "https://glennklockwood.com/garden/processors/B300: BF16 2,250 dense",
                 "same NVIDIA blog: 15 PFLOPS dense NVFP4"};
    t.push_back(g);
  }
  {  // GB200 NVL72: one Blackwell GPU of the superchip (1,200 W)
    GpuSpec g;
    g.name = "gb200";
    g.product = "NVIDIA GB200 (one Blackwell GPU of NVL72)";
    g.cc_major = 10, g.cc_minor = 0;
    g.sms = 148;
    g.smem_per_block = kSmem227K;
    g.memory_bytes = int64_t(186 * kGB);
    g.bandwidth_bytes_per_s = 8 * kTB;
    g.bf16_dense_tflops = 2500;
    g.fp4_dense_tflops = 10000;
    g.has_tcgen05 = true, g.has_fp4_mma = true, g.nvlink = true;
    g.sources = {"SM100: tcgen05 + block-scaled FP4 (KERNELS.md)",
                 "hmc-tech.com B200 vs GB200 spec sheet: 296 SMs per 2-GPU superchip = 148",
                 kGuideSmem,
                 "NVIDIA GB200 NVL72 datasheet (https://www.nvidia.com/en-us/data-center/gb200-nvl72/): "
                 "13.4 TB HBM3e for 72 GPUs = 186 GB each",
                 "NVIDIA GB200 NVL72 datasheet: 576 TB/s for 72 GPUs = 8 TB/s each",
                 "GB200 variant at 1,200 W as tabulated at "
                 "https://glennklockwood.com/garden/processors/B200: BF16 2,500 dense",
                 "same source: FP4 10,000 TFLOPS dense (20,000 sparse)"};
    t.push_back(g);
  }
  {  // RTX PRO 6000 Blackwell Workstation Edition
    GpuSpec g;
    g.name = "rtx-pro-6000";
    g.product = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition";
    g.cc_major = 12, g.cc_minor = 0;
    g.sms = 188;
    g.smem_per_block = kSmem99K;
    g.memory_bytes = int64_t(96 * kGB);
    g.bandwidth_bytes_per_s = 1.792 * kTB;
    g.bf16_dense_tflops = 500;
    g.fp4_dense_tflops = 2000;
    g.has_fp4_mma = true;
    g.sources = {"SM120: block-scaled FP4 through warp-level mma.sync, no tcgen05/TMEM (KERNELS.md; "
                 "NVFP4.md)",
                 "NVIDIA RTX PRO 6000 Blackwell announcement (GTC 2025): 188 SMs, 24,064 CUDA cores",
                 kGuideSmem,
                 "NVIDIA RTX PRO 6000 Blackwell datasheet: 96 GB GDDR7 (ECC)",
                 "NVIDIA RTX PRO 6000 Blackwell datasheet: 1,792 GB/s",
                 "not published; derived as FP4 dense / 4 (full-rate FP32 accumulate assumed)",
                 "NVIDIA RTX PRO 6000 Blackwell datasheet: 4,000 AI TOPS (FP4, sparse) = 2,000 dense"};
    t.push_back(g);
  }
  {  // GeForce RTX 5090
    GpuSpec g;
    g.name = "rtx-5090";
    g.product = "NVIDIA GeForce RTX 5090";
    g.cc_major = 12, g.cc_minor = 0;
    g.sms = 170;
    g.smem_per_block = kSmem99K;
    g.memory_bytes = int64_t(32 * kGB);
    g.bandwidth_bytes_per_s = 1.792 * kTB;
    g.bf16_dense_tflops = 209.5;
    g.fp4_dense_tflops = 1676;
    g.has_fp4_mma = true;
    g.sources = {"SM120: block-scaled FP4 through mma.sync, no tcgen05/TMEM (KERNELS.md)",
                 "NVIDIA GeForce RTX 5090 specifications: 21,760 CUDA cores = 170 SMs",
                 kGuideSmem,
                 "NVIDIA GeForce RTX 5090 specifications: 32 GB GDDR7",
                 "NVIDIA GeForce RTX 5090 specifications: 1,792 GB/s",
                 "NVIDIA RTX Blackwell GPU architecture whitepaper: FP16/BF16 tensor with FP32 "
                 "accumulate 209.5 TFLOPS dense",
                 "NVIDIA GeForce RTX 5090 specifications: 3,352 AI TOPS (FP4, sparse) = 1,676 dense"};
    t.push_back(g);
  }
  {  // DGX Spark (GB10)
    GpuSpec g;
    g.name = "dgx-spark";
    g.product = "NVIDIA DGX Spark (GB10)";
    g.cc_major = 12, g.cc_minor = 1;
    g.sms = 48;
    g.smem_per_block = kSmem99K;
    g.memory_bytes = int64_t(128 * kGB);
    g.bandwidth_bytes_per_s = 273 * kGB;
    g.bf16_dense_tflops = 0;
    g.fp4_dense_tflops = 500;
    g.has_fp4_mma = true;
    g.sources = {"SM121: like SM120, no tcgen05/TMEM (NVFP4.md); compute capability 12.1 per the "
                 "DGX Spark hardware guide",
                 "NVIDIA DGX Spark hardware guide: 6,144 CUDA cores = 48 SMs of 128",
                 kGuideSmem,
                 "NVIDIA DGX Spark product page: 128 GB LPDDR5x unified (shared with the CPU)",
                 "NVIDIA DGX Spark product page: 273 GB/s",
                 "not published by NVIDIA (0 = unknown)",
                 "NVIDIA DGX Spark product page: 1 PFLOP FP4 with sparsity = 500 dense"};
    t.push_back(g);
  }
  {  // A100 SXM4 80 GB
    GpuSpec g;
    g.name = "a100";
    g.product = "NVIDIA A100 SXM4 80GB";
    g.cc_major = 8, g.cc_minor = 0;
    g.sms = 108;
    g.smem_per_block = kSmem163K;
    g.memory_bytes = int64_t(80 * kGB);
    g.bandwidth_bytes_per_s = 2.039 * kTB;
    g.bf16_dense_tflops = 312;
    g.fp4_dense_tflops = 0;
    g.nvlink = true;
    g.sources = {"SM80: mma.sync bf16, no FP8 or FP4 MMA (KERNELS.md)",
                 "NVIDIA A100 Tensor Core GPU architecture whitepaper: 108 SMs",
                 kGuideSmem,
                 "NVIDIA A100 datasheet (https://www.nvidia.com/en-us/data-center/a100/): 80 GB HBM2e",
                 "NVIDIA A100 datasheet: 2,039 GB/s (80GB SXM)",
                 "NVIDIA A100 datasheet: BF16 312 TFLOPS dense (624 sparse)",
                 "no FP4 tensor cores on SM80"};
    t.push_back(g);
  }
  {  // L40S
    GpuSpec g;
    g.name = "l40s";
    g.product = "NVIDIA L40S";
    g.cc_major = 8, g.cc_minor = 9;
    g.sms = 142;
    g.smem_per_block = kSmem99K;
    g.memory_bytes = int64_t(48 * kGB);
    g.bandwidth_bytes_per_s = 864 * kGB;
    g.bf16_dense_tflops = 362.05;
    g.fp4_dense_tflops = 0;
    g.sources = {"SM89: FP8 but no FP4 MMA, no wgmma (KERNELS.md)",
                 "NVIDIA L40S datasheet: 18,176 CUDA cores = 142 SMs",
                 kGuideSmem,
                 "NVIDIA L40S datasheet (https://www.nvidia.com/en-us/data-center/l40s/): 48 GB GDDR6",
                 "NVIDIA L40S datasheet: 864 GB/s",
                 "NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 sparse)",
                 "no FP4 tensor cores on SM89"};
    t.push_back(g);
  }
  return t;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Words in the driver's product name that identify a table row ("NVIDIA H200" -> h200).
const char* product_token(std::string_view key) {
  if (key == "rtx-pro-6000") return "rtx pro 6000";
  if (key == "rtx-5090") return "rtx 5090";
  if (key == "dgx-spark") return "gb10";
  return nullptr;  // the key itself ("h200", "b200", ...) is the token
}

const GpuSpec* matching_row(const std::string& product, int sm, int sms) {
  const std::string name = lower(product);
  for (const GpuSpec& row : gpu_table()) {
    const char* tok = product_token(row.name);
    const std::string token = tok ? tok : row.name;
    if (row.sm() == sm && row.sms == sms && name.find(token) != std::string::npos) return &row;
  }
  return nullptr;
}

}  // namespace

std::string sm_label(int sm) { return str("SM", sm); }

const std::vector<GpuSpec>& gpu_table() {
  static const std::vector<GpuSpec> table = build_table();
  return table;
}

std::vector<std::string> gpu_names() {
  std::vector<std::string> names;
  for (const GpuSpec& g : gpu_table()) names.push_back(g.name);
  return names;
}

std::string gpu_key(std::string_view name) {
  std::string key;
  for (char c : name)
    key += c == ' ' || c == '_' ? '-' : char(std::tolower(static_cast<unsigned char>(c)));
  for (std::string_view vendor : {"nvidia-", "nvidia"})
    if (key.rfind(vendor, 0) == 0 && key.size() > vendor.size()) key.erase(0, vendor.size());
  return key;
}

const GpuSpec& gpu_spec(std::string_view name) {
  const std::string key = gpu_key(name);
  for (const GpuSpec& g : gpu_table())
    if (g.name == key) return g;
  std::string known;
  for (const std::string& n : gpu_names()) known += (known.empty() ? "" : ", ") + n;
  TETRA_FAIL("unknown GPU '", name, "'; known: auto, ", known);
}

std::optional<GpuSpec> detect_local_gpu() {
  if (!cuda_available()) return std::nullopt;
  cudaDeviceProp prop{};
  TETRA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  GpuSpec g;
  g.name = "local";
  g.product = prop.name;
  g.cc_major = prop.major, g.cc_minor = prop.minor;
  g.sms = prop.multiProcessorCount;
  g.smem_per_block = int64_t(prop.sharedMemPerBlockOptin);
  g.memory_bytes = int64_t(prop.totalGlobalMem);
  g.detected = true;
  // Feature flags follow the compute capability (KERNELS.md "Other GPUs").
  g.has_tcgen05 = g.cc_major == 10 || g.cc_major == 11;
  g.has_wgmma = g.sm() == 90;
  g.has_fp4_mma = g.cc_major >= 10;
  const std::string driver = "cudaGetDeviceProperties on this machine";
  g.sources = {driver + " (features from the compute capability)", driver, driver, driver, "", "", ""};
  if (const GpuSpec* row = matching_row(g.product, g.sm(), g.sms)) {
    g.bandwidth_bytes_per_s = row->bandwidth_bytes_per_s;
    g.bf16_dense_tflops = row->bf16_dense_tflops;
    g.fp4_dense_tflops = row->fp4_dense_tflops;
    g.nvlink = row->nvlink;
    g.sources.bandwidth = str("table row ", row->name, ": ", row->sources.bandwidth);
    g.sources.bf16 = str("table row ", row->name, ": ", row->sources.bf16);
    g.sources.fp4 = str("table row ", row->name, ": ", row->sources.fp4);
  } else {
    // Unknown product: the bus gives a theoretical bandwidth (double data rate); peaks unknown.
    int clock_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0) == cudaSuccess)
      g.bandwidth_bytes_per_s = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0);
    cudaGetLastError();
    g.sources.bandwidth = "2 x memory clock x bus width from the driver (theoretical)";
    g.sources.bf16 = "unknown product: not in the table (0 = unknown)";
    g.sources.fp4 = g.sources.bf16;
  }
  return g;
}

std::optional<GpuSpec> resolve_gpu(std::string_view name) {
  if (gpu_key(name) == "auto") return detect_local_gpu();
  return gpu_spec(name);
}

int64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return int64_t(pages) * int64_t(page_size);
}

nlohmann::json gpu_spec_to_json(const GpuSpec& g) {
  nlohmann::json j;
  j["name"] = g.name;
  j["product"] = g.product;
  j["compute_capability"] = str(g.cc_major, ".", g.cc_minor);
  j["sm"] = g.sm();
  j["sms"] = g.sms;
  j["smem_per_block_bytes"] = g.smem_per_block;
  j["memory_bytes"] = g.memory_bytes;
  j["bandwidth_bytes_per_s"] = g.bandwidth_bytes_per_s;
  j["bf16_dense_tflops"] = g.bf16_dense_tflops;
  j["fp4_dense_tflops"] = g.fp4_dense_tflops;
  j["has_tcgen05"] = g.has_tcgen05;
  j["has_wgmma"] = g.has_wgmma;
  j["has_fp4_mma"] = g.has_fp4_mma;
  j["nvlink"] = g.nvlink;
  j["detected"] = g.detected;
  j["sources"] = {{"arch", g.sources.arch},           {"sms", g.sources.sms},
                  {"smem_per_block", g.sources.smem}, {"memory", g.sources.memory},
                  {"bandwidth", g.sources.bandwidth}, {"bf16", g.sources.bf16},
                  {"fp4", g.sources.fp4}};
  return j;
}

}  // namespace tetra
