// An error the API answers with: HTTP status plus OpenAI's {"error":{"message","type","code"}}.
#pragma once
#include <stdexcept>
#include <string>

namespace tetra::server {

struct ApiError : std::runtime_error {
  ApiError(int status_, const std::string& message, std::string code_ = "")
      : std::runtime_error(message), status(status_), code(std::move(code_)) {}
  int status;
  std::string code;  // e.g. "model_not_found"; empty: the status number
};

}  // namespace tetra::server
