// A blocking HTTP/1.1 client for the server tests and `tetra bench serve`: one request per
// connection, bodies de-chunked and handed over piece by piece as they arrive.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace tetra::server {

struct HttpResponse {
  int status = 0;                              // 0: no response (connection failed)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // whole body unless on_data took it
  std::string error;                           // why status is 0
};

// Body pieces as they arrive; return false to drop the connection (a client disconnect).
using OnData = std::function<bool(std::string_view)>;

HttpResponse http_call(const std::string& host, int port, const std::string& method,
                       const std::string& path, const std::string& body = "",
                       const OnData& on_data = {}, double timeout_s = 120.0);

// "http://host:port" (optional trailing '/'): host and port; tetra::Error when malformed.
void parse_http_url(const std::string& url, std::string& host, int& port);

// Server-sent events: feed bytes, get each event's data lines joined.
class SseReader {
 public:
  // Calls on_event(data) for each complete event in the bytes so far.
  void feed(std::string_view bytes, const std::function<void(const std::string&)>& on_event);

 private:
  std::string pending_;
};

}  // namespace tetra::server
