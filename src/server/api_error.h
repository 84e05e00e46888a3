// ApiError: an OpenAI-style error reply ({"error": {"message", "type", "param", "code"}}) with
// its HTTP status, and ApiResult<T>, a value or an ApiError. Request parsing and the handlers
// return these so that every failure a client can cause becomes a 4xx with a body it can read.
//
// Plain values; no shared state.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "core/status.h"
#include "server/reply.h"

namespace moeserve {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // OpenAI's error "type"
  std::optional<std::string> param;            // the request field at fault, if one is
  std::optional<std::string> code;             // machine-readable detail ("model_not_found")

  // The JSON body: {"error": {...}} (param and code are null when absent).
  std::string to_json() const;
};

// 400 invalid_request_error naming the field.
ApiError bad_request(std::string message, std::optional<std::string> param = std::nullopt);
// Maps an engine Status: InvalidArgument 400, ResourceExhausted 429, Unavailable 503,
// anything else 500.
ApiError error_from_status(const Status& status);
// A reply carrying the error (OpenAI's shape).
Reply error_reply(const ApiError& e);

template <typename T>
class ApiResult {
 public:
  ApiResult(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  ApiResult(ApiError error) : v_(std::move(error)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  const ApiError& error() const { return std::get<ApiError>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, ApiError> v_;
};

}  // namespace moeserve
