// The host memory read bandwidth `tetra demo` holds the cpu backend against: the buffer is
// sized past the last-level cache within its bounds, the figure is a plausible DRAM rate, and
// the description names how it was measured.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/parallel.h"
#include "perf/host_bandwidth.h"

using namespace tetra;

TEST(HostBandwidth, ReadsABufferPastTheCacheAndGivesAPlausibleRate) {
  const HostBandwidth b = measure_host_read_bandwidth(2);
  constexpr int64_t kMiB = int64_t(1) << 20;
  EXPECT_GE(b.buffer_bytes, 64 * kMiB);
  EXPECT_LE(b.buffer_bytes, 1024 * kMiB);  // bounded, so the demo stays fast
  if (b.last_level_cache_bytes <= 512 * kMiB) EXPECT_GE(b.buffer_bytes, 2 * b.last_level_cache_bytes);
  EXPECT_EQ(b.threads, hardware_threads());
  EXPECT_EQ(b.passes, 2);
  // Between an old laptop's DRAM and more than any host has: 0.5 GB/s .. 5 TB/s.
  EXPECT_GT(b.bytes_per_s, 0.5e9);
  EXPECT_LT(b.bytes_per_s, 5e12);

  const std::string d = describe(b);
  EXPECT_NE(d.find("host memory read, measured now"), std::string::npos) << d;
  EXPECT_NE(d.find(std::to_string(b.buffer_bytes / kMiB) + " MiB buffer"), std::string::npos) << d;
  EXPECT_NE(d.find("best of 2 reads"), std::string::npos) << d;
}

TEST(HostBandwidth, RefusesNoPasses) {
  EXPECT_THROW(measure_host_read_bandwidth(0), Error);
}
