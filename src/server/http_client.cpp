#include "server/http_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace tetra::server {
namespace {

int connect_to(const std::string& host, int port, double timeout_s, std::string& err) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    err = gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd >= 0) {
    timeval tv{};
    tv.tv_sec = long(timeout_s);
    tv.tv_usec = long((timeout_s - double(tv.tv_sec)) * 1e6);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

bool send_all(int fd, std::string_view d) {
  while (!d.empty()) {
    const ssize_t n = ::send(fd, d.data(), d.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    d.remove_prefix(size_t(n));
  }
  return true;
}

}  // namespace

HttpResponse http_call(const std::string& host, int port, const std::string& method,
                       const std::string& path, const std::string& body, const OnData& on_data,
                       double timeout_s) {
  HttpResponse r;
  const int fd = connect_to(host, port, timeout_s, r.error);
  if (fd < 0) return r;
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n";
  if (!body.empty() || method == "POST")
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n";
  if (!send_all(fd, req) || !send_all(fd, body)) {
    r.error = "send failed";
    ::close(fd);
    return r;
  }
  std::string buf;
  char tmp[16384];
  bool eof = false;
  auto read_more = [&]() {
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n <= 0) {
      eof = true;
      return false;
    }
    buf.append(tmp, size_t(n));
    return true;
  };
  size_t he;
  while ((he = buf.find("\r\n\r\n")) == std::string::npos)
    if (!read_more()) {
      r.error = "connection closed before a response head";
      ::close(fd);
      return r;
    }
  const std::string head = buf.substr(0, he);
  buf.erase(0, he + 4);
  const size_t sp = head.find(' ');
  r.status = sp == std::string::npos ? 0 : std::atoi(head.c_str() + sp + 1);
  size_t pos = head.find("\r\n");
  while (pos != std::string::npos && pos + 2 < head.size()) {
    const size_t next = head.find("\r\n", pos + 2);
    const std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      r.headers[name] = value;
    }
    pos = next;
  }
  bool keep_going = true;
  auto deliver = [&](std::string_view piece) {
    if (piece.empty() || !keep_going) return;
    if (on_data) keep_going = on_data(piece);
    else r.body.append(piece);
  };
  if (r.headers["transfer-encoding"] == "chunked") {
    while (keep_going) {
      size_t le;
      while ((le = buf.find("\r\n")) == std::string::npos)
        if (!read_more()) break;
      if (le == std::string::npos) break;
      const size_t n = std::strtoul(buf.c_str(), nullptr, 16);
      if (n == 0) break;
      while (buf.size() < le + 2 + n + 2)
        if (!read_more()) break;
      if (buf.size() < le + 2 + n) break;
      deliver(std::string_view(buf).substr(le + 2, n));
      buf.erase(0, std::min(buf.size(), le + 2 + n + 2));
    }
  } else {
    const auto cl = r.headers.find("content-length");
    const size_t want = cl == r.headers.end() ? SIZE_MAX : std::strtoull(cl->second.c_str(), nullptr, 10);
    while (buf.size() < want && !eof && keep_going) {
      if (on_data && !buf.empty()) {
        deliver(buf);
        buf.clear();
      }
      read_more();
    }
    deliver(buf);
  }
  ::close(fd);
  return r;
}

void parse_http_url(const std::string& url, std::string& host, int& port) {
  const std::string prefix = "http://";
  if (url.rfind(prefix, 0) != 0) TETRA_FAIL("--url '", url, "' must start with http://");
  std::string rest = url.substr(prefix.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) TETRA_FAIL("--url '", url, "' needs host:port");
  host = rest.substr(0, colon);
  const std::string p = rest.substr(colon + 1);
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos)
    TETRA_FAIL("--url '", url, "': port '", p, "' is not a number");
  port = std::stoi(p);
  if (port < 1 || port > 65535) TETRA_FAIL("--url '", url, "': port out of range");
}

void SseReader::feed(std::string_view bytes, const std::function<void(const std::string&)>& on_event) {
  pending_.append(bytes);
  size_t end;
  while ((end = pending_.find("\n\n")) != std::string::npos) {
    const std::string event = pending_.substr(0, end);
    pending_.erase(0, end + 2);
    std::string data;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t nl = event.find('\n', pos);
      if (nl == std::string::npos) nl = event.size();
      const std::string line = event.substr(pos, nl - pos);
      if (line.rfind("data:", 0) == 0) {
        if (!data.empty()) data += '\n';
        data += line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
      }
      pos = nl + 1;
    }
    on_event(data);
  }
}

}  // namespace tetra::server
