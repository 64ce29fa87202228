// Chrome trace (the JSON Perfetto and chrome://tracing open) of what the server did between
// /start_profile and /stop_profile. Process "tetra serve": one complete ("X") event per engine
// step with its prefill and decode phases as children (their times come from the engine's own
// stats), plus one async span per request from arrival to finish. Process "GPU" (cuda backend):
// one "X" event per kernel the device ran (short name, start, duration, the mangled symbol in
// args; one track per stream; kernels replayed inside CUDA graphs included), recorded by a
// KernelSource (CUPTI) and shifted onto the host events' clock. Without a kernel source (cpu backend) the trace says in otherData
// that no GPU kernels were recorded.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "server/kernel_tracer.h"

namespace tetra::server {

class Profiler {
 public:
  // False when a profile is already running. With a kernel source, starts it first: its
  // tetra::Error (e.g. libcupti missing) propagates and the profile does not start.
  // no_gpu_reason: what otherData says when there is no kernel source.
  bool start(KernelSource* gpu = nullptr, const std::string& no_gpu_reason = "no GPU kernel source");
  // The trace as JSON text; false (out untouched) when no profile is running. `other` is merged
  // into the trace's otherData (e.g. where the server wrote the file).
  bool stop(std::string& out, const nlohmann::json& other = nlohmann::json::object());
  bool active() const;
  // Microseconds since the profiler's epoch, for event timestamps.
  double now_us() const;
  void complete(const std::string& name, const std::string& cat, double ts_us, double dur_us,
                int tid, nlohmann::json args = nlohmann::json::object());
  void async_begin(const std::string& name, int64_t id, double ts_us, nlohmann::json args = nlohmann::json::object());
  void async_end(const std::string& name, int64_t id, double ts_us, nlohmann::json args = nlohmann::json::object());

 private:
  void add(nlohmann::json ev);
  mutable std::mutex mu_;
  bool active_ = false;
  nlohmann::json events_ = nlohmann::json::array();
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  KernelSource* gpu_ = nullptr;  // the running profile's kernel source, or none
  std::string no_gpu_reason_;
  uint64_t gpu_anchor_ns_ = 0;   // kernel clock at start ...
  double host_anchor_us_ = 0;    // ... and now_us() at the same moment
};

}  // namespace tetra::server
