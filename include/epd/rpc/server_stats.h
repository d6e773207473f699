// epd/rpc/server_stats.h: the counters one encode server reports (the Stats RPC,
// EncodeServer::Stats, EncodeClient::Stats).
//
// They are WorkerStats (epd/core/encode_types.h: every accepted item is counted
// in exactly one of hits_l1, hits_l2, hits_l3, joins, misses) plus what only
// the server sees: cache capacities, calls that ended with an error, result
// bytes waiting for slow clients, and the shared tier's (L3) counters. Each
// struct has its field table beside it (epd/core/stat_fields.h).
//
// Thread safety: value type; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "epd/core/encode_types.h"
#include "epd/core/shared_tier.h"
#include "epd/core/stat_fields.h"
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

// Every field of ShmStats, once (epd/core/stat_fields.h); in StatsResponse each
// is shm_<name>.
// A row per field reads as a table; clang-format would give each cell a line.
// clang-format off
inline constexpr StatField<ShmStats> kShmStatsFields[] = {
    // name, member, kind, unit, help,
    //   proto field, Prometheus series, replay --json key
    {"capacity_bytes", &ShmStats::capacity_bytes, StatKind::kGauge, StatUnit::kBytes,
     "Size of the shared-memory arena",
     {"shm_capacity_bytes"}, {"epd_shm_capacity_bytes"}, ""},
    {"leased_bytes", &ShmStats::leased_bytes, StatKind::kGauge, StatUnit::kBytes,
     "Arena bytes under lease (each shared span once)",
     {"shm_leased_bytes"}, {"epd_shm_leased_bytes"}, ""},
    {"leases", &ShmStats::leases, StatKind::kGauge, StatUnit::kCount,
     "Shared-memory leases held by clients",
     {"shm_leases"}, {"epd_shm_leases"}, ""},
    {"items", &ShmStats::items, StatKind::kCounter, StatUnit::kCount,
     "Items delivered by reference into the arena",
     {"shm_items"}, {"epd_shm_items_total"}, ""},
    {"reused", &ShmStats::reused, StatKind::kCounter, StatUnit::kCount,
     "Items delivered from a span already holding the key (no copy)",
     {"shm_reused"}, {"epd_shm_reused_total"}, ""},
    {"evicted", &ShmStats::evicted, StatKind::kCounter, StatUnit::kCount,
     "Idle spans evicted to make room",
     {"shm_evicted"}, {}, ""},
    {"fallbacks", &ShmStats::fallbacks, StatKind::kCounter, StatUnit::kCount,
     "Items asked for by shared memory but sent inline (arena full)",
     {"shm_fallbacks"}, {"epd_shm_fallbacks_total"}, ""},
    {"released", &ShmStats::released, StatKind::kCounter, StatUnit::kCount,
     "Shared-memory leases ended by a release",
     {"shm_released"}, {}, ""},
    {"expired", &ShmStats::expired, StatKind::kCounter, StatUnit::kCount,
     "Shared-memory leases ended by their deadline",
     {"shm_expired"}, {"epd_shm_expired_total"}, ""},
    {"refused_releases", &ShmStats::refused_releases, StatKind::kCounter, StatUnit::kCount,
     "Releases that matched no lease (repeated, stale or expired)",
     {"shm_refused_releases"}, {"epd_shm_refused_releases_total"}, ""},
    {"sessions", &ShmStats::sessions, StatKind::kGauge, StatUnit::kCount,
     "Lease sessions open now",
     {"shm_sessions"}, {"epd_shm_sessions"}, ""},
    {"sessions_opened", &ShmStats::sessions_opened, StatKind::kCounter, StatUnit::kCount,
     "Lease sessions ever opened",
     {"shm_sessions_opened"}, {}, ""},
    {"sessions_refused", &ShmStats::sessions_refused, StatKind::kCounter, StatUnit::kCount,
     "Session calls refused at ServerOptions::shm_max_sessions",
     {"shm_sessions_refused"}, {}, ""},
    {"session_reclaimed", &ShmStats::session_reclaimed, StatKind::kCounter, StatUnit::kCount,
     "Shared-memory leases ended because their session ended",
     {"shm_session_reclaimed"}, {"epd_shm_session_reclaimed_total"}, ""},
    {"session_unknown", &ShmStats::session_unknown, StatKind::kCounter, StatUnit::kCount,
     "Encode calls that named a session not open here",
     {"shm_session_unknown"}, {}, ""},
};
// clang-format on

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

// Every field of IpcStats, once; in StatsResponse each is ipc_<name>.
// A row per field reads as a table; clang-format would give each cell a line.
// clang-format off
inline constexpr StatField<IpcStats> kIpcStatsFields[] = {
    // name, member, kind, unit, help,
    //   proto field, Prometheus series, replay --json key
    {"capacity_bytes", &IpcStats::capacity_bytes, StatKind::kGauge, StatUnit::kBytes,
     "Bound on bytes of live CUDA IPC exports",
     {"ipc_capacity_bytes"}, {"epd_ipc_capacity_bytes"}, ""},
    {"exported_bytes", &IpcStats::exported_bytes, StatKind::kGauge, StatUnit::kBytes,
     "Bytes of live CUDA IPC exports (each shared export once)",
     {"ipc_exported_bytes"}, {"epd_ipc_exported_bytes"}, ""},
    {"leases", &IpcStats::leases, StatKind::kGauge, StatUnit::kCount,
     "CUDA IPC leases held by clients",
     {"ipc_leases"}, {"epd_ipc_leases"}, ""},
    {"exports", &IpcStats::exports, StatKind::kGauge, StatUnit::kCount,
     "Live CUDA IPC exports",
     {"ipc_exports"}, {}, ""},
    {"items", &IpcStats::items, StatKind::kCounter, StatUnit::kCount,
     "Items delivered by CUDA IPC",
     {"ipc_items"}, {"epd_ipc_items_total"}, ""},
    {"reused", &IpcStats::reused, StatKind::kCounter, StatUnit::kCount,
     "Items delivered from a live export of their key (no copy)",
     {"ipc_reused"}, {"epd_ipc_reused_total"}, ""},
    {"fallbacks", &IpcStats::fallbacks, StatKind::kCounter, StatUnit::kCount,
     "Items asked for by CUDA IPC but sent otherwise (bound reached, export failed)",
     {"ipc_fallbacks"}, {"epd_ipc_fallbacks_total"}, ""},
    {"not_resident", &IpcStats::not_resident, StatKind::kCounter, StatUnit::kCount,
     "Items asked for by CUDA IPC whose rows were not in device memory",
     {"ipc_not_resident"}, {"epd_ipc_not_resident_total"}, ""},
    {"released", &IpcStats::released, StatKind::kCounter, StatUnit::kCount,
     "CUDA IPC leases ended by a release",
     {"ipc_released"}, {}, ""},
    {"expired", &IpcStats::expired, StatKind::kCounter, StatUnit::kCount,
     "CUDA IPC leases ended by their deadline",
     {"ipc_expired"}, {"epd_ipc_expired_total"}, ""},
    {"refused_releases", &IpcStats::refused_releases, StatKind::kCounter, StatUnit::kCount,
     "CUDA IPC releases that matched no lease",
     {"ipc_refused_releases"}, {"epd_ipc_refused_releases_total"}, ""},
    {"session_reclaimed", &IpcStats::session_reclaimed, StatKind::kCounter, StatUnit::kCount,
     "CUDA IPC leases ended because their session ended",
     {"ipc_session_reclaimed"}, {"epd_ipc_session_reclaimed_total"}, ""},
};
// clang-format on

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
  // Bytes of results queued on calls and not yet written.
  std::int64_t buffered_bytes = 0;
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

// The numeric fields of ServerStats itself, once. The structs it holds have
// their own tables (kWorkerStatsFields, kShmStatsFields, kIpcStatsFields,
// kSharedTierStatsFields, the last sent and exported only when l3_enabled);
// server_id and rpc_errors (by status code) are no numbers and travel by hand
// (StatsResponse server_id and rpc_errors, epd_rpc_errors_total{code}). The
// request budget's two gauges stay in the process: neither the Stats RPC nor
// /metrics carries them.
// A row per field reads as a table; clang-format would give each cell a line.
// clang-format off
inline constexpr StatField<ServerStats> kServerStatsFields[] = {
    // name, member, kind, unit, help,
    //   proto field, Prometheus series, replay --json key
    {"l1_capacity_bytes", &ServerStats::l1_capacity_bytes, StatKind::kGauge, StatUnit::kBytes,
     "Cache capacity, by tier",
     {"l1_capacity_bytes"}, {"epd_cache_capacity_bytes", "tier", "l1"}, ""},
    {"l2_capacity_bytes", &ServerStats::l2_capacity_bytes, StatKind::kGauge, StatUnit::kBytes,
     "Cache capacity, by tier",
     {"l2_capacity_bytes"}, {"epd_cache_capacity_bytes", "tier", "l2"}, ""},
    {"buffered_bytes", &ServerStats::buffered_bytes, StatKind::kGauge, StatUnit::kBytes,
     "Result bytes waiting to be written to clients",
     {"buffered_bytes"}, {"epd_buffered_bytes"}, ""},
    {"request_bytes_in_flight", &ServerStats::request_bytes_in_flight, StatKind::kGauge, StatUnit::kBytes,
     "Message bytes of admitted Encode calls not yet ended (the request budget)",
     {}, {}, ""},
    {"admission_waiting", &ServerStats::admission_waiting, StatKind::kGauge, StatUnit::kCount,
     "Encode calls waiting for room in the request budget",
     {}, {}, ""},
    {"l3_enabled", &ServerStats::l3_enabled, StatKind::kGauge, StatUnit::kFlag,
     "1 when the server has a shared tier (L3)",
     {"l3_enabled"}, {}, ""},
};
// clang-format on

}  // namespace epd
