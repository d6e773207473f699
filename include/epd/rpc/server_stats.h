// epd/rpc/server_stats.h: the counters one encode server reports (the Stats RPC,
// EncodeServer::Stats, EncodeClient::Stats).
//
// They are WorkerStats (epd/core/encode_types.h: every accepted item is counted
// in exactly one of hits_l1, hits_l2, hits_l3, joins, misses) plus what only
// the server sees: cache capacities, calls that ended with an error, result
// bytes waiting for slow clients, and the shared tier's (L3) counters.
//
// Thread safety: value type; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "epd/core/encode_types.h"
#include "epd/core/shared_tier.h"
#include "epd/core/status.h"

namespace epd {

// Shared-memory delivery (docs/SHM.md); all 0 when the server has no arena.
struct ShmStats {
  std::int64_t capacity_bytes = 0;     // the arena's size
  std::int64_t leased_bytes = 0;       // spans under lease now (a span shared by leases counts once), in granules
  std::int64_t leases = 0;             // leases held now
  std::uint64_t items = 0;             // items delivered through the arena
  std::uint64_t reused = 0;            // of those, served from a span already holding the key (no copy)
  std::uint64_t evicted = 0;           // idle spans evicted to make room
  std::uint64_t fallbacks = 0;         // asked for shared memory, sent inline (arena full)
  std::uint64_t released = 0;          // leases ended by a release
  std::uint64_t expired = 0;           // leases ended by their deadline
  std::uint64_t refused_releases = 0;  // releases that matched no lease (twice, stale, expired)
  // Lease sessions (docs/SHM.md, "Crashed clients"): a client's Session
  // stream, whose end releases the leases made under it.
  std::int64_t sessions = 0;            // open now
  std::uint64_t sessions_opened = 0;    // ever opened
  std::uint64_t sessions_refused = 0;   // refused at ServerOptions::shm_max_sessions
  std::uint64_t session_reclaimed = 0;  // leases ended because their session ended
  std::uint64_t session_unknown = 0;    // Encode calls that named a session not open here
};

// CUDA IPC delivery (docs/SHM.md, "CUDA IPC"); all 0 without it.
struct IpcStats {
  std::int64_t capacity_bytes = 0;      // the bound on exported bytes (ServerOptions::ipc_export_bytes)
  std::int64_t exported_bytes = 0;      // bytes of live exports now (an export shared by leases counts once)
  std::int64_t leases = 0;              // leases held now
  std::int64_t exports = 0;             // live exports now
  std::uint64_t items = 0;              // items delivered by CUDA IPC
  std::uint64_t reused = 0;             // of those, served from a live export of the key (no copy)
  std::uint64_t fallbacks = 0;          // asked for CUDA IPC, sent otherwise: bound reached or export failed
  std::uint64_t not_resident = 0;       // asked for CUDA IPC, sent otherwise: rows not in device memory
  std::uint64_t released = 0;           // leases ended by a release
  std::uint64_t expired = 0;            // leases ended by their deadline
  std::uint64_t refused_releases = 0;   // releases that matched no lease (twice, stale, expired)
  std::uint64_t session_reclaimed = 0;  // leases ended because their lease session ended (ShmStats::sessions)
};

struct ServerStats {
  std::string server_id;
  WorkerStats worker;
  std::int64_t l1_capacity_bytes = 0;
  std::int64_t l2_capacity_bytes = 0;
  // Calls finished with a non-OK status, by code: every service (Encode,
  // Health, Stats, grpc.health.v1, reflection), refusals before a handler
  // ran included (a request that does not parse: INVALID_ARGUMENT; one over
  // max_request_bytes: RESOURCE_EXHAUSTED, up to twice that size, see
  // ServerOptions::max_request_bytes).
  std::map<StatusCode, std::uint64_t> rpc_errors;
  // Bytes of results delivered to calls and not yet sent: queued on a call,
  // or in a write the client has not accepted yet (a call's last write:
  // until the call is done).
  std::int64_t buffered_bytes = 0;
  // Replies to clients that read slowly or not at all (docs/SERVER.md,
  // "Clients that stop reading"): the memory held now for replies handed to
  // gRPC and not yet sent (twice each message: the server's copy and gRPC's
  // serialized one); calls ended with RESOURCE_EXHAUSTED because a reply
  // would pass the per-connection or the total reply budget; calls whose
  // tenant's unsent results passed its share of max_buffered_bytes (counted
  // once each); calls cancelled because the client accepted no reply bytes
  // for write_timeout.
  std::int64_t reply_held_bytes = 0;
  std::uint64_t reply_refusals = 0;
  std::uint64_t throttled_calls = 0;
  std::uint64_t write_timeouts = 0;
  // The in-flight request budget (ServerOptions::max_inflight_request_bytes):
  // the message bytes of admitted Encode calls not yet ended (0 once every
  // call has ended), and the calls waiting for room in it.
  std::int64_t request_bytes_in_flight = 0;
  std::int64_t admission_waiting = 0;
  ShmStats shm;
  IpcStats ipc;
  // The shared tier (L3, epd/core/shared_tier.h): whether the server has one, and
  // its counters (all zero without one).
  bool l3_enabled = false;
  SharedTierStats l3;
};

}  // namespace epd
