// ServerOptions::Validate: every option check that needs no running server,
// in one place, each message naming the option (epd/server/server.h). The
// checks are grouped as the options are: addresses, zero-copy delivery,
// request and reply budgets, the transport.
#include <cstdint>
#include <string>
#include <vector>

#include "epd/server/server.h"

namespace epd {
namespace {

// gRPC's message size is an int; 2047 MiB leaves room under INT_MAX.
constexpr std::int64_t kMaxRequestBytes = std::int64_t{2047} << 20;

Status CheckAddresses(const ServerOptions& o) {
  std::vector<std::string> addresses = {o.address};
  addresses.insert(addresses.end(), o.extra_addresses.begin(), o.extra_addresses.end());
  for (const std::string& a : addresses) {
    if (a.starts_with("unix:") ? a.size() == 5 : a.find(':') == std::string::npos) {
      return InvalidArgument("server address '" + a + "' is neither host:port nor unix:/path");
    }
  }
  return Status::Ok();
}

// Shared memory and CUDA IPC (docs/SHM.md).
Status CheckDelivery(const ServerOptions& o) {
  if (o.shm_arena_bytes < 0) {
    return InvalidArgument("shm_arena_bytes must be >= 0 (0 = off), got " + std::to_string(o.shm_arena_bytes));
  }
  if (o.shm_lease.count() <= 0) {
    return InvalidArgument("shm_lease must be > 0 ms, got " + std::to_string(o.shm_lease.count()));
  }
  if (o.ipc_export_bytes < 0) {
    return InvalidArgument("ipc_export_bytes must be >= 0 (0 = off), got " + std::to_string(o.ipc_export_bytes));
  }
  if (o.ipc_lease.count() < 0) {
    return InvalidArgument("ipc_lease must be >= 0 ms (0 = shm_lease), got " + std::to_string(o.ipc_lease.count()));
  }
  if (o.shm_max_sessions <= 0) {
    return InvalidArgument("shm_max_sessions must be > 0, got " + std::to_string(o.shm_max_sessions));
  }
  return Status::Ok();
}

// What a request may be, and the in-flight request budget.
Status CheckRequestLimits(const ServerOptions& o) {
  if (o.max_items_per_request <= 0) {
    return InvalidArgument("max_items_per_request must be > 0, got " + std::to_string(o.max_items_per_request));
  }
  if (o.max_request_bytes <= 0 || o.max_request_bytes > kMaxRequestBytes) {
    return InvalidArgument("max_request_bytes must be in (0, 2047 MiB], got " + std::to_string(o.max_request_bytes));
  }
  if (o.max_inflight_request_bytes < o.max_request_bytes) {
    return InvalidArgument("max_inflight_request_bytes (" + std::to_string(o.max_inflight_request_bytes) +
                           ") must be >= max_request_bytes (" + std::to_string(o.max_request_bytes) +
                           "): a request of the largest accepted size must fit the budget");
  }
  if (o.admission_wait.count() < 0) return InvalidArgument("admission_wait must be >= 0");
  return Status::Ok();
}

// Results waiting for clients, and the replies handed to gRPC.
Status CheckReplyLimits(const ServerOptions& o) {
  if (o.max_buffered_bytes <= 0) {
    return InvalidArgument("max_buffered_bytes must be > 0, got " + std::to_string(o.max_buffered_bytes));
  }
  if (o.max_buffered_bytes_per_tenant < 0) {
    return InvalidArgument("max_buffered_bytes_per_tenant must be >= 0 (0 = a quarter of max_buffered_bytes), got " +
                           std::to_string(o.max_buffered_bytes_per_tenant));
  }
  if (o.max_reply_bytes <= 0 || o.max_reply_bytes_per_connection <= 0) {
    return InvalidArgument("max_reply_bytes and max_reply_bytes_per_connection must be > 0, got " +
                           std::to_string(o.max_reply_bytes) + " and " +
                           std::to_string(o.max_reply_bytes_per_connection));
  }
  if (o.miss_reply_floor.count() < 0) {
    return InvalidArgument("miss_reply_floor must be >= 0 ms (0 = off), got " +
                           std::to_string(o.miss_reply_floor.count()));
  }
  if (o.write_timeout.count() < 0) {
    return InvalidArgument("write_timeout must be >= 0 ms (0 = never), got " + std::to_string(o.write_timeout.count()));
  }
  return Status::Ok();
}

// gRPC's own settings: keepalive, streams, handler threads.
Status CheckTransport(const ServerOptions& o) {
  if (o.keepalive.count() < 0 || o.keepalive_timeout.count() < 0) {
    return InvalidArgument("keepalive and keepalive_timeout must be >= 0 ms (0 = gRPC's default), got " +
                           std::to_string(o.keepalive.count()) + " and " + std::to_string(o.keepalive_timeout.count()));
  }
  if (o.max_concurrent_streams < 0) {
    return InvalidArgument("max_concurrent_streams must be >= 0 (0 = gRPC's default), got " +
                           std::to_string(o.max_concurrent_streams));
  }
  if (o.max_rpc_threads < 2) {
    return InvalidArgument("max_rpc_threads must be >= 2, got " + std::to_string(o.max_rpc_threads));
  }
  return Status::Ok();
}

}  // namespace

Status ServerOptions::Validate() const {
  for (Status (*check)(const ServerOptions&) :
       {CheckAddresses, CheckDelivery, CheckRequestLimits, CheckReplyLimits, CheckTransport}) {
    if (Status s = check(*this); !s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace epd
