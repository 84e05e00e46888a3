// What the translating APIs (responses_api.cpp, messages_api.cpp) share for reading and writing
// JSON: bodies parsed with the client's key order kept (tool schemas are shown to the model as
// written), the compact dump every reply uses, and the early return on an ApiError. Internal to
// ms_server's sources (it includes nlohmann/json).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/api_request.h"

namespace moeserve {

using ojson = nlohmann::ordered_json;

// The widest object a translated request may hold (check_request_body).
inline constexpr size_t kMaxTranslatedObjectKeys = 256;

inline std::string dump_json(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

// The body, checked as every request is, parsed with its key order.
inline ApiResult<ojson> parse_ordered_body(std::string_view body) {
  if (auto e = check_request_body(body, kMaxTranslatedObjectKeys)) return *e;
  return ojson::parse(body, nullptr, /*allow_exceptions=*/false);
}

// The random part of a run's id ("resp_<hex>" -> "<hex>"), for the ids of its items.
inline std::string id_suffix(const std::string& id) {
  return id.substr(id.find_last_of("-_") + 1);
}

#define RETURN_IF_API_ERROR(expr)              \
  do {                                         \
    std::optional<ApiError> api_error_ = expr; \
    if (api_error_) return *api_error_;        \
  } while (0)

}  // namespace moeserve
