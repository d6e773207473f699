// epd/core/shared_tier.h: a cache tier shared by several encode processes (L3),
// behind each process's own L1/L2, and the cluster-wide lease that lets one
// process at a time encode a key.
//
// What it is: the interface the worker's front door (WorkerLoop) calls for
// keys its own L1/L2 miss; epd::l3 implements it on Redis (epd/l3/redis_tier.h).
// Unlike L1/L2, which one thread owns, a SharedTier is called from several
// helper threads at once, and every call may go over the network: Get and
// TryLease block for at most the implementation's timeout, PutAsync and
// ReleaseAsync only enqueue. No call ever blocks the worker thread (WorkerLoop
// calls the blocking ones from its own lookup threads).
//
// Failure is never fatal: an unreachable, slow or full tier makes Get return
// an error (served as a miss), TryLease return kError (encode without a
// lease), and writes get dropped; each is counted in Stats(), and
// Stats().degraded says so until the tier answers again.
//
// Ownership: Get returns a fresh host Embedding the caller owns (shared, then
// immutable). PutAsync keeps `embedding` alive until it is written.
//
// Thread safety: thread-safe (every method, concurrently).
//
// Example (what WorkerLoop does for a key L1/L2 miss):
//   StatusOr<EmbeddingPtr> v = tier.Get(key);
//   if (v.ok() && *v) return Serve(*v, ItemSource::kL3);
//   switch (tier.TryLease(key)) {
//     case LeaseResult::kHeldByOther: return WaitAndRetry(key);
//     default: Encode(key); tier.PutAsync(key, embedding);   // releases the lease
//   }
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "epd/core/content_key_type.h"
#include "epd/core/embedding.h"
#include "epd/core/stat_fields.h"
#include "epd/core/status.h"

namespace epd {

// The answer of SharedTier::TryLease.
enum class LeaseResult : std::uint8_t {
  kAcquired = 0,     // this process holds the lease now: encode, then PutAsync
  kHeldByUs = 1,     // an earlier call of this process holds it: encode (the
                     // worker joins the computation in process)
  kHeldByOther = 2,  // another process holds it: wait for its value
  kError = 3,        // the tier did not answer: encode without a lease
};

// How a caller waits for a key another process holds the lease on. Polling
// with exponential backoff from `poll_initial` to `poll_max`, for at most
// `wait` (then the caller encodes itself). Durations, not time points: no
// clock is compared across hosts.
struct LeaseWaitPolicy {
  bool single_flight = true;  // false: never take or wait on a lease
  std::chrono::milliseconds wait{5000};
  std::chrono::milliseconds poll_initial{2};
  std::chrono::milliseconds poll_max{50};
  int lookup_threads = 4;  // threads doing the blocking Get / TryLease calls
};

// Counters since start (monotonic) and the tier's state now.
struct SharedTierStats {
  bool degraded = false;      // now: the last operation on some shard failed
  std::uint64_t gets = 0;     // Get calls
  std::uint64_t hits = 0;     // Gets that returned a valid value
  std::uint64_t misses = 0;   // Gets that found no value
  std::uint64_t corrupt = 0;  // values rejected (header, checksum, key, grid, non-finite rows),
                              // also misses; and values the caller refused (RejectAsync), which
                              // Get had counted as hits
  // With a cluster key (--l3-key-file): values refused because they carry no
  // valid MAC under a key this process holds (format 1, an unknown or retired
  // key id, a tag mismatch); also misses, not counted in `corrupt`.
  std::uint64_t auth_failures = 0;
  // ... and leases refused likewise (forged, copied from another key,
  // replayed after their expiry): deleted and taken by this process.
  std::uint64_t lease_auth_failures = 0;
  std::uint64_t writes = 0;       // values written
  std::uint64_t write_bytes = 0;  // their encoded bytes
  std::uint64_t write_drops = 0;  // writes dropped: queue full or the tier failed
  std::uint64_t leases_acquired = 0;
  std::uint64_t leases_released = 0;  // compare-and-delete that found our lease
  // Filled by the caller's wait loop (WorkerLoop), not by the tier:
  std::uint64_t lease_waits = 0;          // items that waited for another holder
  std::uint64_t lease_wait_hits = 0;      // ... and got its value
  std::uint64_t lease_takeovers = 0;      // ... and took the lease after it lapsed
  std::uint64_t lease_wait_timeouts = 0;  // ... and gave up after LeaseWaitPolicy::wait
  // Redis Cluster only (redis-cluster://, docs/L3.md): redirections followed
  // and slot maps read (CLUSTER SLOTS).
  std::uint64_t redirects_moved = 0;
  std::uint64_t redirects_ask = 0;
  std::uint64_t slot_map_refreshes = 0;
  // Failed operations by kind: "connect", "timeout", "io", "oom", "auth",
  // "reply" (any other error reply), "down" (skipped while reconnecting).
  std::map<std::string, std::uint64_t> errors;
  // The same failures by node ("host:port/db"), redirections excluded.
  std::map<std::string, std::uint64_t> node_errors;
};

// Every numeric field of SharedTierStats, once (epd/core/stat_fields.h). In
// StatsResponse the counters are entries of the map l3_counters, sent only by
// a server with a tier; `errors` (by kind) and `node_errors` are no numbers
// and travel by hand (l3_errors, epd_l3_errors_total{kind}; l3_node_errors,
// epd_l3_node_errors_total{node}).
// A row per field reads as a table; clang-format would give each cell a line.
// clang-format off
inline constexpr StatField<SharedTierStats> kSharedTierStatsFields[] = {
    // name, member, kind, unit, help,
    //   proto field (or map entry), Prometheus series, replay --json key (under "l3")
    {"degraded", &SharedTierStats::degraded, StatKind::kGauge, StatUnit::kFlag,
     "1 while the last operation on some L3 Redis failed",
     {"l3_degraded"}, {"epd_l3_degraded"}, "degraded"},
    {"gets", &SharedTierStats::gets, StatKind::kCounter, StatUnit::kCount,
     "L3 Get calls",
     {"l3_counters", "gets"}, {"epd_l3_gets_total"}, ""},
    {"hits", &SharedTierStats::hits, StatKind::kCounter, StatUnit::kCount,
     "L3 Gets that returned a valid value",
     {"l3_counters", "hits"}, {"epd_l3_hits_total"}, "hits"},
    {"misses", &SharedTierStats::misses, StatKind::kCounter, StatUnit::kCount,
     "L3 Gets that found no value (corrupt ones included)",
     {"l3_counters", "misses"}, {"epd_l3_misses_total"}, "misses"},
    {"corrupt", &SharedTierStats::corrupt, StatKind::kCounter, StatUnit::kCount,
     "L3 values rejected: header, checksum, key, grid, non-finite rows, or by the caller's check",
     {"l3_counters", "corrupt"}, {"epd_l3_corrupt_total"}, "corrupt"},
    {"auth_failures", &SharedTierStats::auth_failures, StatKind::kCounter, StatUnit::kCount,
     "L3 values refused for no valid MAC under the cluster key (--l3-key-file)",
     {"l3_counters", "auth_failures"}, {"epd_l3_auth_failures_total"}, ""},
    {"lease_auth_failures", &SharedTierStats::lease_auth_failures, StatKind::kCounter, StatUnit::kCount,
     "L3 leases refused for no valid MAC under the cluster key, deleted and taken",
     {"l3_counters", "lease_auth_failures"}, {"epd_l3_lease_auth_failures_total"}, ""},
    {"writes", &SharedTierStats::writes, StatKind::kCounter, StatUnit::kCount,
     "L3 values written",
     {"l3_counters", "writes"}, {"epd_l3_writes_total"}, "writes"},
    {"write_bytes", &SharedTierStats::write_bytes, StatKind::kCounter, StatUnit::kBytes,
     "Encoded bytes of the L3 values written",
     {"l3_counters", "write_bytes"}, {"epd_l3_write_bytes_total"}, ""},
    {"write_drops", &SharedTierStats::write_drops, StatKind::kCounter, StatUnit::kCount,
     "L3 writes dropped: queue full or the tier failed",
     {"l3_counters", "write_drops"}, {"epd_l3_write_drops_total"}, "write_drops"},
    {"leases_acquired", &SharedTierStats::leases_acquired, StatKind::kCounter, StatUnit::kCount,
     "L3 leases taken",
     {"l3_counters", "leases_acquired"}, {"epd_l3_leases_acquired_total"}, ""},
    {"leases_released", &SharedTierStats::leases_released, StatKind::kCounter, StatUnit::kCount,
     "L3 leases released (compare-and-delete found ours)",
     {"l3_counters", "leases_released"}, {"epd_l3_leases_released_total"}, ""},
    {"lease_waits", &SharedTierStats::lease_waits, StatKind::kCounter, StatUnit::kCount,
     "Items that waited for another process's L3 lease",
     {"l3_counters", "lease_waits"}, {"epd_l3_lease_waits_total"}, "lease_waits"},
    {"lease_wait_hits", &SharedTierStats::lease_wait_hits, StatKind::kCounter, StatUnit::kCount,
     "Lease waits that got the holder's value",
     {"l3_counters", "lease_wait_hits"}, {"epd_l3_lease_wait_hits_total"}, ""},
    {"lease_takeovers", &SharedTierStats::lease_takeovers, StatKind::kCounter, StatUnit::kCount,
     "Lease waits that took the lease after it lapsed",
     {"l3_counters", "lease_takeovers"}, {"epd_l3_lease_takeovers_total"}, "lease_takeovers"},
    {"lease_wait_timeouts", &SharedTierStats::lease_wait_timeouts, StatKind::kCounter, StatUnit::kCount,
     "Lease waits that gave up (LeaseWaitPolicy::wait)",
     {"l3_counters", "lease_wait_timeouts"}, {"epd_l3_lease_wait_timeouts_total"}, ""},
    {"redirects_moved", &SharedTierStats::redirects_moved, StatKind::kCounter, StatUnit::kCount,
     "Redis Cluster MOVED redirections followed",
     {"l3_counters", "redirects_moved"}, {"epd_l3_redirects_moved_total"}, ""},
    {"redirects_ask", &SharedTierStats::redirects_ask, StatKind::kCounter, StatUnit::kCount,
     "Redis Cluster ASK redirections followed (ASKING and one retry)",
     {"l3_counters", "redirects_ask"}, {"epd_l3_redirects_ask_total"}, ""},
    {"slot_map_refreshes", &SharedTierStats::slot_map_refreshes, StatKind::kCounter, StatUnit::kCount,
     "Redis Cluster slot maps read (CLUSTER SLOTS)",
     {"l3_counters", "slot_map_refreshes"}, {"epd_l3_slot_map_refreshes_total"}, ""},
};
// clang-format on

class SharedTier {
 public:
  virtual ~SharedTier() = default;

  // The value stored for `key`: a host Embedding, or nullptr for a miss (a
  // rejected value is a miss too, counted in `corrupt` or `auth_failures`). kUnavailable /
  // kDeadlineExceeded when the tier did not answer in time. Blocks up to the
  // tier's timeout.
  // `encode_seconds`, when set, receives the encode cost stored with the
  // value (seconds, measured where it was encoded), or -1
  // (EntryCost::kUnmeasured) when it carries none or on a miss.
  virtual StatusOr<EmbeddingPtr> Get(const ContentKey& key, double* encode_seconds) = 0;
  StatusOr<EmbeddingPtr> Get(const ContentKey& key) { return Get(key, nullptr); }
  // Tries to take the cluster-wide lease on `key` (see LeaseResult). Blocks
  // up to the tier's timeout.
  virtual LeaseResult TryLease(const ContentKey& key) = 0;
  // Queues a write of `embedding` under `key` (host bytes are read on the
  // writer's thread: ToHost), then the release of this process's lease on it,
  // if held. Never blocks; dropped and counted when the queue is full.
  // `encode_seconds` is the entry's measured encode cost, stored with it
  // (-1: none).
  virtual void PutAsync(const ContentKey& key, EmbeddingPtr embedding, double encode_seconds) = 0;
  void PutAsync(const ContentKey& key, EmbeddingPtr embedding) { PutAsync(key, std::move(embedding), -1); }
  // Queues the release of this process's lease on `key`, if held (e.g. the
  // encode failed). Never blocks.
  virtual void ReleaseAsync(const ContentKey& key) = 0;
  // The caller's own check refused the value Get just returned for `key`
  // (e.g. the worker found that its grid, tokens, hidden size, dtype or
  // deepstack layers differ from what the request's header probe predicts;
  // issue 27, fault 3). Queues the deletion of the stored value, only if it
  // is still the one this Get read (a compare-and-delete on its header,
  // whose checksum or MAC covers the rows: a value rewritten meanwhile
  // survives), and counts it in `corrupt`; `why` goes to the log. The caller
  // then encodes the item, and its write replaces the value. A key this
  // process has not read lately (the last 1024 hits) is only counted.
  // Never blocks.
  virtual void RejectAsync(const ContentKey& key, const std::string& why) = 0;

  virtual LeaseWaitPolicy wait_policy() const = 0;
  virtual SharedTierStats Stats() const = 0;
  // "redis://host:port,..." without credentials, for logs.
  virtual std::string Describe() const = 0;
};

}  // namespace epd
