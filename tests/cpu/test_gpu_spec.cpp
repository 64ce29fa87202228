// The GPU spec table: the rows the check command promises, numbers that match the docs they
// cite (DEVICE.md, KERNELS.md, NVFP4.md, the CUDA guide), a source for every number, detection.
#include <gtest/gtest.h>

#include <set>

#include "core/cuda_check.h"
#include "core/error.h"
#include "perf/gpu_spec.h"

using namespace tetra;

TEST(GpuSpec, TableHasTheAdvertisedRows) {
  const std::vector<std::string> expected = {"h100", "h200", "b200", "b300", "gb200",
                                             "rtx-pro-6000", "rtx-5090", "dgx-spark", "a100", "l40s"};
  EXPECT_EQ(gpu_names(), expected);
  std::set<std::string> unique(expected.begin(), expected.end());
  EXPECT_EQ(unique.size(), gpu_table().size());
}

TEST(GpuSpec, EveryNumberHasASource) {
  for (const GpuSpec& g : gpu_table()) {
    SCOPED_TRACE(g.name);
    EXPECT_FALSE(g.product.empty());
    for (const std::string* s : {&g.sources.arch, &g.sources.sms, &g.sources.smem, &g.sources.memory,
                                 &g.sources.bandwidth, &g.sources.bf16, &g.sources.fp4})
      EXPECT_GT(s->size(), 10u) << "missing source";
    EXPECT_GT(g.sms, 0);
    EXPECT_GT(g.memory_bytes, 0);
    EXPECT_GT(g.bandwidth_bytes_per_s, 1e11);
    EXPECT_FALSE(g.detected);
  }
}

TEST(GpuSpec, H200UsesTheMeasuredCeilingsOfDeviceMd) {
  const GpuSpec& g = gpu_spec("h200");
  EXPECT_EQ(g.sm(), 90);
  EXPECT_EQ(g.sms, 132);
  EXPECT_DOUBLE_EQ(g.bandwidth_bytes_per_s, 4.46e12);  // DEVICE.md: 4.46 TB/s
  EXPECT_DOUBLE_EQ(g.bf16_dense_tflops, 785);          // DEVICE.md: 785 TFLOP/s
  EXPECT_NEAR(double(g.memory_bytes) / (1024.0 * 1024 * 1024), 139.8, 0.01);
  EXPECT_NE(g.sources.bandwidth.find("DEVICE.md"), std::string::npos);
  EXPECT_TRUE(g.has_wgmma);
  EXPECT_FALSE(g.has_fp4_mma);
  EXPECT_EQ(g.fp4_dense_tflops, 0);
}

TEST(GpuSpec, KernelsMdFactsHold) {
  const GpuSpec& h100 = gpu_spec("h100");
  EXPECT_EQ(h100.sms, 132);
  EXPECT_EQ(h100.memory_bytes, int64_t(80e9));
  EXPECT_DOUBLE_EQ(h100.bandwidth_bytes_per_s, 3.35e12);
  const GpuSpec& pro = gpu_spec("rtx-pro-6000");
  EXPECT_EQ(pro.sms, 188);
  EXPECT_EQ(pro.memory_bytes, int64_t(96e9));
  EXPECT_NEAR(pro.bandwidth_bytes_per_s, 1.79e12, 0.01e12);
}

TEST(GpuSpec, FeatureFlagsFollowTheArchitecture) {
  for (const GpuSpec& g : gpu_table()) {
    SCOPED_TRACE(g.name);
    // NVFP4.md: SM100/SM103 have tcgen05; SM120/SM121 do not; SM90 has no FP4 MMA.
    EXPECT_EQ(g.has_tcgen05, g.cc_major == 10);
    EXPECT_EQ(g.has_wgmma, g.sm() == 90);
    EXPECT_EQ(g.has_fp4_mma, g.cc_major >= 10);
    EXPECT_EQ(g.fp4_dense_tflops > 0, g.has_fp4_mma);
  }
  EXPECT_EQ(gpu_spec("b300").sm(), 103);
  EXPECT_EQ(gpu_spec("dgx-spark").sm(), 121);
  EXPECT_EQ(gpu_spec("l40s").sm(), 89);
  EXPECT_EQ(gpu_spec("a100").sm(), 80);
}

TEST(GpuSpec, SharedMemoryPerBlockByComputeCapability) {
  // NVFP4.md: SM120/SM121 allow at most 101,376 B; KERNELS.md: SM90 up to 227 KB.
  for (const GpuSpec& g : gpu_table()) {
    SCOPED_TRACE(g.name);
    int64_t expected = 0;
    if (g.cc_major == 12 || g.sm() == 89) expected = 101376;
    if (g.cc_major == 9 || g.cc_major == 10) expected = 232448;
    if (g.sm() == 80) expected = 166912;
    EXPECT_EQ(g.smem_per_block, expected);
  }
}

TEST(GpuSpec, UnknownNameListsTheKnownOnes) {
  try {
    gpu_spec("h300");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("h300"), std::string::npos);
    for (const std::string& n : gpu_names()) EXPECT_NE(msg.find(n), std::string::npos) << n;
  }
  EXPECT_EQ(resolve_gpu("b200")->name, "b200");
  // Names as users write them: any case, the vendor in front, spaces for hyphens.
  EXPECT_EQ(resolve_gpu("H200")->name, "h200");
  EXPECT_EQ(gpu_spec("NVIDIA H100").name, "h100");
  EXPECT_EQ(gpu_spec("nvidia-b300").name, "b300");
  EXPECT_EQ(gpu_spec("RTX PRO 6000").name, "rtx-pro-6000");
  EXPECT_EQ(gpu_spec("DGX_Spark").name, "dgx-spark");
  EXPECT_THROW(gpu_spec("nvidia"), Error);
  EXPECT_THROW(gpu_spec("H200 NVL"), Error);  // another product: not guessed
}

TEST(GpuSpec, AutoDetectsOrAnswersNone) {
  const std::optional<GpuSpec> local = resolve_gpu("auto");
  EXPECT_EQ(local.has_value(), cuda_available());
  if (local) {
    EXPECT_TRUE(local->detected);
    EXPECT_GE(local->cc_major, 7);
    EXPECT_GT(local->sms, 0);
    EXPECT_GT(local->smem_per_block, 48 * 1024);
    EXPECT_GT(local->memory_bytes, 0);
  }
}

TEST(GpuSpec, HostMemoryIsKnown) {
  EXPECT_GT(host_memory_bytes(), int64_t(1) << 30);
}

TEST(GpuSpec, JsonCarriesNumbersAndSources) {
  const nlohmann::json j = gpu_spec_to_json(gpu_spec("rtx-5090"));
  EXPECT_EQ(j["sm"], 120);
  EXPECT_EQ(j["compute_capability"], "12.0");
  EXPECT_EQ(j["smem_per_block_bytes"], 101376);
  EXPECT_EQ(j["has_tcgen05"], false);
  for (const char* key : {"arch", "sms", "smem_per_block", "memory", "bandwidth", "bf16", "fp4"})
    EXPECT_TRUE(j["sources"].contains(key)) << key;
  EXPECT_EQ(sm_label(120), "SM120");
}
