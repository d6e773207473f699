// epd/core/tiered_cache.h: a two-tier embedding cache, L1 in device memory and
// L2 in host memory, with exclusive tiers.
//
// TieredEmbeddingCache<K, V> has EmbeddingCache's Get/Put surface, so the
// worker uses either. A key lives in at most one tier: a put lands in L1 after
// dropping a stale L2 copy; an L1 victim is demoted (copied by `to_host` into
// L2; one larger than L2 is dropped uncopied); a get that misses L1 and hits
// L2 promotes (out of L2, copied by `to_device`, into L1, which may demote
// colder entries, never the promoted key); L2's victims are dropped. A value
// ValueTraits<V>::IsNone holds for reads as an L1 miss, as in the reference.
// Counters: l1_/l2_hits, misses, promotions, demotions, and weighted
// l1_/l2_hit_bytes, _hit_seconds and _write_bytes (saturating at INT64_MAX).
// Options (TieredOptions, defaults the reference's; each mode is described by
// the unit that owns it, and docs/CACHE.md shows how they combine):
//   eviction             both tiers' policy; an entry's cost and frequency
//                        travel with it (epd/core/cache_options.h)
//   l1_admission         the doorkeeper (epd/core/admission_filter.h)
//   keep_oversize_in_l2  an entry larger than L1 lives and is served in L2
//   SetTenantReservation per-tier reservations
//                        (epd/core/internal/tenant_partition.h)
// `to_host` and `to_device` (V -> V) run synchronously inside Get and Put and
// may throw, leaving the state the reference would (a failed promotion has
// lost the entry; a failed demotion the victim); a `to_host` that returns null
// for a shared_ptr value drops the victim (the pinned pool is full).
// Complexity: EmbeddingCache's plus a copy per promotion, demotion or in-place
// L2 hit. Ownership: as EmbeddingCache. Thread safety: thread-compatible.
// Example:
//   TieredEmbeddingCache<ContentKey, EmbeddingPtr> cache(l1_bytes, l2_bytes, to_host, to_device);
//   cache.Put(key, emb, emb->nbytes());
//   auto v = cache.Get(key);   // L1 hit, or an L2 hit promoted to L1
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "epd/core/admission_filter.h"
#include "epd/core/embedding_cache.h"

namespace epd {

// The admission filter in front of L1 (see above).
enum class L1Admission : std::uint8_t { kNone = 0, kDoorkeeper = 1 };

inline std::string_view L1AdmissionName(L1Admission a) { return a == L1Admission::kDoorkeeper ? "doorkeeper" : "none"; }

// "none" or "doorkeeper"; kInvalidArgument naming the text otherwise.
inline StatusOr<L1Admission> ParseL1Admission(std::string_view text) {
  if (text == "none") return L1Admission::kNone;
  if (text == "doorkeeper") return L1Admission::kDoorkeeper;
  return Status(StatusCode::kInvalidArgument,
                "l1 admission must be none or doorkeeper, got '" + std::string(text) + "'");
}

struct TieredOptions {
  EvictionPolicy eviction = EvictionPolicy::kLru;
  L1Admission l1_admission = L1Admission::kNone;
  AdmissionFilterOptions admission{};
  // GDSF: what a promotion costs per byte, L1's ranking cost of an entry L2
  // can hold. 4e-11 s/B: a host-to-device copy at 25 GB/s (PCIe 4.0 x16's
  // 32 GB/s less protocol overhead); a worker that measures its promotions
  // passes the measured rate.
  double promote_seconds_per_byte = 4e-11;
  // As CacheOptions::default_seconds_per_byte, for both tiers.
  double default_seconds_per_byte = 1e-9;
  // An entry of more bytes than L1's capacity_bytes but not L2's is put
  // straight into L2 (copied by to_host, after dropping any stale L1 copy),
  // and an L2 hit on such an entry (also one placed by a direct l2().Put, or
  // by the doorkeeper's first put) is served by a to_device copy and stays in
  // L2 (see the header), instead of a promotion that L1 skips, which loses
  // the entry. Off: the reference's behaviour, which skips such a put, but
  // for the hits when the doorkeeper is on (the reference has none). The
  // encode worker turns it on, so an image too large for L1 is cached.
  bool keep_oversize_in_l2 = false;
};

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
  using VictimHook = typename Tier::CostedEvictHook;

  // Throws epd::Error(kInvalidArgument) when a capacity is negative.
  // An empty to_host/to_device is the identity (no device: both tiers on host).
  TieredEmbeddingCache(std::int64_t l1_capacity_bytes, std::int64_t l2_capacity_bytes, CopyFn to_host = nullptr,
                       CopyFn to_device = nullptr, Hash hash = Hash(), Eq eq = Eq())
      : TieredEmbeddingCache(l1_capacity_bytes, l2_capacity_bytes, TieredOptions{}, std::move(to_host),
                             std::move(to_device), std::move(hash), std::move(eq)) {}

  // With options. Throws as above, and as AdmissionFilter's constructor.
  TieredEmbeddingCache(std::int64_t l1_capacity_bytes, std::int64_t l2_capacity_bytes, const TieredOptions& options,
                       CopyFn to_host = nullptr, CopyFn to_device = nullptr, Hash hash = Hash(), Eq eq = Eq())
      : l1_(
            l1_capacity_bytes, L1Options(options, l2_capacity_bytes),
            [this](const K& key, V&& value, std::int64_t nbytes, const EntryCost& cost) {
              Demote(key, std::move(value), nbytes, cost);
            },
            hash, eq),
        l2_(
            l2_capacity_bytes, CacheOptions{options.eviction, options.default_seconds_per_byte},
            [this](const K& key, V&& value, std::int64_t nbytes, const EntryCost& cost) {
              if (on_l2_victim_) on_l2_victim_(key, std::move(value), nbytes, cost);
            },
            hash, eq),
        options_(options),
        to_host_(std::move(to_host)),
        to_device_(std::move(to_device)),
        hash_(std::move(hash)) {
    if (options.l1_admission == L1Admission::kDoorkeeper) filter_.emplace(options.admission);
  }

  // The hook captures `this`, so the object must not move.
  TieredEmbeddingCache(const TieredEmbeddingCache&) = delete;
  TieredEmbeddingCache& operator=(const TieredEmbeddingCache&) = delete;

  std::optional<V> Get(const K& key, CacheTier* tier = nullptr) {
    if (tier != nullptr) *tier = CacheTier::kMiss;
    const std::uint32_t requests = filter_ ? filter_->Record(hash_(key)) : kAdmitted;
    const std::int64_t bytes0 = l1_.hit_bytes();
    const double seconds0 = l1_.hit_seconds();
    std::optional<V> value = l1_.Get(key);
    if (value.has_value() && !Traits::IsNone(*value)) {
      ++l1_hits_;
      l1_hit_bytes_ = AddBytesSaturating(l1_hit_bytes_, l1_.hit_bytes() - bytes0);
      l1_hit_seconds_ += l1_.hit_seconds() - seconds0;
      if (tier != nullptr) *tier = CacheTier::kL1;
      return value;
    }
    if (requests < kAdmitted || StaysInL2(key)) return ServeFromL2(key, tier);
    std::optional<PoppedEntry<V>> promoted = l2_.PopRequested(key);
    if (!promoted.has_value()) {
      ++misses_;
      return std::nullopt;
    }
    V device_value = to_device_ ? to_device_(promoted->value) : std::move(promoted->value);
    ++l2_hits_;
    ++promotions_;
    l2_hit_bytes_ = AddBytesSaturating(l2_hit_bytes_, promoted->nbytes);
    l2_hit_seconds_ += promoted->cost.seconds;
    if (tier != nullptr) *tier = CacheTier::kL2;
    EntryCost cost = promoted->cost;
    ++cost.frequency;
    l1_.Put(key, device_value, promoted->nbytes, cost);
    if (l1_.Contains(key)) l1_write_bytes_ = AddBytesSaturating(l1_write_bytes_, promoted->nbytes);
    return device_value;
  }

  // Lands in L1 after dropping any stale L2 copy (with the doorkeeper, a
  // first request lands in L2 instead: see above). Throws as
  // EmbeddingCache::Put.
  void Put(const K& key, V value, std::int64_t nbytes, const EntryCost& cost = {}) {
    l2_.Pop(key);
    const bool oversize = options_.keep_oversize_in_l2 && nbytes > l1_.capacity_bytes();
    if (oversize || (filter_ && filter_->Estimate(hash_(key)) < kAdmitted && !l1_.Contains(key))) {
      PutIntoL2(key, std::move(value), nbytes, cost, /*admission_refused=*/!oversize);
      return;
    }
    if (l1_.Put(key, std::move(value), nbytes, cost)) l1_write_bytes_ = AddBytesSaturating(l1_write_bytes_, nbytes);
  }

  // Reserves `l1_bytes` of L1 and `l2_bytes` of L2 for `tenant` (see the
  // header and EmbeddingCache::SetTenantReservation). Throws
  // epd::Error(kInvalidArgument) naming the tier when either tier's
  // reservations would sum past its capacity; nothing changes then.
  void SetTenantReservation(TenantId tenant, std::int64_t l1_bytes, std::int64_t l2_bytes) {
    const TenantLedger probe1(l1_.capacity_bytes());
    const TenantLedger probe2(l2_.capacity_bytes());
    const TenantLedger& a = l1_.tenants() ? *l1_.tenants() : probe1;
    const TenantLedger& b = l2_.tenants() ? *l2_.tenants() : probe2;
    if (Status s = a.CheckReservation(tenant, l1_bytes); !s.ok()) throw Error(Status(s.code(), "L1: " + s.message()));
    if (Status s = b.CheckReservation(tenant, l2_bytes); !s.ok()) throw Error(Status(s.code(), "L2: " + s.message()));
    l1_.SetTenantReservation(tenant, l1_bytes);
    l2_.SetTenantReservation(tenant, l2_bytes);
  }

  // Called for each L2 victim (the bottom tier's drops), with its cost;
  // a simulator chains a third tier on it. Empty by default.
  void set_l2_victim_hook(VictimHook hook) { on_l2_victim_ = std::move(hook); }

  bool Contains(const K& key) const { return l1_.Contains(key) || l2_.Contains(key); }
  std::size_t size() const { return l1_.size() + l2_.size(); }

  std::uint64_t hits() const { return l1_hits_ + l2_hits_; }
  std::uint64_t l1_hits() const { return l1_hits_; }
  std::uint64_t l2_hits() const { return l2_hits_; }
  std::uint64_t misses() const { return misses_; }
  std::uint64_t promotions() const { return promotions_; }
  std::uint64_t demotions() const { return demotions_; }
  std::int64_t l1_hit_bytes() const { return l1_hit_bytes_; }
  std::int64_t l2_hit_bytes() const { return l2_hit_bytes_; }
  double l1_hit_seconds() const { return l1_hit_seconds_; }
  double l2_hit_seconds() const { return l2_hit_seconds_; }
  // Encode seconds the cache saved: the cost of every hit, either tier.
  double seconds_saved() const { return l1_hit_seconds_ + l2_hit_seconds_; }
  std::int64_t l1_write_bytes() const { return l1_write_bytes_; }
  std::int64_t l2_write_bytes() const { return l2_write_bytes_; }
  // Puts the doorkeeper sent to L2 instead of L1.
  std::uint64_t admission_rejections() const { return admission_rejections_; }
  const TieredOptions& options() const { return options_; }
  // The doorkeeper, or null without one.
  const AdmissionFilter* admission_filter() const { return filter_ ? &*filter_ : nullptr; }

  const Tier& l1() const { return l1_; }
  const Tier& l2() const { return l2_; }
  Tier& l1() { return l1_; }
  Tier& l2() { return l2_; }

 private:
  // Requests within a window that admit a key into L1.
  static constexpr std::uint32_t kAdmitted = 2;

  static CacheOptions L1Options(const TieredOptions& o, std::int64_t l2_capacity_bytes) {
    CacheOptions c{o.eviction, o.default_seconds_per_byte};
    if (o.eviction != EvictionPolicy::kLru) {
      c.refetch_seconds_per_byte = o.promote_seconds_per_byte;
      c.refetch_max_bytes = l2_capacity_bytes;
    }
    return c;
  }

  // Copies a device value to the host and puts it into L2; true when L2
  // holds it after. A victim L2 would drop anyway is not copied.
  bool CopyIntoL2(const K& key, V&& value, std::int64_t nbytes, const EntryCost& cost) {
    if (nbytes > l2_.capacity_bytes()) return false;
    const bool was_none = Traits::IsNone(value);
    V host_value = to_host_ ? to_host_(value) : std::move(value);
    // A copy that yields no value (the pinned pool is full) drops the victim,
    // as an L2 too small would.
    if constexpr (Traits::kNullCopyDrops) {
      if (Traits::IsNone(host_value) && !was_none) return false;
    }
    l2_.Put(key, std::move(host_value), nbytes, cost);
    if (!l2_.Contains(key)) return false;
    l2_write_bytes_ = AddBytesSaturating(l2_write_bytes_, nbytes);
    return true;
  }

  void Demote(const K& key, V&& value, std::int64_t nbytes, const EntryCost& cost) {
    if (CopyIntoL2(key, std::move(value), nbytes, cost)) ++demotions_;
  }

  // The doorkeeper's first-request put: validated first, then into L2 only.
  // Also the put of an entry larger than L1 under keep_oversize_in_l2 (not
  // an admission refusal), after dropping a stale L1 copy.
  void PutIntoL2(const K& key, V&& value, std::int64_t nbytes, const EntryCost& cost, bool admission_refused) {
    CheckCacheBytes("nbytes", nbytes);
    CheckEntryCost(cost);
    if (admission_refused) ++admission_rejections_;
    l1_.Pop(key);
    CopyIntoL2(key, std::move(value), nbytes, cost);
  }

  // Whether an L2 hit on `key` is served in place rather than promoted: the
  // entry is larger than all of L1 (under keep_oversize_in_l2, or with the
  // doorkeeper, whose first puts can place one), or its tenant's L1
  // reservation plus the shared pool cannot take it. Touches nothing; O(1)
  // expected (two lookups), none when neither rule applies.
  bool StaysInL2(const K& key) const {
    const bool oversize = options_.keep_oversize_in_l2 || filter_.has_value();
    if (!oversize && l1_.tenants() == nullptr) return false;
    const std::optional<std::int64_t> nbytes = l2_.BytesOf(key);
    if (!nbytes.has_value()) return false;
    if (oversize && *nbytes > l1_.capacity_bytes()) return true;
    return l1_.tenants() != nullptr && !l1_.tenants()->Admits(l2_.CostOf(key)->tenant, *nbytes);
  }

  // An L2 hit served in place (a key the doorkeeper has not admitted, or
  // StaysInL2): L2's own Get (MRU, one more reference, its hit counters and
  // its duel), then a device copy for the caller. A copy that throws leaves
  // the entry in L2, its reference counted and no tiered hit.
  std::optional<V> ServeFromL2(const K& key, CacheTier* tier) {
    const std::int64_t bytes0 = l2_.hit_bytes();
    const double seconds0 = l2_.hit_seconds();
    std::optional<V> held = l2_.Get(key);
    if (!held.has_value()) {
      ++misses_;
      return std::nullopt;
    }
    V device_value = to_device_ ? to_device_(*held) : std::move(*held);
    ++l2_hits_;
    l2_hit_bytes_ = AddBytesSaturating(l2_hit_bytes_, l2_.hit_bytes() - bytes0);
    l2_hit_seconds_ += l2_.hit_seconds() - seconds0;
    if (tier != nullptr) *tier = CacheTier::kL2;
    return device_value;
  }

  Tier l1_;
  Tier l2_;
  TieredOptions options_;
  CopyFn to_host_;
  CopyFn to_device_;
  Hash hash_;
  std::optional<AdmissionFilter> filter_;
  VictimHook on_l2_victim_;
  std::int64_t l1_hit_bytes_ = 0;
  std::int64_t l2_hit_bytes_ = 0;
  double l1_hit_seconds_ = 0;
  double l2_hit_seconds_ = 0;
  std::int64_t l1_write_bytes_ = 0;
  std::int64_t l2_write_bytes_ = 0;
  std::uint64_t admission_rejections_ = 0;
  std::uint64_t l1_hits_ = 0;
  std::uint64_t l2_hits_ = 0;
  std::uint64_t misses_ = 0;
  std::uint64_t promotions_ = 0;
  std::uint64_t demotions_ = 0;
};

}  // namespace epd
