#include "server/metrics.h"

#include <chrono>
#include <sstream>

namespace tetra::server {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string num(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

void gauge(std::string& out, const std::string& name, const std::string& help, double v,
           const char* type = "gauge") {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + num(v) + "\n";
}

}  // namespace

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds_.size(); ++i)
    if (v <= bounds_[i]) {
      ++counts_[i];
      break;
    }
  ++count_;
  sum_ += v;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      itl_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}),
      e2e_({0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120}),
      started_(now_s()) {}

void Metrics::set_gauges(const SchedulerGauges& g) {
  std::lock_guard<std::mutex> l(mu_);
  gauges_ = g;
}
void Metrics::add_prompt_tokens(int64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_tokens_ += n;
}
void Metrics::add_generated_tokens(int64_t n) {
  std::lock_guard<std::mutex> l(mu_);
  generated_tokens_ += n;
}
void Metrics::request_finished(const std::string& finish_reason, double e2e_seconds) {
  std::lock_guard<std::mutex> l(mu_);
  ++finished_[finish_reason];
  e2e_.observe(e2e_seconds);
}
void Metrics::request_rejected(int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++rejected_[status];
}
void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> l(mu_);
  ttft_.observe(s);
}
void Metrics::observe_itl(double s) {
  std::lock_guard<std::mutex> l(mu_);
  itl_.observe(s);
}
SchedulerGauges Metrics::gauges() const {
  std::lock_guard<std::mutex> l(mu_);
  return gauges_;
}

std::string Metrics::prometheus_text() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out;
  gauge(out, "tetra_requests_waiting", "Requests queued, not yet prefilled.", gauges_.waiting);
  gauge(out, "tetra_requests_running", "Requests in the running batch.", gauges_.running);
  gauge(out, "tetra_kv_cache_blocks_used", "KV cache blocks held by sequences.", gauges_.kv_blocks_used);
  gauge(out, "tetra_kv_cache_blocks_total", "KV cache blocks in all.", gauges_.kv_blocks_total);
  gauge(out, "tetra_kv_cache_usage_ratio", "Fraction of KV cache blocks in use.",
        gauges_.kv_blocks_total ? double(gauges_.kv_blocks_used) / gauges_.kv_blocks_total : 0.0);
  gauge(out, "tetra_prompt_tokens_total", "Prompt tokens admitted.", double(prompt_tokens_), "counter");
  gauge(out, "tetra_generation_tokens_total", "Tokens generated.", double(generated_tokens_), "counter");
  gauge(out, "tetra_preemptions_total",
        "Requests preempted for KV cache space (blocks freed, prompt + output recomputed later).",
        double(gauges_.preemptions), "counter");
  gauge(out, "tetra_prefill_chunks_total", "Prefill runs of one sequence (a chunked prompt counts each chunk).",
        double(gauges_.prefill_chunks), "counter");
  gauge(out, "tetra_prefix_cache_hit_tokens_total", "Admitted tokens whose KV came from the prefix cache (not prefilled).",
        double(gauges_.prefix_cached_tokens), "counter");
  gauge(out, "tetra_uptime_seconds", "Seconds since the server started.", now_s() - started_);
  out += "# HELP tetra_requests_finished_total Requests finished, by finish reason.\n"
         "# TYPE tetra_requests_finished_total counter\n";
  for (const auto& [reason, n] : finished_)
    out += "tetra_requests_finished_total{finish_reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
  out += "# HELP tetra_requests_rejected_total Requests answered with an error status.\n"
         "# TYPE tetra_requests_rejected_total counter\n";
  for (const auto& [status, n] : rejected_)
    out += "tetra_requests_rejected_total{status=\"" + std::to_string(status) + "\"} " + std::to_string(n) + "\n";
  ttft_.write(out, "tetra_time_to_first_token_seconds", "Time from arrival to the first token.");
  itl_.write(out, "tetra_inter_token_latency_seconds", "Time between consecutive tokens of a request.");
  e2e_.write(out, "tetra_e2e_request_latency_seconds", "Time from arrival to the last token.");
  return out;
}

}  // namespace tetra::server
