// `tetra bench serve`: load test of a running `tetra serve` over real HTTP with streaming, in the
// manner of SGLang's bench_serving. For each concurrency level, `requests` requests go out from
// that many client threads (each sends its next request when the last one ends). Every request
// is POST /generate with `input_len` random token ids (in [1, 256), valid for any vocabulary),
// max_new_tokens = output_len, greedy, stream = true: one SSE event per engine step, so each
// token's arrival time is seen. Per request: TTFT (send -> first token), ITL (gaps between
// tokens), TPOT ((e2e - TTFT) / (tokens - 1)), e2e. Reported: mean, p50, p90, p99 of each (ms),
// requests/s, output tokens/s, total (input + output) tokens/s over the level's wall time.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tetra::bench {

struct ServeBenchOptions {
  std::string url = "http://127.0.0.1:8000";
  std::vector<int> concurrency = {1, 8, 64};
  int requests = 64;  // per concurrency level
  int input_len = 128;
  int output_len = 128;
  uint64_t seed = 1;
  double timeout_s = 600;
};

struct LatencyStats {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;  // ms
};
// Percentiles by linear interpolation between closest ranks (numpy's default); all 0 when empty.
LatencyStats latency_stats(std::vector<double> values);

struct ServeBenchPoint {
  int concurrency = 0;
  int completed = 0, failed = 0;
  std::string first_error;  // of the failed requests, if any
  double duration_s = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  double request_throughput = 0;       // completed requests / s
  double output_token_throughput = 0;  // output tokens / s
  double total_token_throughput = 0;   // (input + output) tokens / s
  LatencyStats ttft, tpot, itl, e2e;
};

void validate_serve_bench_options(const ServeBenchOptions& o);
std::vector<ServeBenchPoint> run_serve_bench(const ServeBenchOptions& o);
std::string serve_bench_markdown(const ServeBenchOptions& o, const std::vector<ServeBenchPoint>& points);
nlohmann::json serve_bench_json(const ServeBenchOptions& o, const std::vector<ServeBenchPoint>& points);

}  // namespace tetra::bench
