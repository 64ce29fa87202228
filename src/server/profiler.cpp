#include "server/profiler.h"

namespace tetra::server {

bool Profiler::start() {
  std::lock_guard<std::mutex> l(mu_);
  if (active_) return false;
  active_ = true;
  events_ = nlohmann::json::array();
  events_.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "tetra serve"}}}});
  events_.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", 1}, {"args", {{"name", "scheduler"}}}});
  return true;
}

bool Profiler::stop(std::string& out) {
  std::lock_guard<std::mutex> l(mu_);
  if (!active_) return false;
  active_ = false;
  nlohmann::json trace;
  trace["traceEvents"] = std::move(events_);
  trace["displayTimeUnit"] = "ms";
  events_ = nlohmann::json::array();
  out = trace.dump();
  return true;
}

bool Profiler::active() const {
  std::lock_guard<std::mutex> l(mu_);
  return active_;
}

double Profiler::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch_).count();
}

void Profiler::add(nlohmann::json ev) {
  std::lock_guard<std::mutex> l(mu_);
  if (active_) events_.push_back(std::move(ev));
}

void Profiler::complete(const std::string& name, const std::string& cat, double ts_us, double dur_us,
                        int tid, nlohmann::json args) {
  add({{"name", name}, {"cat", cat}, {"ph", "X"}, {"pid", 1}, {"tid", tid}, {"ts", ts_us},
       {"dur", dur_us}, {"args", std::move(args)}});
}

void Profiler::async_begin(const std::string& name, int64_t id, double ts_us, nlohmann::json args) {
  add({{"name", name}, {"cat", "request"}, {"ph", "b"}, {"pid", 1}, {"id", id}, {"ts", ts_us}, {"args", std::move(args)}});
}

void Profiler::async_end(const std::string& name, int64_t id, double ts_us, nlohmann::json args) {
  add({{"name", name}, {"cat", "request"}, {"ph", "e"}, {"pid", 1}, {"id", id}, {"ts", ts_us}, {"args", std::move(args)}});
}

}  // namespace tetra::server
