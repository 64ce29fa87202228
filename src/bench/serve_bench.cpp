#include "bench/serve_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "server/http_client.h"

namespace tetra::bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double percentile(const std::vector<double>& sorted, double q) {
  const double pos = q * double(sorted.size() - 1);
  const size_t lo = size_t(std::floor(pos)), hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - double(lo));
}

struct RequestResult {
  bool ok = false;
  std::string error;
  int output_tokens = 0;
  double ttft_ms = 0, e2e_ms = 0;
  std::vector<double> itl_ms;
};

RequestResult one_request(const std::string& host, int port, const std::string& body, double timeout_s) {
  RequestResult res;
  const Clock::time_point t0 = Clock::now();
  Clock::time_point last = t0;
  bool done = false;
  server::SseReader reader;
  const server::HttpResponse r = server::http_call(
      host, port, "POST", "/generate", body,
      [&](std::string_view bytes) {
        reader.feed(bytes, [&](const std::string& data) {
          if (data == "[DONE]") {
            done = true;
            return;
          }
          const nlohmann::json j = nlohmann::json::parse(data, nullptr, false);
          if (j.is_object() && j.contains("error")) {
            res.error = j["error"].value("message", "error event");
            return;
          }
          if (!j.is_object() || !j.contains("token_ids")) return;
          const int n = int(j["token_ids"].size());
          if (n == 0) return;
          const Clock::time_point now = Clock::now();
          if (res.output_tokens == 0) res.ttft_ms = ms_between(t0, now);
          else
            for (int i = 0; i < n; ++i) res.itl_ms.push_back(ms_between(last, now) / n);
          last = now;
          res.output_tokens += n;
        });
        return true;
      },
      timeout_s);
  res.e2e_ms = ms_between(t0, Clock::now());
  if (r.status != 200) {
    res.error = r.status == 0 ? "no response: " + r.error : str("HTTP ", r.status, ": ", r.body.substr(0, 200));
    return res;
  }
  if (!done && res.error.empty()) res.error = "stream ended without [DONE]";
  res.ok = res.error.empty() && res.output_tokens > 0;
  if (!res.ok && res.error.empty()) res.error = "no tokens";
  return res;
}

}  // namespace

LatencyStats latency_stats(std::vector<double> v) {
  LatencyStats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  s.p50 = percentile(v, 0.50);
  s.p90 = percentile(v, 0.90);
  s.p99 = percentile(v, 0.99);
  return s;
}

void validate_serve_bench_options(const ServeBenchOptions& o) {
  std::string host;
  int port = 0;
  server::parse_http_url(o.url, host, port);
  if (o.concurrency.empty()) TETRA_FAIL("--concurrency: give at least one level");
  for (int c : o.concurrency)
    if (c < 1) TETRA_FAIL("--concurrency: levels must be >= 1 (got ", c, ")");
  if (o.requests < 1) TETRA_FAIL("--requests must be >= 1");
  if (o.input_len < 1) TETRA_FAIL("--input-len must be >= 1");
  if (o.output_len < 1) TETRA_FAIL("--output-len must be >= 1");
}

std::vector<ServeBenchPoint> run_serve_bench(const ServeBenchOptions& o) {
  validate_serve_bench_options(o);
  std::string host;
  int port = 0;
  server::parse_http_url(o.url, host, port);
  // Request bodies, the same for every level: [requests] random prompts of input_len ids.
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int> id(1, 255);
  std::vector<std::string> bodies;
  for (int r = 0; r < o.requests; ++r) {
    std::vector<int> ids(size_t(o.input_len));
    for (int& t : ids) t = id(rng);
    bodies.push_back(nlohmann::json({{"input_ids", ids}, {"max_new_tokens", o.output_len}, {"temperature", 0},
                                     {"stream", true}}).dump());
  }
  std::vector<ServeBenchPoint> points;
  for (int conc : o.concurrency) {
    std::vector<RequestResult> results(size_t(o.requests));
    std::atomic<int> next{0};
    const Clock::time_point t0 = Clock::now();
    std::vector<std::thread> clients;
    for (int c = 0; c < std::min(conc, o.requests); ++c)
      clients.emplace_back([&] {
        for (int i; (i = next++) < o.requests;) results[size_t(i)] = one_request(host, port, bodies[size_t(i)], o.timeout_s);
      });
    for (auto& t : clients) t.join();
    ServeBenchPoint p;
    p.concurrency = conc;
    p.duration_s = ms_between(t0, Clock::now()) / 1e3;
    std::vector<double> ttft, tpot, itl, e2e;
    for (const RequestResult& r : results) {
      if (!r.ok) {
        ++p.failed;
        if (p.first_error.empty()) p.first_error = r.error;
        continue;
      }
      ++p.completed;
      p.input_tokens += o.input_len;
      p.output_tokens += r.output_tokens;
      ttft.push_back(r.ttft_ms);
      e2e.push_back(r.e2e_ms);
      if (r.output_tokens > 1) tpot.push_back((r.e2e_ms - r.ttft_ms) / (r.output_tokens - 1));
      itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    }
    p.ttft = latency_stats(ttft);
    p.tpot = latency_stats(tpot);
    p.itl = latency_stats(itl);
    p.e2e = latency_stats(e2e);
    if (p.duration_s > 0) {
      p.request_throughput = p.completed / p.duration_s;
      p.output_token_throughput = double(p.output_tokens) / p.duration_s;
      p.total_token_throughput = double(p.input_tokens + p.output_tokens) / p.duration_s;
    }
    points.push_back(p);
  }
  return points;
}

std::string serve_bench_markdown(const ServeBenchOptions& o, const std::vector<ServeBenchPoint>& points) {
  std::ostringstream md;
  md.setf(std::ios::fixed);
  md.precision(2);
  md << "# tetra bench serve\n\n" << o.url << ", " << o.requests << " requests per level, input " << o.input_len
     << " tokens, output " << o.output_len << " tokens (POST /generate, streaming, greedy)\n\n";
  md << "| conc | ok | failed | req/s | out tok/s | total tok/s | TTFT mean | p50 | p90 | p99 | TPOT mean | p50 | p90 | p99 "
        "| ITL mean | p50 | p90 | p99 |\n|";
  for (int i = 0; i < 18; ++i) md << "---|";
  md << "\n";
  for (const ServeBenchPoint& p : points) {
    md << "| " << p.concurrency << " | " << p.completed << " | " << p.failed << " | " << p.request_throughput << " | "
       << p.output_token_throughput << " | " << p.total_token_throughput;
    for (const LatencyStats* s : {&p.ttft, &p.tpot, &p.itl}) md << " | " << s->mean << " | " << s->p50 << " | " << s->p90 << " | " << s->p99;
    md << " |\n";
  }
  md << "\nLatencies in ms.\n";
  for (const ServeBenchPoint& p : points)
    if (p.failed) md << "\nconcurrency " << p.concurrency << ": " << p.failed << " failed; first error: " << p.first_error << "\n";
  return md.str();
}

nlohmann::json serve_bench_json(const ServeBenchOptions& o, const std::vector<ServeBenchPoint>& points) {
  auto lat = [](const LatencyStats& s) { return nlohmann::json{{"mean_ms", s.mean}, {"p50_ms", s.p50}, {"p90_ms", s.p90}, {"p99_ms", s.p99}}; };
  nlohmann::json j{{"url", o.url}, {"requests", o.requests}, {"input_len", o.input_len}, {"output_len", o.output_len},
                   {"results", nlohmann::json::array()}};
  for (const ServeBenchPoint& p : points)
    j["results"].push_back({{"concurrency", p.concurrency}, {"completed", p.completed}, {"failed", p.failed},
                            {"first_error", p.first_error}, {"duration_s", p.duration_s},
                            {"input_tokens", p.input_tokens}, {"output_tokens", p.output_tokens},
                            {"request_throughput", p.request_throughput},
                            {"output_token_throughput", p.output_token_throughput},
                            {"total_token_throughput", p.total_token_throughput}, {"ttft", lat(p.ttft)},
                            {"tpot", lat(p.tpot)}, {"itl", lat(p.itl)}, {"e2e", lat(p.e2e)}});
  return j;
}

}  // namespace tetra::bench
