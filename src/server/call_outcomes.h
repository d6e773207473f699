// src/server/call_outcomes.h (internal): every call's final status, counted
// by code and logged (rate-limited), in one place.
//
// Why an interceptor rather than counting in each handler: some refusals
// never reach a handler of ours. gRPC's generated code answers a request that
// does not parse; health checks and reflection are gRPC's own services. A
// server interceptor sees the status of every call on every service at
// PRE_SEND_STATUS, so Stats.rpc_errors, /metrics and the log miss none of
// them. The one refusal it cannot see is gRPC's transport limit on message
// size, which drops the call before publishing it; EncodeServer therefore
// sets that limit to twice max_request_bytes and checks the size itself.
//
// It also fixes the code of one refusal: gRPC's generated code reports a
// request that does not parse as INTERNAL (a server fault, "retry") for a
// sync method and as UNIMPLEMENTED (with no message) for a callback one,
// where the fault is the client's: the interceptor rewrites both to
// INVALID_ARGUMENT. gRPC's handler sees no message either when the client
// cancelled before sending it; for a callback method (Encode) such a call is
// counted (and logged) as CANCELLED, decided when the call's close arrives
// (POST_RECV_CLOSE). A sync method's is still counted as INVALID_ARGUMENT.
// Likewise a callback call the client ended that a service then finishes
// with UNKNOWN (gRPC's health Watch says UNKNOWN "OnCancel()" when its
// client cancels) is counted and logged as CANCELLED, or DEADLINE_EXCEEDED
// when the call's deadline had passed: a client's cancel is no error.
//
// Thread safety: thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "epd/core/mutex.h"
#include "epd/core/status.h"

namespace grpc {
class ServerContextBase;
}
namespace grpc::experimental {
class ServerInterceptorFactoryInterface;
}

namespace epd::internal {

// Passes lines to `sink`, at most `per_window` per `window`; the first line
// let through after some were dropped says how many. `now` is injectable for
// tests. Thread-safe; `sink` runs under the limiter's lock.
class RateLimitedLog {
 public:
  using Clock = std::chrono::steady_clock;
  RateLimitedLog(
      std::function<void(const std::string&)> sink, int per_window, Clock::duration window = std::chrono::seconds(1),
      std::function<Clock::time_point()> now = [] { return Clock::now(); });
  void Log(const std::string& line);

 private:
  std::function<void(const std::string&)> sink_;
  int per_window_;
  Clock::duration window_;
  std::function<Clock::time_point()> now_;
  Mutex mu_;
  Clock::time_point window_start_ EPD_GUARDED_BY(mu_) = {};
  int in_window_ EPD_GUARDED_BY(mu_) = 0;
  std::uint64_t dropped_ EPD_GUARDED_BY(mu_) = 0;
};

class CallOutcomes {
 public:
  // `log` receives one line per failed call, at most 10 a second; null = no log.
  explicit CallOutcomes(std::function<void(const std::string&)> log);

  // Counts a call that ended with `status` (OK is not counted) and logs it.
  void Record(const std::string& method, const std::string& peer, const Status& status);

  // Names the caller's tenant in each logged line ("" = none named). Set
  // once, before the server accepts calls; it runs on gRPC threads, for
  // failed calls only.
  void SetTenantOf(std::function<std::string(const grpc::ServerContextBase&)> tenant_of);
  std::string TenantOf(const grpc::ServerContextBase& ctx) const;

  // Failed calls by code since start.
  std::map<StatusCode, std::uint64_t> Errors() const;

  // The interceptor to install on the server (ServerBuilder::experimental()).
  // It must not outlive this object.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeInterceptorFactory();

 private:
  mutable Mutex mu_;
  std::map<StatusCode, std::uint64_t> errors_ EPD_GUARDED_BY(mu_);
  std::unique_ptr<RateLimitedLog> log_;
  std::function<std::string(const grpc::ServerContextBase&)> tenant_of_;
};

}  // namespace epd::internal
