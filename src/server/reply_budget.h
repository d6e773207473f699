// src/server/reply_budget.h (internal): what the replies of Encode calls that
// are not yet sent may hold, charged per call to its tenant, its connection
// and the server as a whole (issue 27, faults 4 and 5; docs/SERVER.md,
// "Clients that stop reading").
//
// Two kinds of bytes, with different bounds:
//
// - Buffered bytes: the embedding bytes of results delivered to a call and
//   not yet sent, whether queued on the call or in a write gRPC has not
//   completed (ItemResult::embedding->nbytes() each). They are shared
//   pointers, mostly to cached embeddings, and the worker's backpressure
//   (WorkerOptions::sink_full) watches them: SinkFull() holds while the sum
//   over tenants of each tenant's buffered bytes, counted up to its share
//   (tenant_share_bytes), passes buffered_bytes. A tenant past its share is
//   throttled: what it buffers beyond the share waits on its own calls and
//   stops nobody's tower batches. So one tenant whose client stops reading
//   can never stop the tower alone when its share is at most buffered_bytes
//   (ServerOptions::max_buffered_bytes_per_tenant; a quarter by default);
//   several tenants at their shares still can, which keeps the global bound.
// - Held bytes: the memory held for replies handed to gRPC and not yet sent
//   (a write not completed, or the last write of a call not yet done): the
//   caller charges what the reply really holds (EncodeCall: twice the
//   message, its own copy plus gRPC's serialized one). Hold() refuses a
//   reply that would pass the connection's budget or the total budget with
//   kResourceExhausted naming it, unless nothing else is held in that scope
//   (so any one reply can be sent; a scope holds at most its budget plus one
//   reply). When the held bytes fall back to 0 after a burst, one in which
//   at least burst_bytes were held at once, `on_drained` runs once (e.g.
//   malloc_trim: freed transport buffers go back to the OS).
//
// A tenant is what the fair order charges (admission.h, TenantOf); a
// connection is the peer string gRPC reports for a call ("ipv4:10.0.0.7:5123"),
// one per TCP connection. Every call on a Unix socket reports the same peer,
// so there they share one connection budget.
//
// Counters: calls refused by Hold, calls throttled and write-progress
// timeouts (the two counted by their callers through CountThrottled and
// CountWriteTimeout).
//
// Thread safety: thread-safe. `on_room` and `on_drained` run on the thread
// whose Unbuffer or Unhold triggered them, outside the budget's lock.
// Complexity: every call O(1) on average (hash maps keyed by tenant and
// connection, entries erased when their last call closes).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

#include "epd/core/mutex.h"
#include "epd/core/status.h"

namespace epd::internal {

class ReplyBudget {
 public:
  struct Limits {
    std::int64_t buffered_bytes = 0;         // SinkFull past this (in-share buffered bytes of all tenants); > 0
    std::int64_t tenant_share_bytes = 0;     // a tenant's share of it; > 0
    std::int64_t held_bytes = 0;             // held bytes of all calls (--max-reply-mb); > 0
    std::int64_t connection_held_bytes = 0;  // held bytes of one connection's calls; > 0
    std::int64_t burst_bytes = 0;            // on_drained after a burst of at least this many held bytes
  };

  struct Stats {
    std::int64_t buffered_bytes = 0;  // now, all tenants (not capped by their shares)
    std::int64_t held_bytes = 0;      // now
    std::uint64_t refusals = 0;       // Hold refusals
    std::uint64_t throttled_calls = 0;
    std::uint64_t write_timeouts = 0;
  };

 private:
  struct Scope {
    std::int64_t buffered = 0;
    std::int64_t held = 0;
    std::int64_t calls = 0;  // accounts open on it
  };
  using Scopes = std::unordered_map<std::string, Scope>;

 public:
  // One call's place in the budget: its tenant and connection. Obtained from
  // Open, given back with Close; default-constructed = not open.
  class Account {
   public:
    bool open() const { return tenant_ != nullptr; }

   private:
    friend class ReplyBudget;
    Scopes::value_type* tenant_ = nullptr;      // stable: unordered_map never moves its elements
    Scopes::value_type* connection_ = nullptr;  // (rehashing invalidates iterators, not pointers)
  };

  // `on_room` runs when SinkFull() turns false (wake the worker); either
  // callback may be empty.
  ReplyBudget(Limits limits, std::function<void()> on_room, std::function<void()> on_drained);

  Account Open(const std::string& tenant, const std::string& connection);
  // REQUIRES: everything the account charged has been given back.
  void Close(Account& account);

  // Charges `bytes` of results to the account's tenant. Returns true when the
  // tenant is past its share now (the call is throttled).
  bool Buffer(const Account& account, std::int64_t bytes);
  void Unbuffer(const Account& account, std::int64_t bytes);
  // True while the tenants' in-share buffered bytes pass Limits::buffered_bytes.
  // Lock-free: the worker thread calls it every loop.
  bool SinkFull() const { return capped_.load(std::memory_order_relaxed) > limits_.buffered_bytes; }

  // Charges `bytes` held for a reply handed to gRPC to the account's
  // connection and the total, or refuses them (kResourceExhausted naming
  // the budget, the bytes held and the flag; counted) and charges nothing.
  Status Hold(const Account& account, std::int64_t bytes);
  void Unhold(const Account& account, std::int64_t bytes);

  void CountThrottled() { throttled_.fetch_add(1, std::memory_order_relaxed); }
  void CountWriteTimeout() { write_timeouts_.fetch_add(1, std::memory_order_relaxed); }

  Stats Snapshot() const;
  const Limits& limits() const { return limits_; }

 private:
  std::int64_t InShare(std::int64_t buffered) const {
    return buffered < limits_.tenant_share_bytes ? buffered : limits_.tenant_share_bytes;
  }

  const Limits limits_;
  const std::function<void()> on_room_;
  const std::function<void()> on_drained_;
  mutable Mutex mu_;
  Scopes tenants_ EPD_GUARDED_BY(mu_);
  Scopes connections_ EPD_GUARDED_BY(mu_);
  std::int64_t buffered_ EPD_GUARDED_BY(mu_) = 0;
  std::int64_t held_ EPD_GUARDED_BY(mu_) = 0;
  std::int64_t peak_since_drained_ EPD_GUARDED_BY(mu_) = 0;
  std::atomic<std::int64_t> capped_{0};  // sum of InShare(tenant buffered); written under mu_
  std::uint64_t refusals_ EPD_GUARDED_BY(mu_) = 0;
  std::atomic<std::uint64_t> throttled_{0};
  std::atomic<std::uint64_t> write_timeouts_{0};
};

}  // namespace epd::internal
