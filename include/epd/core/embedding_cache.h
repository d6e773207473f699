// epd/core/embedding_cache.h: a bytes-bounded cache of vision-tower outputs by content key.
//
// EmbeddingCache<K, V> maps a key to an opaque value and the byte size the
// caller charges for it, and evicts while the charged bytes exceed
// `capacity_bytes`. Unlike a count-bounded LRU the bound is in bytes, because
// embeddings differ in size by orders of magnitude (a 28x28 thumbnail is 1
// token, a 1-megapixel photo is ~1300).
//
// Behaviour (the engine reference's, which this project follows):
//   - Get(k) counts a hit or a miss; a hit makes k most recently used.
//   - Put(k, v, nbytes) inserts or replaces k, then evicts while over
//     capacity, never k itself, calling on_evict(key, value, nbytes) once per
//     victim, in eviction order. A replace is in place: no hook for k.
//   - An item with nbytes > capacity_bytes is skipped: nothing is evicted and
//     an existing entry under k is left as it was.
//   - Pop(k) removes k and hands back (value, nbytes, cost); it is
//     structural: no hit or miss, no hook.
//   - capacity 0 is valid; only zero-byte items fit.
//   - A capacity or nbytes outside [0, kMaxCacheBytes] (2^62 - 1:
//     epd/core/cache_options.h says why) throws epd::Error(kInvalidArgument)
//     naming the argument; nothing changes.
//
// Eviction (CacheOptions::eviction, defined in epd/core/cache_options.h): kLru
// (the default, the reference's semantics), kGdsf or kAdaptive. The policy is
// a value beside the storage (epd/core/internal/cache_policy.h): the cache
// owns the slab, the index, the bytes, the hooks and the counters; the policy
// owns its order. Reservations (SetTenantReservation) partition any of them.
// Pop() and the costed hook hand an entry's cost and frequency on, so a tier
// below keeps them (epd/core/tiered_cache.h); a Put with them carries them in.
// hit_bytes() and hit_seconds() sum the charge and the cost (seconds) of each
// hit: the encode time the cache saved; hit_bytes() stops at INT64_MAX.
//
// Ownership: the cache owns one copy of each value. Get() returns a copy (for
// EmbeddingPtr a shared_ptr, valid after the entry's eviction, replacement
// or pop); Pop() and on_evict move it out.
//
// Performance: under kLru Get, Put and Pop are O(1) expected (amortised: the
// recency log); kGdsf and kAdaptive O(log n) (a heap); docs/BENCHMARKS.md.
// Bookkeeping per entry beyond sizeof(K) + sizeof(V), under kLru: entry
// record 16 bytes (nbytes, touch stamp), index 16-32, recency log 16-48,
// cost 16: 64-112 bytes, plus spare vector capacity (up to 2x).
//
// Thread safety: thread-compatible; share one across threads as
// ConcurrentEmbeddingCache (epd/core/concurrent_cache.h). The hook runs inside
// Put(); if it throws, the exception propagates and the cache is as after the
// victim's removal (the next put evicts the rest).
//
// Re-entry: user code run inside a call (the hook, Eq, destructors of keys
// and values) may call back into the same cache, as the Python bindings'
// callbacks can. The hook runs between two victims; a key or value the cache
// drops is destroyed once the call's bookkeeping is done; a lookup whose Eq
// changed the cache starts its probe again, as CPython's dict lookup does.
// Hash may throw: eviction hashes the victim before it changes anything, so
// the victim stays in place, first in line.
//
// Example:
//   epd::EmbeddingCache<epd::ContentKey, epd::EmbeddingPtr> cache(64 << 20);
//   cache.Put(key, emb, static_cast<int64_t>(emb->nbytes()));
//   if (auto hit = cache.Get(key)) Ship(*hit);  // *hit stays valid after eviction
//
// Design: a slab of entries (stable indices, a free list) found through
// epd/core/internal/slot_index.h. An entry of one cache line (ContentKey +
// EmbeddingPtr + charge + stamp) is aligned to one, so an LRU hit reads one
// slab line and appends one log record.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "epd/core/admission_filter.h"
#include "epd/core/cache_options.h"
#include "epd/core/internal/any_policy.h"
#include "epd/core/internal/slot_index.h"
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
      : capacity_bytes_(capacity_bytes), on_evict_(std::move(on_evict)), hash_(std::move(hash)), eq_(std::move(eq)) {
    CheckCacheBytes("capacity_bytes", capacity_bytes);
  }

  // With options (eviction policy, GDSF rates). Throws as above, and
  // epd::Error(kInvalidArgument) for a negative or non-finite rate.
  EmbeddingCache(std::int64_t capacity_bytes, const CacheOptions& options, CostedEvictHook on_evict = nullptr,
                 Hash hash = Hash(), Eq eq = Eq())
      : capacity_bytes_(capacity_bytes),
        options_(options),
        on_evict_costed_(std::move(on_evict)),
        hash_(std::move(hash)),
        eq_(std::move(eq)) {
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
  std::optional<V> Get(const K& key) {
    const std::size_t h = hash_(key);
    const std::uint32_t e = Find(key, h);
    if (e == kNone) [[unlikely]] {
      Visit([&](auto& p) { p.Miss(h); });
      ++misses_;
      return std::nullopt;
    }
    Entry& ent = slab_[e];
    ent.seq = ++seq_;
    Visit([&](auto& p) { p.Hit(internal::EntryRef{e, h, ent.seq, ent.nbytes}, meta_[e], SeqOf()); });
    ++hits_;
    hit_bytes_ = AddBytesSaturating(hit_bytes_, ent.nbytes);
    hit_seconds_ += meta_[e].seconds;
    return ent.value;
  }

  // Inserts or replaces `key`, charging `nbytes` and `cost`, then evicts
  // while over capacity, never `key` itself. A replace keeps the old
  // frequency plus one and takes the new cost. Throws
  // epd::Error(kInvalidArgument) unless 0 <= nbytes <= kMaxCacheBytes and the
  // cost is valid (CheckEntryCost). Skips (returns false) when nbytes >
  // capacity_bytes(), or when a reservation refuses it (counted in
  // refusals()); either leaves an existing entry under `key` as it was.
  // Returns true when `key` is held after the put.
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
    const std::size_t h = hash_(key);
    std::uint32_t e = Find(key, h);
    if (e != kNone) {
      Entry& ent = slab_[e];
      const std::int64_t old_nbytes = ent.nbytes;
      cur_bytes_ += nbytes - old_nbytes;
      replaced.emplace(std::exchange(ent.value, std::move(value)));
      ent.nbytes = nbytes;
      ent.seq = ++seq_;
      meta_[e].seconds = seconds;
      Visit([&](auto& p) { p.Replace(Ref(e, h), old_nbytes, meta_[e], cost, SeqOf()); });
    } else {
      e = Allocate(key, std::move(value), nbytes);
      index_.Insert(e, h);
      cur_bytes_ += nbytes;
      ++size_;
      meta_[e] = internal::EntryMeta{seconds, 0};
      Visit([&](auto& p) { p.Insert(Ref(e, h), meta_[e], cost, SeqOf()); });
      if (size_ * 2 > index_.slots()) index_.Rehash(index_.slots() * 2, EntryHash());
    }
    // Cao and Irani's order: the newcomer is ranked again if its victims moved the ranking.
    const std::uint64_t epoch = Visit([](const auto& p) { return p.rank_epoch(); });
    const std::uint64_t seq = slab_[e].seq;
    Evict(e);
    if (Visit([](const auto& p) { return p.rank_epoch(); }) != epoch && slab_[e].seq == seq) {
      Visit([&](auto& p) { p.Rerank(Ref(e, h), meta_[e]); });
    }
    return true;
  }

  // Removes `key` and returns its value and charge; nullopt when absent.
  std::optional<PoppedEntry<V>> Pop(const K& key) { return Take(key, false); }

  // Pop for a tier above that takes the entry up because it was requested (a
  // promotion): the same, and under kAdaptive the request also goes to the
  // duel, as a Get's would. No hit or miss is counted here either.
  std::optional<PoppedEntry<V>> PopRequested(const K& key) { return Take(key, true); }

  // The cost and frequency, or the charge (bytes), of `key` as stored, or
  // nullopt; touch nothing. O(1) expected.
  std::optional<EntryCost> CostOf(const K& key) const {
    const std::uint32_t e = Find(key, hash_(key));
    return e == kNone ? std::nullopt : std::optional<EntryCost>(CostOf(e));
  }
  std::optional<std::int64_t> BytesOf(const K& key) const {
    const std::uint32_t e = Find(key, hash_(key));
    return e == kNone ? std::nullopt : std::optional<std::int64_t>(slab_[e].nbytes);
  }

  // Reserves bytes of this cache, for good (epd/core/internal/tenant_partition.h; throws as TenantLedger does).
  void SetTenantReservation(TenantId t, std::int64_t b) {
    internal::Reserve(policy_, t, b, capacity_bytes_, slab_.size(), cur_bytes_);
  }
  const TenantLedger* tenants() const { return internal::LedgerOf(policy_); }  // null without reservations
  // Puts refused by a reservation (see Put).
  std::uint64_t refusals() const { return refusals_; }

  bool Contains(const K& key) const { return Find(key, hash_(key)) != kNone; }
  std::size_t size() const { return size_; }
  std::int64_t current_bytes() const { return cur_bytes_; }
  std::int64_t capacity_bytes() const { return capacity_bytes_; }
  std::uint64_t hits() const { return hits_; }
  std::uint64_t misses() const { return misses_; }
  // Capacity-overflow victims removed so far (each one the hook saw, if set).
  std::uint64_t evictions() const { return evictions_; }
  // Evictions whose victim was LRU's (all under kLru, none under kGdsf).
  std::uint64_t lru_victims() const { return lru_victims_; }
  // Sums over hits of the entry's charge (bytes) and cost (seconds saved).
  std::int64_t hit_bytes() const { return hit_bytes_; }
  double hit_seconds() const { return hit_seconds_; }
  EvictionPolicy eviction() const { return options_.eviction; }
  const CacheOptions& options() const { return options_; }
  // GDSF's clock (seconds per byte); 0 under LRU.
  double clock() const {
    return Visit([](const auto& p) { return p.clock(); });
  }
  // GDSF's reference history (kHistory), or null: under LRU, kResident, or
  // before the first eviction.
  const AdmissionFilter* history() const {
    return Visit([](const auto& p) { return p.history(); });
  }
  // kAdaptive's duel, from the first eviction on; null before and otherwise.
  const PolicyDuel* duel() const {
    return Visit([](const auto& p) { return p.duel(); });
  }

  // Bytes of bookkeeping held now (index, entry records, the policy's orders,
  // history and duel), not counting keys and values.
  std::size_t bookkeeping_bytes() const {
    return index_.memory_bytes() + slab_.capacity() * (sizeof(Entry) - sizeof(K) - sizeof(V)) +
           free_.capacity() * sizeof(std::uint32_t) + meta_.capacity() * sizeof(internal::EntryMeta) +
           Visit([](const auto& p) { return p.memory_bytes(); });
  }

  // Visits entries in eviction order, next victim first, as (key, value,
  // nbytes): LRU to MRU under kLru (O(n)); lowest GDSF priority first under
  // kGdsf (O(n log n)); the leader's order under kAdaptive; with reservations
  // every order merged (which goes first then also depends on who is over
  // its reservation). For tests and debugging; counts no hits.
  template <typename F>
  void ForEachInEvictionOrder(F&& f) const {
    Visit([&](const auto& p) {
      p.ForEach(SeqOf(), [&](std::uint32_t e) { f(slab_[e].key, slab_[e].value, slab_[e].nbytes); });
    });
  }
  // The LRU name of the same walk.
  template <typename F>
  void ForEachLruToMru(F&& f) const {
    ForEachInEvictionOrder(std::forward<F>(f));
  }

 private:
  static constexpr std::uint32_t kNone = internal::SlotIndex::kNone;

  struct EntryFields {
    K key;
    V value;
    std::int64_t nbytes = 0;
    std::uint64_t seq = 0;  // stamp of the latest touch; 0 = free slot
  };
  static constexpr std::size_t kCacheLine = 64;
  struct alignas(sizeof(EntryFields) == kCacheLine ? kCacheLine : alignof(EntryFields)) Entry : EntryFields {};

  template <typename F>
  [[gnu::always_inline]] decltype(auto) Visit(F&& f) {
    return internal::VisitPolicy(policy_, std::forward<F>(f));
  }
  template <typename F>
  [[gnu::always_inline]] decltype(auto) Visit(F&& f) const {
    return internal::VisitPolicy(policy_, std::forward<F>(f));
  }
  // The touch stamps the policies read (cache_policy.h).
  auto SeqOf() const {
    return [this](std::uint32_t e) { return slab_[e].seq; };
  }
  internal::EntryRef Ref(std::uint32_t e, std::size_t h) const {
    return internal::EntryRef{e, h, slab_[e].seq, slab_[e].nbytes};
  }
  EntryCost CostOf(std::uint32_t e) const {
    EntryCost c{meta_[e].seconds, meta_[e].frequency};
    Visit([&](const auto& p) { p.FillCost(e, c); });
    return c;
  }

  std::optional<PoppedEntry<V>> Take(const K& key, bool requested) {
    const std::size_t h = hash_(key);
    const std::uint32_t e = Find(key, h);
    if (e == kNone) {
      if (requested) Visit([&](auto& p) { p.Miss(h); });
      return std::nullopt;
    }
    if (requested) Visit([&](auto& p) { p.Requested(Ref(e, h), meta_[e]); });
    PoppedEntry<V> out{std::move(slab_[e].value), slab_[e].nbytes, CostOf(e)};
    Visit([&](auto& p) { p.Remove(Ref(e, h)); });
    Free(e, h);
    return out;
  }

  // The entry holding `key` (whose hash is h), or kNone. An Eq that changes
  // the cache (by re-entering it) restarts the probe on the changed index.
  [[gnu::always_inline]] std::uint32_t Find(const K& key, std::size_t h) const {
    return index_.Find(h, [&](std::uint32_t e) -> std::optional<bool> {
      const std::uint64_t version = version_;
      const bool equal = eq_(slab_[e].key, key);
      if (version_ != version) return std::nullopt;
      return equal;
    });
  }

  // An entry's full hash, which the index asks for only past 2^32 slots.
  auto EntryHash() const {
    return [this](std::uint32_t e) { return hash_(slab_[e].key); };
  }

  // A new entry, stamped as touched now.
  std::uint32_t Allocate(const K& key, V&& value, std::int64_t nbytes) {
    ++version_;
    if (!free_.empty()) {
      const std::uint32_t e = free_.back();
      free_.pop_back();
      slab_[e] = Entry{{key, std::move(value), nbytes, ++seq_}};
      return e;
    }
    slab_.push_back(Entry{{key, std::move(value), nbytes, ++seq_}});
    meta_.emplace_back();
    return static_cast<std::uint32_t>(slab_.size() - 1);
  }

  // Frees slab slot e, whose key hashes to h, after the policy forgot it
  // (the value already moved out where needed). The key, and the value if
  // still held, are destroyed last, once the cache is consistent again.
  void Free(std::uint32_t e, std::size_t h) {
    ++version_;
    index_.Erase(e, h, EntryHash());
    Entry dead = std::move(slab_[e]);
    slab_[e] = Entry{};
    meta_[e] = internal::EntryMeta{};
    cur_bytes_ -= dead.nbytes;
    free_.push_back(e);
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
      const std::size_t h = hash_(slab_[e].key);
      const EntryCost cost = CostOf(e);
      if (Visit([&](auto& p) { return p.Evict(Ref(e, h)); })) ++lru_victims_;
      K key = std::move(slab_[e].key);
      V value = std::move(slab_[e].value);
      const std::int64_t nbytes = slab_[e].nbytes;
      Free(e, h);
      ++evictions_;
      if (on_evict_costed_) {
        on_evict_costed_(key, std::move(value), nbytes, cost);
      } else if (on_evict_) {
        on_evict_(key, std::move(value), nbytes);
      }
    }
    Visit([&](auto& p) { p.Trim(SeqOf()); });
  }

  std::int64_t capacity_bytes_;
  CacheOptions options_;
  internal::AnyPolicy policy_;  // LRU unless the options say otherwise
  EvictHook on_evict_;
  CostedEvictHook on_evict_costed_;
  Hash hash_;
  Eq eq_;
  internal::SlotIndex index_;
  std::vector<Entry> slab_;
  std::vector<std::uint32_t> free_;
  std::vector<internal::EntryMeta> meta_;  // parallel to slab_
  std::size_t size_ = 0;
  std::int64_t cur_bytes_ = 0;
  std::uint64_t seq_ = 0;
  std::uint64_t version_ = 0;  // bumped when an entry is added or removed (see Find)
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
  std::uint64_t evictions_ = 0;
  std::uint64_t lru_victims_ = 0;
  std::uint64_t refusals_ = 0;
  std::int64_t hit_bytes_ = 0;
  double hit_seconds_ = 0;
};

}  // namespace epd
