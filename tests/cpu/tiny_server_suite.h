// A test suite sharing one server on the tiny model with a tokenizer (CPU backend, loopback, an
// ephemeral port) and that tokenizer; helpers its tests share.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "server/server.h"
#include "server_fixture.h"
#include "tokenizer/tokenizer.h"

namespace tetra::test {

constexpr int kTinyServerContext = 128;

class TinyServerSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server::ServerOptions o;
    o.model_dir = tiny_model_with_tokenizer();
    o.served_model_name = "tiny";
    o.engine.backend = "cpu";
    o.engine.max_batch = 4;  // fewer slots than some requests' choices: they queue
    o.engine.max_context = kTinyServerContext;
    srv_ = std::make_unique<server::Server>(o);
    port_ = srv_->start("127.0.0.1", 0);
    tok_ = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_file(o.model_dir / "tokenizer.json"));
  }
  static void TearDownTestSuite() {
    srv_.reset();
    tok_.reset();
  }
  inline static std::unique_ptr<server::Server> srv_;
  inline static int port_ = 0;
  inline static std::unique_ptr<tok::Tokenizer> tok_;
};

// Metrics once no request runs or waits and no KV block is held (or after 10 s).
inline std::map<std::string, double> settled_metrics(int port) {
  std::map<std::string, double> m;
  for (int i = 0; i < 200; ++i) {
    m = parse_metrics(get(port, "/metrics").body);
    if (m["tetra_requests_running"] == 0 && m["tetra_requests_waiting"] == 0 && m["tetra_kv_cache_blocks_used"] == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return m;
}

}  // namespace tetra::test
