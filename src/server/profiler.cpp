#include "server/profiler.h"

#include <map>
#include <set>

#include "perf/kernel_name.h"

namespace tetra::server {
namespace {

constexpr int kHostPid = 1, kGpuPid = 2;

}  // namespace

bool Profiler::start(KernelSource* gpu, const std::string& no_gpu_reason) {
  std::lock_guard<std::mutex> l(mu_);
  if (active_) return false;
  if (gpu) {
    gpu->start();  // throws: the profile stays off
    gpu_anchor_ns_ = gpu->now_ns();
    host_anchor_us_ = now_us();
  }
  gpu_ = gpu;
  no_gpu_reason_ = no_gpu_reason;
  active_ = true;
  events_ = nlohmann::json::array();
  events_.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", kHostPid}, {"args", {{"name", "tetra serve"}}}});
  events_.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", kHostPid}, {"tid", 1}, {"args", {{"name", "scheduler"}}}});
  return true;
}

bool Profiler::stop(std::string& out, const nlohmann::json& other) {
  std::lock_guard<std::mutex> l(mu_);
  if (!active_) return false;
  active_ = false;
  nlohmann::json trace;
  nlohmann::json info = {{"gpu_kernel_events", 0}};
  if (gpu_) {
    const std::vector<KernelRecord> kernels = gpu_->stop();
    gpu_ = nullptr;
    events_.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", kGpuPid}, {"args", {{"name", "GPU"}}}});
    std::set<uint32_t> streams;
    std::map<std::string, int64_t> per_name;  // kernel name -> launches
    for (const KernelRecord& k : kernels) {
      // Kernel clock -> the host events' microseconds.
      const double ts = host_anchor_us_ + (double(int64_t(k.start_ns - gpu_anchor_ns_))) * 1e-3;
      nlohmann::json args = {{"device", k.device}, {"stream", k.stream}};
      if (k.graph_id != 0) args["graph"] = k.graph_id;
      // Demangled and without namespaces or parameters; the symbol stays in the args.
      const std::string name = perf::short_kernel_name(k.name);
      if (name != k.name) args["symbol"] = k.name;
      events_.push_back({{"name", name}, {"cat", "kernel"}, {"ph", "X"}, {"pid", kGpuPid},
                         {"tid", k.stream}, {"ts", ts}, {"dur", double(k.end_ns - k.start_ns) * 1e-3},
                         {"args", std::move(args)}});
      streams.insert(k.stream);
      ++per_name[name];
    }
    for (uint32_t s : streams)
      events_.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", kGpuPid}, {"tid", s},
                         {"args", {{"name", "stream " + std::to_string(s)}}}});
    info["gpu_kernel_events"] = kernels.size();
    info["gpu_kernels_by_name"] = per_name;
  } else {
    info["gpu_kernels"] = "none recorded: " + no_gpu_reason_;
  }
  for (const auto& [k, v] : other.items()) info[k] = v;
  trace["traceEvents"] = std::move(events_);
  trace["displayTimeUnit"] = "ms";
  trace["otherData"] = std::move(info);
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
  add({{"name", name}, {"cat", cat}, {"ph", "X"}, {"pid", kHostPid}, {"tid", tid}, {"ts", ts_us},
       {"dur", dur_us}, {"args", std::move(args)}});
}

void Profiler::async_begin(const std::string& name, int64_t id, double ts_us, nlohmann::json args) {
  add({{"name", name}, {"cat", "request"}, {"ph", "b"}, {"pid", kHostPid}, {"id", id}, {"ts", ts_us}, {"args", std::move(args)}});
}

void Profiler::async_end(const std::string& name, int64_t id, double ts_us, nlohmann::json args) {
  add({{"name", name}, {"cat", "request"}, {"ph", "e"}, {"pid", kHostPid}, {"id", id}, {"ts", ts_us}, {"args", std::move(args)}});
}

}  // namespace tetra::server
