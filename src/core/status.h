// Status and Result<T>: the expected-failure tier of error handling (CONTRIBUTING.md rule 6).
//
// A Status is either ok or carries a code and a message a user can act on ("model.safetensors:
// tensor 'model.norm.weight': offset 812 past end of file (800 bytes)"). Result<T> holds a value
// or a non-ok Status. Both are plain values: copy them, return them, never throw them.
// Broken invariants are not Statuses; they use CHECK (check.h).
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace moeserve {

enum class StatusCode {
  kOk,
  kInvalidArgument,    // the caller passed something wrong (bad flag, bad request field)
  kNotFound,           // a file, tensor or key that should exist does not
  kCorrupt,            // a file exists but its contents are inconsistent
  kIOError,            // the OS refused (open, mmap, read, write)
  kResourceExhausted,  // out of KV blocks, queue full, over a size limit
  kUnavailable,        // a peer or the engine is gone
  kUnimplemented,      // valid input this build cannot handle yet
  kInternal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: message" (or "OK").
  std::string to_string() const;

  // Returns a copy with "context: " prepended to the message, for adding the file or tensor name
  // as an error travels up.
  Status with_context(const std::string& context) const;

  friend bool operator==(const Status&, const Status&) = default;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
inline Status Corrupt(std::string m) {
  return {StatusCode::kCorrupt, std::move(m)};
}
inline Status IOError(std::string m) {
  return {StatusCode::kIOError, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Unavailable(std::string m) {
  return {StatusCode::kUnavailable, std::move(m)};
}
inline Status Unimplemented(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
inline Status Internal(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {
    if (std::get<Status>(v_).ok()) v_ = Internal("Result constructed from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace moeserve

#define MS_CONCAT_INNER(a, b) a##b
#define MS_CONCAT(a, b) MS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not ok.
#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::moeserve::Status ms_status_ = (expr);  \
    if (!ms_status_.ok()) return ms_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its Status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(MS_CONCAT(ms_result_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
