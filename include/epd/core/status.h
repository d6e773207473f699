// epd/core/status.h: the one error vocabulary of epd-encode.
//
// Recoverable failures travel as values (`Status`, `StatusOr<T>`); the few
// places that must throw (constructor preconditions, the Python edge) throw
// `epd::Error`, which carries the same code. The gRPC server maps `StatusCode`
// one-to-one onto grpc::StatusCode, and the Python module maps
// kInvalidArgument to ValueError, so a code is translated once, at each edge.
//
// Thread safety: value types; thread-compatible.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace epd {

// Numbered as grpc::StatusCode so the server maps them by value.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,  // stored bytes failed their check (e.g. a corrupt L3 value)
  kUnauthenticated = 16,
};

// "INVALID_ARGUMENT" etc., as gRPC spells them.
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: image is truncated" (or "OK").
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }

// The exception form of a Status, thrown where a value cannot be returned.
class Error : public std::runtime_error {
 public:
  explicit Error(Status status) : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  Error(StatusCode code, std::string message) : Error(Status(code, std::move(message))) {}
  const Status& status() const { return status_; }
  StatusCode code() const { return status_.code(); }

 private:
  Status status_;
};

// A T or the Status saying why there is none. REQUIRES: ok() before value().
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  StatusOr(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  // Throws epd::Error carrying the status when !ok().
  T& value() & {
    Check();
    return std::get<T>(v_);
  }
  const T& value() const& {
    Check();
    return std::get<T>(v_);
  }
  T&& value() && {
    Check();
    return std::get<T>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void Check() const {
    if (!ok()) throw Error(std::get<Status>(v_));
  }
  std::variant<T, Status> v_;
};

}  // namespace epd
