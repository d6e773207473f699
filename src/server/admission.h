// src/server/admission.h (internal): what a call must pass before its bytes
// reach the worker: the in-flight request byte budget, and whose fair share
// (ScheduleOrder::kFair) the call is charged to.
//
// RequestBudget is a counting semaphore over bytes. Each Encode call takes
// its message size before it is converted and submitted, and gives it back
// when the call ends. A call that finds no room waits up to a short deadline
// for earlier calls to finish, then is refused with RESOURCE_EXHAUSTED
// naming the budget (counted by code in Stats.rpc_errors and /metrics, and
// logged rate-limited, like every refusal: call_outcomes.h).
//
// What it bounds, and what it cannot: gRPC reads a whole message before
// the Encode method runs, so a refused call's message was already
// received; the budget bounds the bytes that go on into the worker (hashing,
// the decode queue, the request's lifetime), which is where a request's
// bytes stayed held for seconds. The transport's own buffers are bounded
// separately by gRPC's ResourceQuota (EncodeServer sets its memory size from
// the same budget), which is also what bounds the messages of calls still
// waiting for room: an Encode call holds no thread while it waits.
//
// When the bytes in flight fall back to zero after a burst, one in which at
// least `burst_bytes` were in flight at once, `on_drained` runs once
// (outside the lock), e.g. to hand freed heap back to the OS (malloc_trim;
// the executable owns that policy). A steady stream of small calls, however
// many bytes it adds up to, is no burst: it never holds much heap at once,
// and a malloc_trim walks the whole heap, cached embeddings included,
// holding each malloc arena's lock while it does (an earlier rule counted
// bytes admitted, which set it off every 256 MiB of small calls).
//
// Thread safety: thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "epd/status.h"

namespace grpc {
class ServerContextBase;
}

namespace epd::internal {

class RequestBudget {
 public:
  using Clock = std::chrono::steady_clock;

  // REQUIRES: capacity_bytes > 0.
  RequestBudget(std::int64_t capacity_bytes, std::int64_t burst_bytes, std::function<void()> on_drained);

  // Takes `bytes` (<= capacity) once they fit, waiting until `deadline` at
  // the latest. OK, or kResourceExhausted naming the budget and what is in
  // flight. REQUIRES: 0 <= bytes <= capacity_bytes.
  Status Acquire(std::int64_t bytes, Clock::time_point deadline);
  // Gives back what an OK Acquire took.
  void Release(std::int64_t bytes);

  std::int64_t in_flight() const;
  std::int64_t capacity() const { return capacity_; }

 private:
  const std::int64_t capacity_;
  const std::int64_t burst_bytes_;
  const std::function<void()> on_drained_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::int64_t in_flight_ = 0;           // guarded by mu_
  std::int64_t peak_since_drained_ = 0;  // most bytes in flight at once since in_flight_ was last 0; guarded by mu_
};

// Whose fair share a call is charged to: the value of the metadata key
// `tenant_key` when that is non-empty and the client sent it, else the
// peer's address without its port ("ipv4:10.0.0.7"), so one client's
// connections share one share. A value that is empty, longer than 128 bytes
// or not printable ASCII is kInvalidArgument naming the key.
StatusOr<std::string> TenantOf(const grpc::ServerContextBase& ctx, const std::string& tenant_key);
// The address part of a gRPC peer string ("ipv4:1.2.3.4:567" ->
// "ipv4:1.2.3.4", "ipv6:[::1]:80" -> "ipv6:[::1]"); others unchanged.
std::string PeerWithoutPort(const std::string& peer);

}  // namespace epd::internal
