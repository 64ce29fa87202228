#include "server/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace tetra::server {
namespace {

std::string hex(size_t n) {
  std::ostringstream os;
  os << std::hex << n;
  return os.str();
}

}  // namespace

std::string error_json(int status, std::string_view message, std::string_view type,
                       std::string_view code) {
  if (type.empty()) type = status >= 500 ? "server_error" : status == 429 ? "rate_limit_error" : "invalid_request_error";
  nlohmann::json j;
  j["error"]["message"] = std::string(message);
  j["error"]["type"] = std::string(type);
  if (code.empty()) j["error"]["code"] = status;
  else j["error"]["code"] = std::string(code);
  // Messages may quote client bytes; never let invalid UTF-8 make dump() throw.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool HttpConnection::send_all(std::string_view data) {
  if (broken_) return false;
  while (!data.empty()) {
    const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      return false;
    }
    data.remove_prefix(size_t(n));
  }
  return true;
}

bool HttpConnection::respond(int status, std::string_view content_type, std::string_view body) {
  responded_ = true;
  std::ostringstream h;
  h << "HTTP/1.1 " << status << ' ' << http_status_text(status) << "\r\nContent-Type: " << content_type
    << "\r\nContent-Length: " << body.size() << "\r\nConnection: close\r\n\r\n";
  return send_all(h.str()) && send_all(body);
}

bool HttpConnection::begin_stream(int status, std::string_view content_type) {
  responded_ = true;
  streaming_ = true;
  std::ostringstream h;
  h << "HTTP/1.1 " << status << ' ' << http_status_text(status) << "\r\nContent-Type: " << content_type
    << "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
  return send_all(h.str());
}

bool HttpConnection::send_chunk(std::string_view data) {
  if (data.empty()) return !broken_;  // an empty chunk would end the stream
  return send_all(hex(data.size()) + "\r\n") && send_all(data) && send_all("\r\n");
}

bool HttpConnection::end_stream() {
  streaming_ = false;
  return send_all("0\r\n\r\n");
}

bool HttpConnection::peer_closed() const {
  if (broken_) return true;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  char c;
  const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

HttpServer::HttpServer(HttpHandler handler, HttpServerOptions opt)
    : handler_(std::move(handler)), opt_(opt) {}

HttpServer::~HttpServer() { stop(); }

int HttpServer::start(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res); rc != 0)
    TETRA_FAIL("cannot resolve host '", host, "': ", gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
      listen_fd_ = fd;
      break;
    }
    why = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) TETRA_FAIL("cannot listen on ", host, ":", port, ": ", why);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  const int bound = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                             : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
  return bound;
}

void HttpServer::stop() {
  if (stopping_.exchange(true)) return;
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  std::list<std::unique_ptr<Worker>> workers;
  {
    std::lock_guard<std::mutex> lock(workers_mutex_);
    for (auto& w : workers_)
      if (!w->done) ::shutdown(w->fd, SHUT_RDWR);
    workers.swap(workers_);
  }
  for (auto& w : workers) w->thread.join();
}

void HttpServer::reap_finished() {
  std::lock_guard<std::mutex> lock(workers_mutex_);
  for (auto it = workers_.begin(); it != workers_.end();) {
    if ((*it)->done) {
      (*it)->thread.join();
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

void HttpServer::accept_loop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    reap_finished();
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lock(workers_mutex_);
    if (stopping_ || int(workers_.size()) >= opt_.max_connections) {
      HttpConnection c(fd);
      c.respond(503, "application/json", error_json(503, "server is at its connection limit"));
      ::close(fd);
      continue;
    }
    auto w = std::make_unique<Worker>();
    w->fd = fd;
    Worker* raw = w.get();
    workers_.push_back(std::move(w));
    raw->thread = std::thread([this, raw] {
      serve(*raw);
      // Lingering close: closing with unread request bytes would send a reset that can destroy
      // the response (e.g. a 413 answered before the body was read). Signal EOF, drain, close.
      ::shutdown(raw->fd, SHUT_WR);
      timeval tv{1, 0};
      ::setsockopt(raw->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      char sink[16384];
      size_t drained = 0;
      for (ssize_t n; drained < (64u << 20) && (n = ::recv(raw->fd, sink, sizeof sink, 0)) > 0;) drained += size_t(n);
      ::close(raw->fd);
      raw->done = true;
    });
  }
}

void HttpServer::serve(Worker& w) {
  timeval tv{};
  tv.tv_sec = long(opt_.read_timeout_s);
  tv.tv_usec = long((opt_.read_timeout_s - double(tv.tv_sec)) * 1e6);
  ::setsockopt(w.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  HttpConnection conn(w.fd);
  std::string buf;
  size_t head_end = std::string::npos;
  char tmp[16384];
  auto read_more = [&]() -> bool {
    const ssize_t n = ::recv(w.fd, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf.append(tmp, size_t(n));
    return true;
  };
  while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
    if (buf.size() > opt_.max_head_bytes) {
      conn.respond(431, "application/json", error_json(431, "request head is too large"));
      return;
    }
    if (!read_more()) return;  // closed or timed out before a whole head: nothing to answer
  }
  HttpRequest req;
  size_t content_length = 0;
  if (auto err = parse_request_head(std::string_view(buf).substr(0, head_end), req, content_length)) {
    conn.respond(err->status, "application/json", error_json(err->status, err->message));
    return;
  }
  if (content_length > opt_.max_body_bytes) {
    conn.respond(413, "application/json",
                 error_json(413, str("request body of ", content_length, " bytes exceeds the limit of ",
                                     opt_.max_body_bytes, " bytes")));
    return;
  }
  buf.erase(0, head_end + 4);
  while (buf.size() < content_length)
    if (!read_more()) {
      conn.respond(400, "application/json", error_json(400, "request body ended before Content-Length bytes"));
      return;
    }
  buf.resize(content_length);
  req.body = std::move(buf);
  try {
    handler_(req, conn);
  } catch (const std::exception& e) {
    if (!conn.responded()) conn.respond(500, "application/json", error_json(500, e.what()));
  }
  if (!conn.responded()) conn.respond(500, "application/json", error_json(500, "handler gave no response"));
}

}  // namespace tetra::server
