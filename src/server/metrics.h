// Server metrics, exported as Prometheus text on /metrics. Counters and histograms are written
// by the scheduler thread and read by HTTP threads, so everything sits behind one mutex.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tetra::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)), counts_(bounds_.size(), 0) {}
  void observe(double v);
  // Prometheus lines for `name` (cumulative _bucket{le=...}, _sum, _count).
  void write(std::string& out, const std::string& name, const std::string& help) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds] per bucket, not cumulative
  uint64_t count_ = 0;
  double sum_ = 0;
};

// The scheduler's state at its last step.
struct SchedulerGauges {
  int waiting = 0;  // queued, not yet prefilled
  int running = 0;
  int kv_blocks_used = 0;
  int kv_blocks_total = 0;
  int64_t preemptions = 0;     // engine total so far (a counter)
  int64_t prefill_chunks = 0;  // engine total so far (a counter)
  int64_t prefix_cached_tokens = 0;  // engine total so far (a counter)
};

class Metrics {
 public:
  Metrics();
  void set_gauges(const SchedulerGauges& g);
  void add_prompt_tokens(int64_t n);
  void add_generated_tokens(int64_t n);
  void request_finished(const std::string& finish_reason, double e2e_seconds);
  void request_rejected(int status);
  void observe_ttft(double s);
  void observe_itl(double s);
  SchedulerGauges gauges() const;
  std::string prometheus_text() const;

 private:
  mutable std::mutex mu_;
  SchedulerGauges gauges_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  std::map<std::string, int64_t> finished_;  // by finish reason
  std::map<int, int64_t> rejected_;          // by HTTP status
  Histogram ttft_, itl_, e2e_;
  double started_;  // steady-clock seconds at construction (for the uptime gauge)
};

}  // namespace tetra::server
