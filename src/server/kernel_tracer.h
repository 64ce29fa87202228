// Per-kernel GPU timing for the profiler: CUPTI's activity API records one entry per kernel
// the device ran (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which also reports the kernel nodes of
// replayed CUDA graphs). libcupti is loaded with dlopen when a trace starts, so the binary runs
// without it; TETRA_CUPTI_LIBRARY names the library file to load instead of the usual places.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tetra::server {

struct KernelRecord {
  std::string name;           // mangled kernel name as CUPTI reports it
  uint64_t start_ns = 0;      // CUPTI clock
  uint64_t end_ns = 0;
  uint32_t device = 0;
  uint32_t stream = 0;
  uint32_t graph_id = 0;      // 0: launched outside a graph
};

// Where kernel records come from; the profiler uses the CUPTI one on the cuda backend, tests
// a fake.
class KernelSource {
 public:
  virtual ~KernelSource() = default;
  // Starts recording; throws tetra::Error with the reason when it cannot.
  virtual void start() = 0;
  // Stops recording and returns every kernel since start().
  virtual std::vector<KernelRecord> stop() = 0;
  // The current time on the records' clock (to align them with host events).
  virtual uint64_t now_ns() = 0;
};

// The CUPTI source. One per process at a time (CUPTI's activity buffers are process-wide).
class CuptiKernelSource final : public KernelSource {
 public:
  void start() override;
  std::vector<KernelRecord> stop() override;
  uint64_t now_ns() override;
};

}  // namespace tetra::server
