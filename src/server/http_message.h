// HTTP/1.1 request heads: parsing what a client sent, kept free of sockets so it can be fuzzed.
// Only what the server needs: request line, headers, a Content-Length body. Chunked request
// bodies are refused (411); every connection serves one request ("Connection: close").
#pragma once
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace tetra::server {

struct HttpRequest {
  std::string method;                         // "GET", "POST", ...
  std::string path;                           // target without the query, e.g. "/v1/models"
  std::string query;                          // after '?', may be empty
  std::map<std::string, std::string> headers;  // names lower-cased, values trimmed
  std::string body;
  std::optional<std::string> header(const std::string& lower_name) const;
};

// What parse_request_head found wrong: the status to answer with and why.
struct HttpParseError {
  int status = 400;
  std::string message;
};

// Parses the head (request line and headers, without the final blank line). On success fills
// `out` (body empty) and returns nullopt; content_length gets the announced body size (0 if none).
std::optional<HttpParseError> parse_request_head(std::string_view head, HttpRequest& out,
                                                 size_t& content_length);

const char* http_status_text(int status);

}  // namespace tetra::server
