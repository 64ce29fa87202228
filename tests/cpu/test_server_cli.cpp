// `tetra serve` and `tetra bench serve` through the real binary: the server comes up on an
// ephemeral port, answers, stops cleanly on SIGTERM; the benchmark measures it over HTTP.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <fcntl.h>
#include <regex>
#include <thread>

#include "bench/serve_bench.h"
#include "server/demo_model.h"
#include "server/server.h"
#include "server_fixture.h"

namespace tetra {
namespace {

using nlohmann::json;

TEST(ServeBench, MeasuresEveryRequestOfEveryLevel) {
  server::ServerOptions o;
  o.model_dir = test::server_model_plain();
  o.engine.backend = "cpu";
  o.engine.max_batch = 4;
  o.engine.max_context = 64;
  server::Server s(o);
  const int port = s.start("127.0.0.1", 0);
  bench::ServeBenchOptions b;
  b.url = "http://127.0.0.1:" + std::to_string(port);
  b.concurrency = {1, 3};
  b.requests = 4;
  b.input_len = 8;
  b.output_len = 5;
  const auto points = bench::run_serve_bench(b);
  ASSERT_EQ(points.size(), 2u);
  for (const auto& p : points) {
    EXPECT_EQ(p.completed, 4) << p.first_error;
    EXPECT_EQ(p.failed, 0);
    EXPECT_EQ(p.output_tokens, 20);
    EXPECT_EQ(p.input_tokens, 32);
    EXPECT_GT(p.ttft.mean, 0);
    EXPECT_GE(p.ttft.p99, p.ttft.p50);
    EXPECT_GT(p.itl.mean, 0);
    EXPECT_GT(p.tpot.mean, 0);
    EXPECT_GE(p.e2e.p50, p.ttft.p50);
    EXPECT_NEAR(p.output_token_throughput, 20 / p.duration_s, 1e-9);
  }
  const json j = bench::serve_bench_json(b, points);
  EXPECT_EQ(j["results"].size(), 2u);
  EXPECT_NE(bench::serve_bench_markdown(b, points).find("| 3 | 4 | 0 |"), std::string::npos);
}

TEST(ServeBench, UnreachableServerFailsEveryRequest) {
  bench::ServeBenchOptions b;
  b.url = "http://127.0.0.1:1";
  b.concurrency = {2};
  b.requests = 2;
  const auto points = bench::run_serve_bench(b);
  EXPECT_EQ(points.at(0).completed, 0);
  EXPECT_EQ(points.at(0).failed, 2);
  EXPECT_FALSE(points.at(0).first_error.empty());
}

TEST(ServeCli, ServesUntilSigtermAndBenchServeTalksToIt) {
  const std::string model = test::server_model_plain().string();
  test::TempDir tmp("serve-cli");
  const std::string log = (tmp.path() / "serve.log").string();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(TETRA_BINARY, TETRA_BINARY, "serve", "--model", model.c_str(), "--port", "0", "--backend", "cpu",
          "--max-context", "64", static_cast<char*>(nullptr));
    _exit(127);
  }
  int port = 0;
  std::string text;
  for (int i = 0; i < 600 && port == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream in(log);
    text.assign(std::istreambuf_iterator<char>(in), {});
    std::smatch m;
    if (std::regex_search(text, m, std::regex("listening on http://127\\.0\\.0\\.1:(\\d+)"))) port = std::stoi(m[1]);
  }
  ASSERT_GT(port, 0) << text;
  EXPECT_NE(text.find("no tokenizer"), std::string::npos) << text;
  EXPECT_EQ(test::get(port, "/health").status, 200);
  const auto bench = test::run_tetra("bench serve --url http://127.0.0.1:" + std::to_string(port) +
                                     " --concurrency 2 --requests 2 --input-len 4 --output-len 3");
  EXPECT_EQ(bench.code, 0) << bench.output;
  EXPECT_NE(bench.output.find("| 2 | 2 | 0 |"), std::string::npos) << bench.output;
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const auto bad = test::run_tetra("bench serve --url ftp://x:1");
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_NE(bad.output.find("http://"), std::string::npos) << bad.output;
}

TEST(ServeCli, DefaultModelIsTheDemoCacheEntry) {
  // `tetra demo` makes its model; serve's default must find that same directory, not make another.
  test::TempDir cache("serve-demo-cache");
  const auto demo = test::run_tetra("demo --cache-dir " + cache.path().string() + " --tokens 2");
  ASSERT_EQ(demo.code, 0) << demo.output;
  std::vector<std::filesystem::path> before;
  for (const auto& e : std::filesystem::directory_iterator(cache.path())) before.push_back(e.path());
  ASSERT_EQ(before.size(), 1u);
  EXPECT_EQ(server::demo_model_dir(cache.path().string(), "tiny-glm4.5-air"), before[0]);
  size_t after = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(cache.path())) ++after;
  EXPECT_EQ(after, 1u);
}

}  // namespace
}  // namespace tetra
