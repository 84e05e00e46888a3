#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace moeserve {

std::string ApiError::to_json() const {
  nlohmann::json e = {{"message", message},
                      {"type", type},
                      {"param", param ? nlohmann::json(*param) : nlohmann::json(nullptr)},
                      {"code", code ? nlohmann::json(*code) : nlohmann::json(nullptr)}};
  return nlohmann::json({{"error", e}})
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError bad_request(std::string message, std::optional<std::string> param) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

Reply error_reply(const ApiError& e) {
  Reply r;
  r.status = e.http_status;
  r.body = e.to_json();
  return r;
}

ApiError error_from_status(const Status& status) {
  ApiError e;
  e.message = status.message();
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      e.http_status = 400;
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";  // what OpenAI clients retry on
      e.code = "resource_exhausted";
      break;
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      e.code = "unavailable";
      break;
    default:
      e.http_status = 500;
      e.type = "internal_error";
      e.message = status.to_string();
      break;
  }
  return e;
}

}  // namespace moeserve
