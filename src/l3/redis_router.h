// src/l3/redis_router.h (internal to epd::l3): where the shared tier
// (epd/l3/redis_tier.h) sends a command for one content key.
//
// Two routers: the ring of independent Redis servers that this process keeps
// itself (MakeRingRouter: consistent hashing, epd/l3/l3_ring.h), and Redis
// Cluster (src/l3/redis_cluster.h: the cluster's own slot map, followed
// through its redirections). Every command the tier sends names one key, so
// a router needs only that key to place it.
//
// Thread safety: implementations are thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/shared_tier.h"
#include "epd/l3/redis_tier.h"
#include "redis_shard.h"

namespace epd::internal {

class Router {
 public:
  virtual ~Router() = default;
  // Runs `argv`, whose only key is `redis_key` (the tier's key for content
  // key `key`), where that key lives. Never throws; CommandResult::node
  // names the node that answered last.
  virtual CommandResult Run(const ContentKey& key, std::string_view redis_key,
                            const std::vector<std::string_view>& argv) = 0;
  // True while some node is marked down (or the slot map is unknown).
  virtual bool degraded() const = 0;
  // Adds the router's own counters (redirections, slot-map reads).
  virtual void AddStats(SharedTierStats& s) const = 0;
  // "redis://a,redis://b" or "redis-cluster://seed,...", no credentials.
  virtual std::string Describe() const = 0;
};

// The ring of independent servers, one Shard per URL. `o` must outlive it.
std::unique_ptr<Router> MakeRingRouter(std::vector<RedisUrl> urls, const RedisTierOptions& o);

}  // namespace epd::internal
