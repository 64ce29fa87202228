// How fast this machine's CPUs read main memory: the bandwidth `tetra demo` holds the cpu
// backend's decode against, since the GPU table has no row for a host.
//
// Method: a buffer of twice the last-level cache (at least 64 MiB, at most 1 GiB, so it stays
// well under a second) is written once, so that its pages exist, then read whole `passes` times
// by as many threads as the cpu backend's parallel_for uses, summing its 64-bit words; the
// fastest pass counts. A sequential scan twice the cache's size finds next to nothing in it.
#pragma once
#include <cstdint>
#include <string>

namespace tetra {

struct HostBandwidth {
  double bytes_per_s = 0;
  int64_t buffer_bytes = 0;
  int64_t last_level_cache_bytes = 0;  // 0: the system does not say
  int threads = 0, passes = 0;
};

HostBandwidth measure_host_read_bandwidth(int passes = 3);

// Where the figure comes from: "host memory read, measured now (2 threads, best of 3 reads of
// a 960 MiB buffer; last-level cache 480 MiB)"
std::string describe(const HostBandwidth& b);

}  // namespace tetra
