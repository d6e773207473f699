// src/worker/worker_cache.h (internal to epd::worker): the worker's L1/L2
// cache: placement, the device-hook fences, L3 adoption and the one hit check.
//
// What it adds to TieredEmbeddingCache (epd/core/tiered_cache.h):
//   - The hit check (Fits): an embedding is served only when its shape is
//     what the tower gives for the tokens the item expects (rows, hidden
//     size, deepstack layers, dtype) and its bytes match that shape. Images,
//     whole videos, temporal chunks and L3 values all go through it.
//   - The L2-only rule: an entry too big for L1 but not for L2 is put into L2
//     directly (after the device-to-host copy a demotion makes) and served
//     from there without promotion (a host-to-device copy per hit, the entry
//     stays L2's most recently used). The tiered cache alone, like the
//     reference, would skip it at put and lose it at promotion, so such an
//     image ran the tower on every repeat. The rule stays here rather than
//     in TieredEmbeddingCache because it depends on the worker's hooks.
//   - Fences: a to_host or to_device hook that throws (a device failure) is
//     caught and counted (WorkerStats::cache_errors): a failed promotion is
//     served as a miss, a failed demotion drops the victim (the eviction goes
//     on, so L1 stays within its capacity: unwinding out of the cache would
//     abandon it half-way), a failed L2-only placement drops the entry.
//
// Counts in the WorkerStats it is given: shape_mismatches, cache_errors,
// hits_l1 / hits_l2 (ServeHit only), hits_l3 (Adopt).
//
// Complexity: each call O(1) map work plus the hooks' copies.
// Thread safety: thread-compatible (the worker's owning thread). Contains may
// run concurrently with nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "epd/core/content_key_type.h"
#include "epd/core/embedding.h"
#include "epd/core/encode_types.h"
#include "epd/core/tiered_cache.h"
#include "epd/core/vision_tower.h"
#include "epd/worker/worker_options.h"

namespace epd::internal {

class WorkerCache {
 public:
  // `options` (capacities and hooks), `tower` (the shape a hit must have)
  // and `stats` must outlive the cache.
  WorkerCache(const WorkerOptions& options, const VisionTower& tower, WorkerStats& stats);

  // THE hit check: `e` has the shape the tower gives for `tokens` post-merge
  // tokens (0 = whatever count it holds) and the bytes that shape implies.
  bool Fits(const Embedding& e, std::int64_t tokens) const;

  struct Hit {
    EmbeddingPtr embedding;
    ItemSource source;  // kL1 or kL2
  };
  // An L1/L2 hit that Fits `tokens`; nullopt for a miss, a failed promotion
  // (counted in cache_errors) or a hit of another shape (counted in
  // shape_mismatches, left cached: the re-encode overwrites it).
  std::optional<Hit> Lookup(const ContentKey& key, std::int64_t tokens);
  // Lookup, and on a hit sets res.embedding and res.source and counts it in
  // hits_l1 / hits_l2. Returns whether it hit.
  bool ServeHit(const ContentKey& key, std::int64_t tokens, ItemResult& res);
  // A value the shared tier (L3) supplied: checked with Fits(tokens)
  // (mismatch counted), moved to the device when to_device is set (a throw
  // counted in cache_errors), cached and counted in hits_l3. nullopt when
  // it cannot be served; the item is then encoded.
  // It is charged to `tenant` (see Put).
  std::optional<EmbeddingPtr> Adopt(const ContentKey& key, EmbeddingPtr ready, std::int64_t tokens,
                                    TenantId tenant = kSharedTenant);
  // Caches `e` (L1, or L2 under the L2-only rule), charged to `tenant` (an
  // id from TenantOf; ignored without quotas). Never throws from a hook. A
  // put a tenant's reservation plus the shared pool cannot hold is refused
  // (counted per tier in Report's tenant rows).
  void Put(const ContentKey& key, const EmbeddingPtr& e, TenantId tenant = kSharedTenant);
  // The id entries of tenant `name` are charged to: interned in
  // WorkerOptions::tenant_quotas, whose reservation for it is set in both
  // tiers on first sight; kSharedTenant without quotas. O(1) expected.
  TenantId TenantOf(std::string_view name);
  // `host` copied to the device by to_device; `host` itself when the hook
  // is unset, returns null or throws (counted in cache_errors).
  EmbeddingPtr OnDevice(EmbeddingPtr host);

  bool Contains(const ContentKey& key) const { return cache_.Contains(key); }
  // Fills the cache fields of `s` (evictions, tier moves, occupancy).
  void Report(WorkerStats& s) const;

 private:
  using Cache = TieredEmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash>;

  Cache::CopyFn FencedToHost();
  // to_host behind its fence: null when it threw.
  EmbeddingPtr HostCopy(const EmbeddingPtr& e);
  bool L2Only(std::int64_t nbytes) const;
  // The L2-only rule's get: an L2 entry L1 cannot take, copied for the
  // caller and left in L2 as MRU; nullopt when the key is in L1, absent or
  // promotable (the tiered get takes it).
  std::optional<EmbeddingPtr> L2OnlyGet(const ContentKey& key);
  // Sets tenant t's reservation in both tiers once.
  void Reserve(TenantId t);
  // A get behind the promotion fence.
  std::optional<EmbeddingPtr> Get(const ContentKey& key, CacheTier* tier);

  const WorkerOptions& options_;
  const VisionTower& tower_;
  WorkerStats& stats_;
  Cache cache_;
  bool placed_in_l2_ = false;   // Put has put an entry straight into L2 (see L2Only)
  std::vector<bool> reserved_;  // by tenant id: its reservation is set
};

}  // namespace epd::internal
