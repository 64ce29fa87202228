#include "perf/host_bandwidth.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"

namespace tetra {
namespace {

constexpr int64_t kMiB = int64_t(1) << 20;
constexpr int64_t kMinBuffer = 64 * kMiB, kMaxBuffer = 1024 * kMiB;

int64_t last_level_cache_bytes() {
  for (int name : {_SC_LEVEL4_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = sysconf(name);
    if (v > 0) return v;
  }
  return 0;
}

}  // namespace

HostBandwidth measure_host_read_bandwidth(int passes) {
  if (passes < 1) TETRA_FAIL("measure_host_read_bandwidth: passes must be at least 1");
  HostBandwidth b;
  b.last_level_cache_bytes = last_level_cache_bytes();
  b.buffer_bytes = std::clamp(2 * b.last_level_cache_bytes, kMinBuffer, kMaxBuffer);
  b.threads = hardware_threads();
  b.passes = passes;
  const int64_t words = b.buffer_bytes / 8;
  std::unique_ptr<uint64_t[]> buf(new uint64_t[size_t(words)]);  // [words]
  // Thread t always takes chunk t, so each reads what it wrote (its pages on its memory node).
  const int64_t chunk = (words + b.threads - 1) / b.threads;
  std::vector<uint64_t> sums(size_t(b.threads));
  auto each_chunk = [&](auto&& work) {
    parallel_for(b.threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) work(t, t * chunk, std::min(words, (t + 1) * chunk));
    }, b.threads);
  };
  each_chunk([&](int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) buf[size_t(i)] = uint64_t(i);
  });
  double best = 0;
  for (int p = 0; p < passes; ++p) {
    const auto start = std::chrono::steady_clock::now();
    each_chunk([&](int64_t t, int64_t begin, int64_t end) {
      uint64_t s = 0;
      for (int64_t i = begin; i < end; ++i) s += buf[size_t(i)];
      sums[size_t(t)] = s;
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, double(b.buffer_bytes) / seconds);
  }
  volatile uint64_t sink = 0;  // read by no one: the sums are used, so the loads stay
  for (uint64_t s : sums) sink = sink + s;
  b.bytes_per_s = best;
  return b;
}

std::string describe(const HostBandwidth& b) {
  char cache[64] = "size unknown";
  if (b.last_level_cache_bytes > 0)
    std::snprintf(cache, sizeof cache, "%lld MiB", static_cast<long long>(b.last_level_cache_bytes / kMiB));
  char out[256];
  std::snprintf(out, sizeof out,
                "host memory read, measured now (%d thread%s, best of %d reads of a %lld MiB "
                "buffer; last-level cache %s)",
                b.threads, b.threads == 1 ? "" : "s", b.passes,
                static_cast<long long>(b.buffer_bytes / kMiB), cache);
  return out;
}

}  // namespace tetra
