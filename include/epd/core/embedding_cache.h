// epd/core/embedding_cache.h: a bytes-bounded cache of vision-tower outputs by content key.
//
// EmbeddingCache<K, V> maps a key to an opaque value and the bytes the caller
// charges for it, and evicts while the charged bytes exceed `capacity_bytes`:
// a bound in bytes, since embeddings differ in size by orders of magnitude.
//
// Behaviour (the engine reference's, which this project follows):
//   - Get(k) counts a hit or a miss; a hit makes k most recently used.
//   - Put(k, v, nbytes) inserts or replaces k, then evicts while over
//     capacity, never k itself, calling on_evict(key, value, nbytes) once per
//     victim, in eviction order; a replace is in place (no hook for k). An
//     item with nbytes > capacity_bytes is skipped: nothing is evicted and an
//     entry under k is left as it was. Capacity 0 holds zero-byte items only.
//   - Pop(k) removes k and hands back (value, nbytes, cost): no hit, no hook.
//   - A capacity or nbytes outside [0, kMaxCacheBytes] (epd/core/cache_options.h)
//     throws epd::Error(kInvalidArgument) naming the argument; nothing changes.
// Eviction (CacheOptions::eviction, defined in epd/core/cache_options.h):
// kLru (the default, the reference's), kGdsf or kAdaptive, held as a value
// beside the storage (epd/core/internal/cache_policy.h, entry_slab.h); reservations
// partition any of them. Pop() and the costed hook hand an entry's cost and
// frequency on to a tier below; a Put with them carries them in. hit_bytes()
// and hit_seconds() sum the charge and cost of each hit (the encode time saved).
//
// Ownership: the cache owns one copy of each value. Get() returns a copy (for
// EmbeddingPtr a shared_ptr, valid after eviction, replacement or pop); Pop()
// and on_evict move it out.
// Performance: under kLru Get, Put and Pop are O(1) expected (amortised);
// kGdsf and kAdaptive O(log n). Bookkeeping per entry beyond the key and
// value, under kLru: 64-112 bytes plus spare vector capacity (up to 2x);
// docs/BENCHMARKS.md measures both.
// Thread safety: thread-compatible; ConcurrentEmbeddingCache
// (epd/core/concurrent_cache.h) shares one across threads. If the hook throws,
// the exception propagates and the cache is as after the victim's removal.
// Re-entry: user code run inside a call (the hook, Eq, destructors of keys
// and values) may call back into the same cache, as the Python bindings'
// callbacks can: the hook runs between two victims; a dropped key or value is
// destroyed once the call's bookkeeping is done; a lookup whose Eq changed the
// cache starts its probe again. A Hash that throws during eviction leaves the
// victim in place, first in line.
//
// Example:
//   epd::EmbeddingCache<epd::ContentKey, epd::EmbeddingPtr> cache(64 << 20);
//   cache.Put(key, emb, static_cast<int64_t>(emb->nbytes()));
//   if (auto hit = cache.Get(key)) Ship(*hit);  // *hit stays valid after eviction
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>

#include "epd/core/admission_filter.h"
#include "epd/core/cache_options.h"
#include "epd/core/internal/any_policy.h"
#include "epd/core/internal/entry_slab.h"
#include "epd/core/policy_duel.h"
#include "epd/core/status.h"

namespace epd {

template <typename K, typename V, typename Hash = std::hash<K>, typename Eq = std::equal_to<K>>
class EmbeddingCache {
 public:
  // Called once per capacity-overflow victim, in eviction order, after the
  // victim has been removed. The value is moved to the hook.
  using EvictHook = std::function<void(const K& key, V&& value, std::int64_t nbytes)>;
  // The same, with the victim's cost and frequency (for a tier below).
  using CostedEvictHook = std::function<void(const K& key, V&& value, std::int64_t nbytes, const EntryCost& cost)>;

  // Throws epd::Error(kInvalidArgument) unless 0 <= capacity_bytes <= kMaxCacheBytes.
  explicit EmbeddingCache(std::int64_t capacity_bytes, EvictHook on_evict = nullptr, Hash hash = Hash(), Eq eq = Eq())
      : EmbeddingCache(capacity_bytes, CacheOptions{}, nullptr, std::move(hash), std::move(eq)) {
    on_evict_ = std::move(on_evict);
  }

  // With options (eviction policy, GDSF rates). Throws as above, and
  // epd::Error(kInvalidArgument) for a negative or non-finite rate.
  EmbeddingCache(std::int64_t capacity_bytes, const CacheOptions& options, CostedEvictHook on_evict = nullptr,
                 Hash hash = Hash(), Eq eq = Eq())
      : capacity_bytes_(capacity_bytes),
        options_(options),
        on_evict_costed_(std::move(on_evict)),
        slab_(std::move(hash), std::move(eq)) {
    CheckCacheBytes("capacity_bytes", capacity_bytes);
    CheckCacheOptions(options);
    policy_ = internal::MakePolicy(options, capacity_bytes);
  }

  EmbeddingCache(const EmbeddingCache&) = delete;
  EmbeddingCache& operator=(const EmbeddingCache&) = delete;
  EmbeddingCache(EmbeddingCache&&) noexcept = default;
  EmbeddingCache& operator=(EmbeddingCache&&) noexcept = default;

  // Returns a copy of the value and marks it touched (GDSF: one more
  // reference), or nullopt (a miss).
  [[gnu::always_inline]] std::optional<V> Get(const K& key) {
    const std::size_t h = slab_.HashOf(key);
    const std::uint32_t e = slab_.Find(key, h);
    if (e == kNone) [[unlikely]] {
      Visit([&](auto& p) { p.Miss(h); });
      ++misses_;
      return std::nullopt;
    }
    Entry& ent = slab_[e];
    ent.seq = ++seq_;
    Visit([&](auto& p) { p.Hit(internal::EntryRef{e, h, ent.seq, ent.nbytes}, slab_.meta(e), SeqOf()); });
    ++hits_;
    hit_bytes_ = AddBytesSaturating(hit_bytes_, ent.nbytes);
    hit_seconds_ += slab_.meta(e).seconds;
    return ent.value;
  }

  // Inserts or replaces `key` with `nbytes` and `cost` (a replace keeps the old
  // frequency plus one), then evicts as above. Throws as above and for an
  // invalid cost (CheckEntryCost). Returns false, changing nothing, when
  // skipped or refused by a reservation (refusals()); true when `key` is held.
  bool Put(const K& key, V value, std::int64_t nbytes, const EntryCost& cost = {}) {
    CheckCacheBytes("nbytes", nbytes);
    CheckEntryCost(cost);
    if (nbytes > capacity_bytes_) return false;
    if (!Visit([&](auto& p) { return p.Admits(cost, nbytes); })) {
      ++refusals_;
      return false;
    }
    const double seconds = cost.seconds == EntryCost::kUnmeasured
                               ? static_cast<double>(nbytes) * options_.default_seconds_per_byte
                               : cost.seconds;
    // A throwing hook can leave the cache over capacity. Past kMaxCacheBytes,
    // finish that eviction before charging more, so the counter cannot wrap.
    if (cur_bytes_ > kMaxCacheBytes) Evict(kNone);
    // The replaced value, destroyed when put returns: its destructor may
    // re-enter the cache, which must not happen while `ent` is in use.
    std::optional<V> replaced;
    const std::size_t h = slab_.HashOf(key);
    std::uint32_t e = slab_.Find(key, h);
    if (e != kNone) {
      Entry& ent = slab_[e];
      const std::int64_t old_nbytes = ent.nbytes;
      cur_bytes_ += nbytes - old_nbytes;
      replaced.emplace(std::exchange(ent.value, std::move(value)));
      ent.nbytes = nbytes;
      ent.seq = ++seq_;
      slab_.meta(e).seconds = seconds;
      Visit([&](auto& p) { p.Replace(Ref(e, h), old_nbytes, slab_.meta(e), cost, SeqOf()); });
    } else {
      e = slab_.Add(key, std::move(value), nbytes, ++seq_, h, size_ + 1);
      ++size_;
      cur_bytes_ += nbytes;
      slab_.meta(e) = internal::EntryMeta{seconds, 0};
      Visit([&](auto& p) { p.Insert(Ref(e, h), slab_.meta(e), cost, SeqOf()); });
    }
    // Cao and Irani's order: the newcomer is ranked again if its victims moved the ranking.
    const std::uint64_t epoch = internal::RankEpoch(policy_), seq = slab_[e].seq;
    Evict(e);
    if (internal::RankEpoch(policy_) != epoch && slab_[e].seq == seq)
      Visit([&](auto& p) { p.Rerank(Ref(e, h), slab_.meta(e)); });
    return true;
  }

  // Removes `key` and returns its value and charge; nullopt when absent.
  std::optional<PoppedEntry<V>> Pop(const K& key) { return Take(key, false); }
  // Pop for a tier above that takes the entry up because it was requested (a
  // promotion): the same, and under kAdaptive the request also goes to the
  // duel, as a Get's would. No hit or miss is counted here either.
  std::optional<PoppedEntry<V>> PopRequested(const K& key) { return Take(key, true); }

  // The cost and frequency, or the charge, of `key` as stored, or nullopt; touch nothing.
  std::optional<EntryCost> CostOf(const K& key) const {
    const std::uint32_t e = slab_.Find(key, slab_.HashOf(key));
    return e == kNone ? std::nullopt : std::optional<EntryCost>(CostOf(e));
  }
  std::optional<std::int64_t> BytesOf(const K& key) const {
    const std::uint32_t e = slab_.Find(key, slab_.HashOf(key));
    return e == kNone ? std::nullopt : std::optional<std::int64_t>(slab_[e].nbytes);
  }

  // Reserves bytes for good (epd/core/internal/tenant_partition.h; throws as the ledger does).
  void SetTenantReservation(TenantId t, std::int64_t b) {
    internal::Reserve(policy_, t, b, capacity_bytes_, slab_.slots(), cur_bytes_);
  }
  const TenantLedger* tenants() const { return internal::LedgerOf(policy_); }  // null without reservations
  std::uint64_t refusals() const { return refusals_; }                         // puts refused by a reservation

  bool Contains(const K& key) const { return slab_.Find(key, slab_.HashOf(key)) != kNone; }
  std::size_t size() const { return size_; }
  std::int64_t current_bytes() const { return cur_bytes_; }
  std::int64_t capacity_bytes() const { return capacity_bytes_; }
  std::uint64_t hits() const { return hits_; }
  std::uint64_t misses() const { return misses_; }
  std::uint64_t evictions() const { return evictions_; }      // capacity-overflow victims
  std::uint64_t lru_victims() const { return lru_victims_; }  // of the evictions, LRU's victims
  std::int64_t hit_bytes() const { return hit_bytes_; }
  double hit_seconds() const { return hit_seconds_; }
  EvictionPolicy eviction() const { return options_.eviction; }
  const CacheOptions& options() const { return options_; }
  // GDSF's clock (seconds per byte; 0 under LRU), its reference history
  // (kHistory; null under LRU, kResident or before the first eviction), and
  // kAdaptive's duel (from the first eviction on; null otherwise).
  double clock() const { return internal::ClockOf(policy_); }
  const AdmissionFilter* history() const { return internal::HistoryOf(policy_); }
  const PolicyDuel* duel() const { return internal::DuelOf(policy_); }

  // Bytes of bookkeeping held now (index, entry records, the policy's orders,
  // history and duel), not counting keys and values.
  std::size_t bookkeeping_bytes() const { return slab_.memory_bytes() + internal::MemoryOf(policy_); }

  // Visits entries as (key, value, nbytes), next victim first: LRU to MRU
  // (O(n)), lowest GDSF priority first (O(n log n)), the leader's order, or
  // every reserved order merged. For tests and debugging; counts no hits.
  template <typename F>
  void ForEachInEvictionOrder(F&& f) const {
    internal::VisitPolicy(policy_, [&](const auto& p) {
      p.ForEach(SeqOf(), [&](std::uint32_t e) { f(slab_[e].key, slab_[e].value, slab_[e].nbytes); });
    });
  }
  // The LRU name of the same walk.
  template <typename F>
  void ForEachLruToMru(F&& f) const {
    ForEachInEvictionOrder(std::forward<F>(f));
  }

 private:
  using Slab = internal::EntrySlab<K, V, Hash, Eq>;
  using Entry = typename Slab::Entry;
  static constexpr std::uint32_t kNone = Slab::kNone;

  template <typename F>
  [[gnu::always_inline]] decltype(auto) Visit(F&& f) {
    return internal::VisitPolicy(policy_, std::forward<F>(f));
  }
  auto SeqOf() const { return slab_.SeqOf(); }
  internal::EntryRef Ref(std::uint32_t e, std::size_t h) const {
    return internal::EntryRef{e, h, slab_[e].seq, slab_[e].nbytes};
  }
  EntryCost CostOf(std::uint32_t e) const { return internal::CostOf(policy_, e, slab_.meta(e)); }

  std::optional<PoppedEntry<V>> Take(const K& key, bool requested) {
    const std::size_t h = slab_.HashOf(key);
    const std::uint32_t e = slab_.Find(key, h);
    if (e == kNone) {
      if (requested) Visit([&](auto& p) { p.Miss(h); });
      return std::nullopt;
    }
    if (requested) Visit([&](auto& p) { p.Requested(Ref(e, h), slab_.meta(e)); });
    PoppedEntry<V> out{std::move(slab_[e].value), slab_[e].nbytes, CostOf(e)};
    Visit([&](auto& p) { p.Remove(Ref(e, h)); });
    Free(e, h);
    return out;
  }

  // Frees slot e, of hash h, after the policy forgot it; the key, and the
  // value if still held, are destroyed last, once the cache is consistent.
  void Free(std::uint32_t e, std::size_t h) {
    Entry dead = slab_.Release(e, h);
    cur_bytes_ -= dead.nbytes;
    --size_;
  }

  // Evicts while over capacity, never `keep` (kNone: no entry is exempt).
  void Evict(std::uint32_t keep) {
    while (cur_bytes_ > capacity_bytes_ && size_ > 0) {
      const std::uint32_t e = Visit([&](auto& p) { return p.Victim(keep, SeqOf()); });
      if (e == kNone) break;
      Visit([&](auto& p) { p.Prepare(size_); });
      // Hashed before anything changes: a Hash that throws leaves the victim
      // in place and still first in line, not half-removed.
      const std::size_t h = slab_.HashOf(slab_[e].key);
      const EntryCost cost = CostOf(e);
      if (Visit([&](auto& p) { return p.Evict(Ref(e, h)); })) ++lru_victims_;
      K key = std::move(slab_[e].key);
      V value = std::move(slab_[e].value);
      const std::int64_t nbytes = slab_[e].nbytes;
      Free(e, h);
      ++evictions_;
      if (on_evict_costed_) on_evict_costed_(key, std::move(value), nbytes, cost);
      if (on_evict_) on_evict_(key, std::move(value), nbytes);
    }
    Visit([&](auto& p) { p.Trim(SeqOf()); });
  }

  std::int64_t capacity_bytes_;
  CacheOptions options_;
  internal::AnyPolicy policy_;  // LRU unless the options say otherwise
  EvictHook on_evict_;
  CostedEvictHook on_evict_costed_;
  Slab slab_;
  std::size_t size_ = 0;
  std::int64_t cur_bytes_ = 0;
  std::uint64_t seq_ = 0;
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
  std::uint64_t evictions_ = 0;
  std::uint64_t lru_victims_ = 0;
  std::uint64_t refusals_ = 0;
  std::int64_t hit_bytes_ = 0;
  double hit_seconds_ = 0;
};

}  // namespace epd
