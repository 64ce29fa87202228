#include "server/http_message.h"

#include <algorithm>
#include <cctype>

namespace tetra::server {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool is_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

}  // namespace

std::optional<std::string> HttpRequest::header(const std::string& lower_name) const {
  const auto it = headers.find(lower_name);
  if (it == headers.end()) return std::nullopt;
  return it->second;
}

std::optional<HttpParseError> parse_request_head(std::string_view head, HttpRequest& out,
                                                 size_t& content_length) {
  content_length = 0;
  size_t eol = head.find('\n');
  std::string_view line = trim(head.substr(0, eol));
  head = eol == std::string_view::npos ? std::string_view{} : head.substr(eol + 1);
  // Request line: METHOD SP target SP HTTP/1.x
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || sp1 == 0)
    return HttpParseError{400, "malformed request line"};
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!std::all_of(method.begin(), method.end(), is_token_char))
    return HttpParseError{400, "malformed request method"};
  if (version != "HTTP/1.1" && version != "HTTP/1.0")
    return HttpParseError{505, "only HTTP/1.0 and HTTP/1.1 are served"};
  if (target.empty() || target.front() != '/') return HttpParseError{400, "request target must start with '/'"};
  out.method = std::string(method);
  const size_t q = target.find('?');
  out.path = std::string(target.substr(0, q));
  out.query = q == std::string_view::npos ? "" : std::string(target.substr(q + 1));
  out.headers.clear();
  while (!head.empty()) {
    eol = head.find('\n');
    line = head.substr(0, eol);
    head = eol == std::string_view::npos ? std::string_view{} : head.substr(eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return HttpParseError{400, "malformed header line"};
    std::string name(line.substr(0, colon));
    if (!std::all_of(name.begin(), name.end(), is_token_char)) return HttpParseError{400, "malformed header name"};
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return char(std::tolower(c)); });
    out.headers[name] = std::string(trim(line.substr(colon + 1)));
  }
  if (auto te = out.header("transfer-encoding"); te && !te->empty())
    return HttpParseError{411, "chunked request bodies are not accepted; send Content-Length"};
  if (auto cl = out.header("content-length")) {
    if (cl->empty() || cl->size() > 18 || !std::all_of(cl->begin(), cl->end(), [](char c) { return c >= '0' && c <= '9'; }))
      return HttpParseError{400, "Content-Length is not a number"};
    content_length = size_t(std::stoull(*cl));
  }
  return std::nullopt;
}

const char* http_status_text(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
  }
  return "Unknown";
}

}  // namespace tetra::server
