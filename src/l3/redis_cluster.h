// src/l3/redis_cluster.h (internal to epd::l3): the client side of the Redis
// Cluster protocol for the shared tier (--l3 redis-cluster://HOST:PORT,...).
//
// What it does (the specification sections it follows are named in
// docs/L3.md, "Redis Cluster"):
// - Key slot: CRC16 (XMODEM: polynomial 0x1021, initial 0, no reflection)
//   of the key, or of its hash tag, modulo 16384. The hash tag is what lies
//   between the first '{' and the first '}' after it, when that is not
//   empty; otherwise the whole key is hashed. The tier's keys carry the
//   content key's hex as their tag ("epd:v:{<hex>}", "epd:lease:{<hex>}"),
//   so a value and its lease always share a slot.
// - Slot map: 16384 entries, each the master serving the slot, read with
//   CLUSTER SLOTS from any reachable node (the seeds first). It is read at
//   the first command, after a MOVED (the slot is pointed at once, the whole
//   map read again), and after a node failed (I/O error, timeout, refused
//   connection) so a promoted replica is found; two reads are at least
//   `kRefreshGap` apart.
// - Redirections: MOVED updates the slot and retries on the new owner; ASK
//   retries once on the named node with ASKING first, without touching the
//   map; TRYAGAIN and CLUSTERDOWN retry after a backoff (1, 2, 4 ms ... at
//   most the command timeout), at most kMaxAttempts commands in all.
// - Connections: one pool per node (Shard, src/l3/redis_shard.h), created
//   on first use and kept for the router's life (a cluster has few nodes).
//
// Errors: a command that still fails after kMaxAttempts returns its last
// result (an error reply, or the node's failure kind); the tier treats it as
// it treats a failed shard: a miss, or an encode without a lease.
// Thread safety: thread-safe. The slot map is under one mutex, held only to
// read or write entries, never across a network call.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/mutex.h"
#include "epd/core/status.h"
#include "epd/core/thread_annotations.h"
#include "redis_router.h"

namespace epd::internal {

inline constexpr int kClusterSlots = 16384;
inline constexpr int kMaxAttempts = 6;
inline constexpr std::chrono::milliseconds kRefreshGap{100};

// CRC16-XMODEM of `bytes` (the Redis Cluster key hash).
std::uint16_t Crc16(std::string_view bytes);
// The part of `key` that is hashed: its hash tag when it has a non-empty
// one, else the whole key.
std::string_view HashTag(std::string_view key);
// The slot of `key`, 0..16383.
int KeySlot(std::string_view key);

// A redirection in an error reply: "MOVED <slot> <host>:<port>" or
// "ASK <slot> <host>:<port>". An empty host means the node that answered
// (Redis 7 sends that when the endpoint is unknown).
struct Redirect {
  bool ask = false;  // false: MOVED
  int slot = 0;
  std::string host;
  int port = 0;
};
// nullopt when `error` is no redirection or is malformed (slot outside
// 0..16383, no port, port outside 1..65535).
std::optional<Redirect> ParseRedirect(std::string_view error);

// A range of slots and the address of its master.
struct SlotRange {
  int first = 0;
  int last = 0;
  std::string host;
  int port = 0;
};
// Reads a CLUSTER SLOTS reply; an empty or "?" host is `asked_host` (the
// node that answered). kInvalidArgument naming what is malformed.
StatusOr<std::vector<SlotRange>> ParseClusterSlots(const redisReply* reply, std::string_view asked_host);

// redis-cluster://[[user]:password@]host:port[,host:port...]: the seeds,
// each a RedisUrl carrying the credentials, database 0. kInvalidArgument
// naming what is wrong (no seed, a bad seed, a database other than 0: a
// cluster has database 0 only, a seed listed twice).
StatusOr<std::vector<RedisUrl>> ParseClusterUrl(std::string_view url);

class ClusterRouter final : public Router {
 public:
  // `o` must outlive the router. REQUIRES: !seeds.empty().
  ClusterRouter(std::vector<RedisUrl> seeds, const RedisTierOptions& o);

  CommandResult Run(const ContentKey& key, std::string_view redis_key,
                    const std::vector<std::string_view>& argv) override;
  bool degraded() const override;
  void AddStats(SharedTierStats& s) const override;
  std::string Describe() const override;

  // The node serving `slot` now ("host:port/0"), empty when unknown. For tests.
  std::string NodeOfSlot(int slot) const;

 private:
  using Clock = std::chrono::steady_clock;
  // The pool of host:port, created on first use.
  Shard& Node(const std::string& host, int port);
  // The pool serving `slot`; reads the map first when the slot is unknown.
  Shard* NodeFor(int slot);
  // Reads the map from the first node that answers, unless one was read
  // less than kRefreshGap ago (then returns at once). True when a map was read.
  bool Refresh();
  bool RefreshFrom(Shard& node);
  void PointSlot(int slot, Shard* node);

  const RedisTierOptions& opt_;
  const std::vector<RedisUrl> seeds_;
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<Shard>> nodes_ EPD_GUARDED_BY(mu_);  // by "host:port"
  std::array<Shard*, kClusterSlots> slots_ EPD_GUARDED_BY(mu_){};            // null = unknown
  bool mapped_ EPD_GUARDED_BY(mu_) = false;                                  // a map was read once
  Mutex refresh_mu_;                                                         // one reader of the map at a time
  Clock::time_point last_refresh_ EPD_GUARDED_BY(refresh_mu_);
  std::atomic<std::uint64_t> moved_{0}, ask_{0}, refreshes_{0};
};

}  // namespace epd::internal
