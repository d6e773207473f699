// epd/core/tiered_cache.h: a two-tier embedding cache, L1 in device memory and L2
// in host memory, with exclusive tiers.
//
// TieredEmbeddingCache<K, V> has the same Get/Put surface as EmbeddingCache,
// so the encode worker uses either. A key lives in at most one tier:
//   - put(k) always lands in L1, after dropping any stale L2 copy of k.
//   - An L1 capacity victim is demoted: copied device->host by `to_host` and
//     put into L2. A victim larger than all of L2 is dropped without a copy.
//   - A get that misses L1 and hits L2 promotes: the entry leaves L2, is copied
//     host->device by `to_device`, and is put into L1 as MRU. That may demote
//     colder L1 entries, never the promoted key (it is MRU and fits).
//   - L2 is the bottom tier: its victims are dropped.
// Counters: l1_hits, l2_hits, misses, promotions, demotions; hits() is
// l1_hits + l2_hits. Contains() and size() span both tiers. The sub-caches'
// own counters (l1().hits() etc.) move as the reference's do.
//
// A value for which ValueTraits<V>::IsNone(v) holds (a null EmbeddingPtr, a
// Python None) is treated by Get() like an L1 miss, as in the reference.
//
// Copies: `to_host` and `to_device` are injected callables, V -> V, so the
// tiering logic is testable without a device (a fake records each copy) and
// the CUDA tier (src/gpu) supplies async copies. Where
// ValueTraits<V>::kNullCopyDrops holds (shared_ptr values), a `to_host` that
// returns null for a non-null victim drops it, exactly as when the victim is
// larger than L2 (no demotion is counted): the GPU tier does so when its
// pinned pool has no free block. For Python values it does not hold: a
// to_host returning None stores None, as the reference does. They run synchronously on the
// calling thread, inside Get()/Put(); they may throw, and the exception
// propagates with the state the reference would leave (for a failed promote:
// the entry has already left L2 and is lost; for a failed demote: the victim
// has already left L1 and is dropped).
//
// Complexity: as EmbeddingCache, plus one copy per promotion or demotion.
// Ownership: as EmbeddingCache; a promoted value is the one `to_device` made.
// Thread safety: thread-compatible; the server's single worker thread owns it.
//
// Example:
//   TieredEmbeddingCache<ContentKey, EmbeddingPtr> cache(l1_bytes, l2_bytes, to_host, to_device);
//   cache.Put(key, emb, emb->nbytes());
//   auto v = cache.Get(key);   // L1 hit, or an L2 hit promoted to L1
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "epd/core/embedding_cache.h"

namespace epd {

// Which values count as "no value" in the tiered get (see above).
template <typename V>
struct ValueTraits {
  static bool IsNone(const V&) { return false; }
  static constexpr bool kNullCopyDrops = false;
};
template <typename T>
struct ValueTraits<std::shared_ptr<T>> {
  static bool IsNone(const std::shared_ptr<T>& v) { return v == nullptr; }
  static constexpr bool kNullCopyDrops = true;
};

// Where a tiered get found its value.
enum class CacheTier : std::uint8_t { kMiss = 0, kL1 = 1, kL2 = 2 };

template <typename K, typename V, typename Hash = std::hash<K>, typename Eq = std::equal_to<K>,
          typename Traits = ValueTraits<V>>
class TieredEmbeddingCache {
 public:
  using Tier = EmbeddingCache<K, V, Hash, Eq>;
  using CopyFn = std::function<V(const V&)>;

  // Throws epd::Error(kInvalidArgument) when a capacity is negative.
  // An empty to_host/to_device is the identity (no device: both tiers on host).
  TieredEmbeddingCache(std::int64_t l1_capacity_bytes, std::int64_t l2_capacity_bytes, CopyFn to_host = nullptr,
                       CopyFn to_device = nullptr, Hash hash = Hash(), Eq eq = Eq())
      : l1_(
            l1_capacity_bytes,
            [this](const K& key, V&& value, std::int64_t nbytes) { Demote(key, std::move(value), nbytes); }, hash, eq),
        l2_(l2_capacity_bytes, nullptr, hash, eq),
        to_host_(std::move(to_host)),
        to_device_(std::move(to_device)) {}

  // The hook captures `this`, so the object must not move.
  TieredEmbeddingCache(const TieredEmbeddingCache&) = delete;
  TieredEmbeddingCache& operator=(const TieredEmbeddingCache&) = delete;

  std::optional<V> Get(const K& key, CacheTier* tier = nullptr) {
    if (tier != nullptr) *tier = CacheTier::kMiss;
    std::optional<V> value = l1_.Get(key);
    if (value.has_value() && !Traits::IsNone(*value)) {
      ++l1_hits_;
      if (tier != nullptr) *tier = CacheTier::kL1;
      return value;
    }
    std::optional<PoppedEntry<V>> promoted = l2_.Pop(key);
    if (!promoted.has_value()) {
      ++misses_;
      return std::nullopt;
    }
    V device_value = to_device_ ? to_device_(promoted->value) : std::move(promoted->value);
    ++l2_hits_;
    ++promotions_;
    if (tier != nullptr) *tier = CacheTier::kL2;
    l1_.Put(key, device_value, promoted->nbytes);
    return device_value;
  }

  // Lands in L1 after dropping any stale L2 copy. Throws as EmbeddingCache::put.
  void Put(const K& key, V value, std::int64_t nbytes) {
    l2_.Pop(key);
    l1_.Put(key, std::move(value), nbytes);
  }

  bool Contains(const K& key) const { return l1_.Contains(key) || l2_.Contains(key); }
  std::size_t size() const { return l1_.size() + l2_.size(); }

  std::uint64_t hits() const { return l1_hits_ + l2_hits_; }
  std::uint64_t l1_hits() const { return l1_hits_; }
  std::uint64_t l2_hits() const { return l2_hits_; }
  std::uint64_t misses() const { return misses_; }
  std::uint64_t promotions() const { return promotions_; }
  std::uint64_t demotions() const { return demotions_; }

  const Tier& l1() const { return l1_; }
  const Tier& l2() const { return l2_; }
  Tier& l1() { return l1_; }
  Tier& l2() { return l2_; }

 private:
  void Demote(const K& key, V&& value, std::int64_t nbytes) {
    // Skip the device->host copy for a victim L2 would drop anyway.
    if (nbytes > l2_.capacity_bytes()) return;
    const bool was_none = Traits::IsNone(value);
    V host_value = to_host_ ? to_host_(value) : std::move(value);
    // A copy that yields no value (the pinned pool is full) drops the victim,
    // as an L2 too small would.
    if constexpr (Traits::kNullCopyDrops) {
      if (Traits::IsNone(host_value) && !was_none) return;
    }
    l2_.Put(key, std::move(host_value), nbytes);
    if (l2_.Contains(key)) ++demotions_;
  }

  Tier l1_;
  Tier l2_;
  CopyFn to_host_;
  CopyFn to_device_;
  std::uint64_t l1_hits_ = 0;
  std::uint64_t l2_hits_ = 0;
  std::uint64_t misses_ = 0;
  std::uint64_t promotions_ = 0;
  std::uint64_t demotions_ = 0;
};

}  // namespace epd
