// Chrome trace (the JSON Perfetto and chrome://tracing open) of what the scheduler did between
// /start_profile and /stop_profile: one complete ("X") event per engine step with its prefill
// and decode phases as children (their times come from the engine's own stats), plus one async
// span per request from arrival to finish. Per-kernel events are not recorded (CPU backend).
#pragma once
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace tetra::server {

class Profiler {
 public:
  // False when a profile is already running.
  bool start();
  // The trace as JSON text; false (out untouched) when no profile is running.
  bool stop(std::string& out);
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
};

}  // namespace tetra::server
