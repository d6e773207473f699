// src/worker/worker_cache.h (internal to epd::worker): the worker's L1/L2
// cache: placement, the device-hook fences, L3 adoption and the one hit check.
//
// What it adds to TieredEmbeddingCache (epd/core/tiered_cache.h):
//   - The hit check (Fits): an embedding is served only when its shape is
//     what the tower gives for the tokens the item expects (rows, hidden
//     size, deepstack layers, dtype) and its bytes match that shape. Images,
//     whole videos, temporal chunks and L3 values all go through it.
//   - The L2-only rule (the tiered cache's keep_oversize_in_l2, which the
//     worker turns on): an entry too big for L1 but not for L2 is put into L2
//     directly (after the device-to-host copy a demotion makes) and served
//     from there without promotion (a host-to-device copy per hit, the entry
//     stays L2's most recently used, one more reference under GDSF). The
//     tiered cache without it, like the reference, would skip it at put and
//     lose it at promotion, so such an image ran the tower on every repeat.
//   - Fences: a to_host or to_device hook that throws (a device failure) is
//     caught and counted (WorkerStats::cache_errors): a failed promotion is
//     served as a miss, a failed demotion drops the victim (the eviction goes
//     on, so L1 stays within its capacity: unwinding out of the cache would
//     abandon it half-way), a failed L2-only placement drops the entry.
//   - The adoption check (adopt_check.h): a value from outside the process
//     that does not match what the request predicts is refused, counted in
//     adopt_rejections and kept for TakeRefused, so the shared tier's owner
//     (WorkerLoop) deletes it there; the item is then encoded.
//   - Costs (issue 26): every entry is put with its measured EntryCost
//     (docs/PLAN.md, "What the worker passes"), the tiers are built with
//     WorkerOptions' eviction, l1_admission and promote_seconds_per_byte,
//     and each hit adds its bytes and its cost to the per-tier weights.
//
// Counts in the WorkerStats it is given: shape_mismatches, cache_errors,
// adopt_rejections, hits_l1 / hits_l2 with hit_bytes_* / hit_seconds_*
// (Lookup: images, chunks and videos), hits_l3 and its weights (Adopt),
// encode_seconds_saved (the hit seconds of all three).
//
// Complexity: each call O(1) map work plus the hooks' copies.
// Thread safety: thread-compatible (the worker's owning thread). Contains may
// run concurrently with nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "adopt_check.h"
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
  // A value the shared tier (L3) supplied, with the cost measured where it
  // was encoded: checked with CheckAdoptedValue against `want` (a refusal
  // counted in adopt_rejections, and in shape_mismatches when the shape
  // differs, and kept for TakeRefused), moved to the device when to_device
  // is set (a throw counted in cache_errors), cached with `cost` (charged to
  // cost.tenant, see Put) and counted in hits_l3. nullopt when it cannot be
  // served; the item is then encoded. A cost that is neither finite and >= 0
  // nor kUnmeasured counts as kUnmeasured.
  std::optional<EmbeddingPtr> Adopt(const ContentKey& key, EmbeddingPtr ready, const AdoptExpectation& want,
                                    EntryCost cost);
  // Caches `e` with its measured cost (L1, or L2 under the L2-only rule),
  // charged to cost.tenant (an id from TenantOf; ignored without quotas).
  // Never throws from a hook. A put a tenant's reservation plus the shared
  // pool cannot hold is refused (counted per tier in Report's tenant rows).
  void Put(const ContentKey& key, const EmbeddingPtr& e, const EntryCost& cost);
  // Put, then counts `e` as the weight of a miss (miss_bytes, and
  // miss_seconds by cost.seconds): a tower result.
  void PutEncoded(const ContentKey& key, const EmbeddingPtr& e, const EntryCost& cost);
  // The cost of an entry that took `seconds` (or EntryCost::kUnmeasured),
  // charged to tenant `name` (TenantOf).
  EntryCost CostFor(double seconds, std::string_view name) {
    EntryCost c{seconds};
    c.tenant = TenantOf(name);
    return c;
  }
  // The id entries of tenant `name` are charged to: interned in
  // WorkerOptions::tenant_quotas, whose reservation for it is set in both
  // tiers on first sight; kSharedTenant without quotas. O(1) expected.
  TenantId TenantOf(std::string_view name);
  // The cost the cache holds for `key` (either tier), without touching it.
  std::optional<EntryCost> CostOf(const ContentKey& key) const;

  // A value Adopt refused, and why (the check's message).
  struct Refused {
    ContentKey key;
    std::string why;
  };
  // The values refused since the last call, oldest first.
  std::vector<Refused> TakeRefused() { return std::exchange(refused_, {}); }
  // `host` copied to the device by to_device; `host` itself when the hook
  // is unset, returns null or throws (counted in cache_errors).
  EmbeddingPtr OnDevice(EmbeddingPtr host);

  bool Contains(const ContentKey& key) const { return cache_.Contains(key); }
  // Seconds the cache charges an entry put with `cost` (an unmeasured one:
  // nbytes x default_seconds_per_byte, as EmbeddingCache does).
  double Seconds(const EntryCost& cost, std::int64_t nbytes) const;
  // Fills the cache fields of `s` (evictions, tier moves, occupancy).
  void Report(WorkerStats& s) const;

 private:
  using Cache = TieredEmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash>;

  Cache::CopyFn FencedToHost();
  // to_host behind its fence: null when it threw.
  EmbeddingPtr HostCopy(const EmbeddingPtr& e);
  // Sets tenant t's reservation in both tiers once.
  void Reserve(TenantId t);
  // A get behind the promotion fence.
  std::optional<EmbeddingPtr> Get(const ContentKey& key, CacheTier* tier);
  // Adds a served hit's bytes and cost to the weights of `source`'s tier.
  void CountHit(ItemSource source, std::int64_t nbytes, double seconds);

  const WorkerOptions& options_;
  const VisionTower& tower_;
  WorkerStats& stats_;
  Cache cache_;
  std::vector<bool> reserved_;  // by tenant id: its reservation is set
  std::vector<Refused> refused_;
};

}  // namespace epd::internal
