// A small HTTP/1.1 server on POSIX sockets: one thread per connection, one request per
// connection. Written here because Debian's cpp-httplib ships its implementation only as a
// shared library (with OpenSSL/zlib/brotli), which the GPU machines do not have (DEVICE.md).
// Responses are whole (Content-Length) or streamed (chunked transfer encoding, for SSE).
#pragma once
#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "server/http_message.h"

namespace tetra::server {

// The response side of one connection, used by one handler thread.
class HttpConnection {
 public:
  explicit HttpConnection(int fd) : fd_(fd) {}
  // Whole response. Returns false when the client is gone.
  bool respond(int status, std::string_view content_type, std::string_view body);
  // Streamed response: head now, then chunks, then end. Each returns false when the client is gone.
  bool begin_stream(int status, std::string_view content_type);
  bool send_chunk(std::string_view data);
  bool end_stream();
  // True once the client has closed its side (or the socket failed): lets a handler that is
  // waiting for tokens notice a disconnect before it has anything to write.
  bool peer_closed() const;
  bool responded() const { return responded_; }

 private:
  bool send_all(std::string_view data);
  int fd_;
  bool responded_ = false;
  bool streaming_ = false;
  bool broken_ = false;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpConnection&)>;

struct HttpServerOptions {
  size_t max_body_bytes = 4u << 20;
  size_t max_head_bytes = 64u << 10;
  int max_connections = 512;     // more are answered 503 at once
  double read_timeout_s = 30.0;  // a client that sends nothing for this long is dropped
};

class HttpServer {
 public:
  HttpServer(HttpHandler handler, HttpServerOptions opt);
  ~HttpServer();
  // Binds host:port (port 0: an ephemeral one), starts accepting; returns the bound port.
  // Throws tetra::Error when the address cannot be bound.
  int start(const std::string& host, int port);
  // Stops accepting, shuts every open connection down and joins all threads.
  void stop();

 private:
  struct Worker {
    std::thread thread;
    int fd = -1;
    std::atomic<bool> done{false};
  };
  void accept_loop();
  void serve(Worker& w);
  void reap_finished();

  HttpHandler handler_;
  HttpServerOptions opt_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex workers_mutex_;
  std::list<std::unique_ptr<Worker>> workers_;
};

// An OpenAI-style error body: {"error":{"message","type","code"}}.
std::string error_json(int status, std::string_view message, std::string_view type = "",
                       std::string_view code = "");

}  // namespace tetra::server
