// src/server/admission.h (internal): what a call must pass before its bytes
// reach the worker: the in-flight request byte budget, and whose fair share
// (ScheduleOrder::kFair) the call is charged to.
//
// RequestBudget is a counting semaphore over bytes, with a queue of waiting
// callbacks instead of waiting threads. Each Encode call takes its message
// size before it is converted and submitted, and gives it back when the call
// ends. A call that finds no room waits, holding no thread, until bytes come
// back (Release admits it on the spot) or a short deadline passes; then it
// is refused with RESOURCE_EXHAUSTED naming the budget (counted by code in
// Stats.rpc_errors and /metrics, and logged rate-limited, like every
// refusal: call_outcomes.h).

// What it bounds, and what it cannot: gRPC reads a whole message before
// the Encode method runs, so a refused call's message was already
// received; the budget bounds the bytes that go on into the worker (hashing,
// the decode queue, the request's lifetime), which is where a request's
// bytes stayed held for seconds. The transport's own buffers are bounded
// separately by gRPC's ResourceQuota (EncodeServer sets its memory size from
// the same budget). A message parsed and waiting for room is no longer
// charged to that quota: what bounds the messages of calls still waiting is
// the deadline (admission_wait) times the rate they arrive at. An Encode
// call holds no thread while it waits.
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
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "epd/core/mutex.h"
#include "epd/core/status.h"

namespace grpc {
class ServerContextBase;
}

namespace epd::internal {

class TaskPool;

class RequestBudget {
 public:
  using Clock = std::chrono::steady_clock;
  // What a waiter is told, exactly once: OK (its bytes are taken), or why
  // not (kResourceExhausted at its deadline, Cancel's status).
  using Grant = std::function<void(const Status&)>;
  using WaiterId = std::uint64_t;  // 0 = none

  // `pool` runs the waiters' deadlines and the grants a Release gives (not
  // owned; it must outlive the budget's use, and a waiter still queued when
  // it shuts down is never answered). REQUIRES: capacity_bytes > 0,
  // pool != nullptr.
  RequestBudget(std::int64_t capacity_bytes, std::int64_t burst_bytes, std::function<void()> on_drained,
                TaskPool* pool);

  // Takes `bytes` as soon as they fit, and calls grant(OK); if they do not
  // fit by `deadline`, grant(kResourceExhausted naming the budget and what
  // is in flight). When they fit at once, or the deadline has passed,
  // `grant` runs inline and 0 is returned; otherwise the call is queued and
  // `grant` runs later on a `pool` thread, posted by the Release that makes
  // room (a grant goes on to hash and submit its request: work that must not
  // pile up on the releasing call's thread) or at the deadline, or in
  // Cancel; never under the budget's lock. Queued waiters are not first-come-first-served: each Release
  // admits, oldest first, every waiter that fits, so a small call may pass
  // a large one and small requests keep flowing during a burst of large
  // ones. REQUIRES: 0 <= bytes <= capacity_bytes. O(1), plus O(log waiters)
  // to queue.
  WaiterId Acquire(std::int64_t bytes, Clock::time_point deadline, Grant grant);
  // Ends waiter `id` if it is still queued: its grant runs now, on this
  // thread, with `why` (not OK). A waiter already granted, refused or
  // cancelled is left alone. O(log waiters).
  void Cancel(WaiterId id, const Status& why);
  // Gives back what an OK grant took, and admits the queued waiters that fit
  // now (their bytes are taken here; their grants are posted to `pool`).
  // O(waiters).
  void Release(std::int64_t bytes);

  std::int64_t in_flight() const;
  std::int64_t waiting() const;  // waiters queued
  std::int64_t capacity() const { return capacity_; }

 private:
  struct Waiter {
    std::int64_t bytes;
    Grant grant;
  };
  Status Refusal(std::int64_t held, std::int64_t bytes) const;
  void Expire(WaiterId id);
  void Take(std::int64_t bytes) EPD_REQUIRES(mu_);

  const std::int64_t capacity_;
  const std::int64_t burst_bytes_;
  const std::function<void()> on_drained_;
  TaskPool* const pool_;
  mutable Mutex mu_;
  std::int64_t in_flight_ EPD_GUARDED_BY(mu_) = 0;
  std::int64_t peak_since_drained_ EPD_GUARDED_BY(mu_) = 0;  // most bytes in flight at once since in_flight_ was last 0
  std::map<WaiterId, Waiter> waiters_ EPD_GUARDED_BY(mu_);   // by id: oldest first
  WaiterId next_id_ EPD_GUARDED_BY(mu_) = 1;
};

// Whose fair share a call is charged to: the value of the metadata key
// `tenant_key` when that is non-empty and the client sent it, else the
// peer's address without its port ("ipv4:10.0.0.7"), so one client's
// connections share one share. A value that is empty, longer than 128 bytes
// or not printable ASCII is kInvalidArgument naming the key.
StatusOr<std::string> TenantOf(const grpc::ServerContextBase& ctx, const std::string& tenant_key);
// The same rule for any front: `value` is what the client sent under
// `tenant_key` (nullopt = nothing), `peer` its address without the port in
// gRPC's spelling ("ipv4:10.0.0.7", "ipv6:[::1]"), so a client has one
// share whichever front it calls.
StatusOr<std::string> TenantFrom(const std::optional<std::string>& value, const std::string& tenant_key,
                                 const std::string& peer);
// The address part of a gRPC peer string ("ipv4:1.2.3.4:567" ->
// "ipv4:1.2.3.4", "ipv6:[::1]:80" -> "ipv6:[::1]"); others unchanged.
std::string PeerWithoutPort(const std::string& peer);

}  // namespace epd::internal
