// Errors of the OpenAI-compatible API: an HTTP status and OpenAI's error object.
#pragma once

#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "kestrel/base/error.h"

namespace kestrel::server {

/// Thrown by request validation and the handlers; the HTTP layer turns it into
///   status + {"error": {"message", "type", "param", "code"}}.
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "",
           std::string type = "")
      : Error(message), status_(status), param_(std::move(param)), code_(std::move(code)),
        type_(type.empty() ? default_type(status) : std::move(type)) {}

  int status() const { return status_; }
  /// OpenAI's error body.
  nlohmann::json body() const { return error_body(what(), type_, param_, code_); }

  static nlohmann::json error_body(const std::string& message, const std::string& type,
                                   const std::string& param, const std::string& code) {
    return {{"error",
             {{"message", message},
              {"type", type},
              {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
              {"code", code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code)}}}};
  }
  /// OpenAI's error type for a status: 4xx invalid_request_error (401 authentication_error),
  /// 5xx server_error.
  static std::string default_type(int status) {
    if (status == 401) return "authentication_error";
    if (status == 404) return "not_found_error";
    return status >= 500 ? "server_error" : "invalid_request_error";
  }

 private:
  int status_;
  std::string param_, code_, type_;
};

/// 400 invalid_request_error naming the offending field.
inline ApiError bad_request(const std::string& message, const std::string& param = "") {
  return ApiError(400, message, param);
}

}  // namespace kestrel::server
