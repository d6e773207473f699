// epd/core/embedding_cache.h: a bytes-bounded cache of vision-tower outputs by content key.
//
// EmbeddingCache<K, V> maps a key to an opaque value and the byte size the
// caller charges for it. It evicts least-recently-used entries while the
// charged bytes exceed `capacity_bytes`. Unlike a count-bounded LRU, the bound
// is in bytes, because embeddings differ in size by orders of magnitude (a
// 28x28 thumbnail is 1 token, a 1-megapixel photo is ~1300).
//
// Behaviour (the same as the engine reference this project follows):
//   - get(k) counts a hit or a miss; a hit makes k most recently used (MRU).
//   - put(k, v, nbytes) inserts or replaces k as MRU, then evicts LRU entries
//     while over capacity, calling on_evict(key, value, nbytes) for each,
//     oldest first. A replace is in place: it never fires the hook for k.
//   - An item with nbytes > capacity_bytes is skipped: nothing is evicted and
//     an existing entry under k is left as it was.
//   - pop(k) removes k and hands back (value, nbytes); it is structural: no
//     hit/miss is counted and the hook does not fire.
//   - capacity 0 is valid; only zero-byte items fit.
//   - A capacity or nbytes outside [0, kMaxCacheBytes] (2^62 - 1 bytes:
//     epd/core/cache_options.h says why) throws epd::Error(kInvalidArgument)
//     naming the argument; nothing is changed.
//
// Eviction policy (CacheOptions::eviction), chosen at construction; each is
// defined in epd/core/cache_options.h:
//   - kLru (the default): everything above; the reference's semantics.
//   - kGdsf: the lowest GreedyDual-Size-Frequency priority goes first (ties
//     to the oldest touch: a sequence number, never an address), and
//   - kAdaptive: LRU's, GDSF's or probation's victim, whichever online
//     miniature caches say saves most (epd/core/policy_duel.h).
//   The rest of the contract is LRU's under all three: the hook fires once
//   per victim, in eviction order; a put never evicts the key it puts, so an
//   entry no larger than the capacity is resident after its put; re-put,
//   oversize skip, pop, capacity 0 and errors are as above.
//   Pop() and the costed hook hand the entry's cost and frequency on, so a
//   tier below can keep them (epd/core/tiered_cache.h); a Put with them
//   carries them in.
// Weighted counters: hit_bytes() and hit_seconds() sum the charge and the cost (EntryCost::seconds as
// stored) of each hit: the encode seconds the cache saved. hit_bytes() stops at INT64_MAX.
// A caller that wants weighted hit ratios sums the misses' weights itself.
//
// Ownership: the cache owns one copy of each value. Get() returns a copy (for
// EmbeddingPtr, a shared_ptr: the embedding outlives its entry's eviction,
// replacement or pop for the reader); Pop() and on_evict move it out.
//
// Performance: under kLru get, put and pop are O(1) expected (amortised:
// epd/core/eviction_order.h's recency log); under kGdsf O(log n), a heap of
// (priority, sequence) in place of the log (24 bytes per entry plus 4 per
// slab slot); kAdaptive keeps both, plus its duel's three miniature caches
// (epd/core/policy_duel.h: about 3 x R x the entries, R in [1/32, 1]), and a
// Get or Put of a sampled key costs up to three miniature operations more.
// GDSF's history adds about 6 bytes per windowed reference (180-360 per
// entry at the auto window) and one Record per Get and Put.
//
// Per-entry bookkeeping beyond sizeof(K) + sizeof(V), under kLru: the entry
// record 16 bytes (nbytes, last-touch sequence; plus padding to its
// alignment), index slots 16-32, recency log 16-48, cost record 16 (seconds,
// frequency): 64-112 bytes, plus spare vector capacity (up to 2x);
// `bench/cache_bench` measures it (docs/BENCHMARKS.md); kGdsf: the heap for the log; kAdaptive both.
//
// Thread safety: thread-compatible (no internal locking); share one across
// threads as ConcurrentEmbeddingCache (epd/core/concurrent_cache.h). The hook
// runs synchronously inside Put(); if it throws, the exception propagates and
// the cache is as after the victim's removal (the next put evicts the rest).
//
// Re-entry: user code that runs inside a call (the hook, Eq, and the
// destructors of keys and values) may call back into the same cache, as the
// Python bindings' callbacks can. The cache is consistent whenever such code
// runs: the hook runs between two victims; a key or value the cache drops is
// destroyed only after the call's bookkeeping is done (a replaced value at the
// end of put()); a lookup whose Eq changed the cache starts its probe again,
// as CPython's dict lookup does. Hash may throw: eviction hashes the victim
// before it changes anything, so put() propagates the exception and the
// victim stays in place, first in line, evictable once its Hash works.
//
// Example:
//   epd::EmbeddingCache<epd::ContentKey, epd::EmbeddingPtr> cache(64 << 20);
//   cache.Put(key, emb, static_cast<int64_t>(emb->nbytes()));
//   if (auto hit = cache.Get(key)) Ship(*hit);  // *hit stays valid after eviction
//
// Design: a slab of entries (stable indices, a free list) found through
// epd/core/slot_index.h; victims from epd/core/eviction_order.h, one order
// per tenant. An entry of one cache line (ContentKey + EmbeddingPtr) is
// aligned to one, so a hit reads one slab line.
#pragma once

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "epd/core/admission_filter.h"
#include "epd/core/cache_options.h"
#include "epd/core/eviction_order.h"
#include "epd/core/gdsf_heap.h"
#include "epd/core/policy_duel.h"
#include "epd/core/slot_index.h"
#include "epd/core/status.h"
#include "epd/core/tenant_quota.h"

namespace epd {

template <typename K, typename V, typename Hash = std::hash<K>, typename Eq = std::equal_to<K>>
class EmbeddingCache {
 public:
  // Called once per capacity-overflow victim, oldest first, after the victim
  // has been removed. The value is moved to the hook.
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
        ranked_(options.eviction != EvictionPolicy::kLru),
        logged_(options.eviction != EvictionPolicy::kGdsf),
        on_evict_costed_(std::move(on_evict)),
        hash_(std::move(hash)),
        eq_(std::move(eq)) {
    CheckCacheBytes("capacity_bytes", capacity_bytes);
    CheckCacheOptions(options);
  }

  EmbeddingCache(const EmbeddingCache&) = delete;
  EmbeddingCache& operator=(const EmbeddingCache&) = delete;
  EmbeddingCache(EmbeddingCache&&) noexcept = default;
  EmbeddingCache& operator=(EmbeddingCache&&) noexcept = default;

  // Returns a copy of the value and marks it MRU (GDSF: one more reference),
  // or nullopt (a miss).
  std::optional<V> Get(const K& key) {
    const std::size_t h = hash_(key);
    const std::uint32_t e = Find(key, h);
    Requested(h, e);
    if (e == kNone) {
      ++misses_;
      return std::nullopt;
    }
    if (ranked_) meta_[e].frequency = Referenced(h, meta_[e].frequency + 1);
    Touch(e);
    ++hits_;
    hit_bytes_ = AddBytesSaturating(hit_bytes_, slab_[e].nbytes);
    hit_seconds_ += meta_[e].seconds;
    return slab_[e].value;
  }

  // Inserts or replaces `key` as MRU, charging `nbytes` and `cost`, then
  // evicts entries (LRU, or GDSF's lowest priority) while over capacity,
  // never `key` itself. A replace keeps the old frequency plus one (GDSF)
  // and takes the new cost. Throws epd::Error(kInvalidArgument) unless
  // 0 <= nbytes <= kMaxCacheBytes and the cost is valid (CheckEntryCost).
  // Skips (returns false) when nbytes > capacity_bytes(). With tenant
  // reservations (SetTenantReservation), charges cost.tenant, evicts only
  // entries of tenants over their reservation, and refuses (returns false,
  // counted in refusals() and the ledger) a put the tenant's reservation
  // plus the shared pool cannot hold; a skipped or refused put leaves an
  // existing entry under `key` as it was. Returns true when `key` is held
  // after the put.
  bool Put(const K& key, V value, std::int64_t nbytes, const EntryCost& cost = {}) {
    CheckCacheBytes("nbytes", nbytes);
    CheckEntryCost(cost);
    if (nbytes > capacity_bytes_) return false;
    const TenantId tenant = ledger_ ? cost.tenant : kSharedTenant;
    if (ledger_ && !ledger_->Admits(tenant, nbytes)) {
      ledger_->CountRefusal(tenant);
      ++refusals_;
      return false;
    }
    const double seconds = cost.seconds == EntryCost::kUnmeasured
                               ? static_cast<double>(nbytes) * options_.default_seconds_per_byte
                               : cost.seconds;
    // A throwing hook can leave the cache over capacity. Past kMaxCacheBytes,
    // finish that eviction before charging more, so the counter cannot wrap.
    if (cur_bytes_ > kMaxCacheBytes) Evict();
    // The replaced value, destroyed when put returns: its destructor may
    // re-enter the cache, which must not happen while `ent` is in use.
    std::optional<V> replaced;
    const std::size_t h = hash_(key);
    std::uint32_t e = Find(key, h);
    if (e != kNone) {
      Entry& ent = slab_[e];
      cur_bytes_ += nbytes - ent.nbytes;
      if (ledger_) Recharge(e, tenant, nbytes);
      replaced.emplace(std::exchange(ent.value, std::move(value)));
      ent.nbytes = nbytes;
      meta_[e] = Meta{seconds, Referenced(h, std::max(meta_[e].frequency + 1, cost.frequency))};
      Touch(e);
    } else {
      e = Allocate(key, std::move(value), nbytes);
      index_.Insert(e, h);
      cur_bytes_ += nbytes;
      ++size_;
      if (ledger_) Charge(e, tenant, nbytes);
      ++orders_[tenant].size;
      meta_[e] = Meta{seconds, Referenced(h, cost.frequency)};
      Touch(e);
      if (size_ * 2 > index_.slots()) index_.Rehash(index_.slots() * 2, EntryHash());
    }
    if (duel_ && duel_->Sampled(h)) duel_->OnPut(h, nbytes, RankSeconds(e), cost.frequency);
    // Cao and Irani's order: the newcomer is ranked again if its victims moved the clock or started the history.
    const double clock_before = clock_;
    const bool had_history = history_ != nullptr;
    const std::uint64_t seq = slab_[e].seq;
    Evict(e);
    if (ranked_ && (clock_ != clock_before || had_history != (history_ != nullptr)) && slab_[e].seq == seq) Rank(e);
    return true;
  }

  // Removes `key` and returns its value and charge; nullopt when absent.
  std::optional<PoppedEntry<V>> Pop(const K& key) { return Take(key, false); }

  // Pop for a tier above that takes the entry up because it was requested (a
  // promotion): the same, and under kAdaptive the request also goes to the
  // duel, as a hit when `key` is held and a miss otherwise, as a Get would.
  // No hit or miss is counted here either.
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

  // Tenant reservations (epd/core/tenant_quota.h). The first call switches
  // per-tenant accounting on for good (entries already held are charged to
  // kSharedTenant); without one, tenants are ignored and the cache is the
  // reference's. Reserves `bytes` of this cache for `tenant`. Throws
  // epd::Error(kInvalidArgument) when the reservations would sum past the
  // capacity; nothing changes then. O(1) amortised. Victim selection then
  // scans the tenants the cache has seen: O(T) more per eviction.
  void SetTenantReservation(TenantId tenant, std::int64_t bytes) {
    if (!ledger_) {
      if (Status s = TenantLedger(capacity_bytes_).CheckReservation(tenant, bytes); !s.ok()) throw Error(std::move(s));
      ledger_ = std::make_unique<TenantLedger>(capacity_bytes_);
      tenant_.assign(slab_.size(), kSharedTenant);
      ledger_->Charge(kSharedTenant, cur_bytes_);
    }
    ledger_->SetReservation(tenant, bytes);
    if (orders_.size() <= tenant) orders_.resize(static_cast<std::size_t>(tenant) + 1);
  }
  // The per-tenant ledger, or null while no reservation was ever set.
  const TenantLedger* tenants() const { return ledger_.get(); }
  // Puts refused by a tenant reservation (see Put).
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
  double clock() const { return clock_; }
  // GDSF's reference history (GdsfFrequency::kHistory), or null: under LRU,
  // kResident, or before the cache first evicted.
  const AdmissionFilter* history() const { return history_.get(); }
  // kAdaptive's duel (which policy leads, its scores), from the first
  // eviction on; null before and under kLru and kGdsf.
  const PolicyDuel* duel() const { return duel_.get(); }

  // Bytes of bookkeeping held now (index, entry records, recency log, GDSF's
  // heap and history, kAdaptive's duel), not counting keys and values. For
  // the overhead figure in the header comment.
  std::size_t bookkeeping_bytes() const {
    return index_.memory_bytes() + slab_.capacity() * (sizeof(Entry) - sizeof(K) - sizeof(V)) +
           free_.capacity() * sizeof(std::uint32_t) + meta_.capacity() * sizeof(Meta) + OrderBytes() +
           tenant_.capacity() * sizeof(TenantId) + (history_ ? history_->memory_bytes() : 0) +
           (duel_ ? duel_->memory_bytes() : 0);
  }

  // Visits entries in eviction order, next victim first, as (key, value,
  // nbytes): LRU to MRU under kLru (O(n), linear in the recency log, which
  // holds at most 3n + 64 current records); lowest GDSF priority first under kGdsf
  // (O(n log n), a sorted copy of the heap); the leader's order under
  // kAdaptive. With tenant reservations the
  // walk merges every tenant's order (LRU: O(n log n), sorted by touch);
  // which entry goes first then also depends on which tenants are over their
  // reservation. For tests and debugging; does not count hits.
  template <typename F>
  void ForEachInEvictionOrder(F&& f) const {
    if (ByHeap()) {
      std::vector<GdsfHeap::Node> order;
      for (const EvictionOrder& o : orders_) order.insert(order.end(), o.heap.nodes().begin(), o.heap.nodes().end());
      std::sort(order.begin(), order.end(), GdsfHeap::Less);
      for (const GdsfHeap::Node& n : order) f(slab_[n.id].key, slab_[n.id].value, slab_[n.id].nbytes);
      return;
    }
    std::vector<Record> order;
    for (const EvictionOrder& o : orders_) o.ForEachCurrent(SeqOf(), [&](const Record& r) { order.push_back(r); });
    if (orders_.size() > 1) {
      std::sort(order.begin(), order.end(), [](const Record& a, const Record& b) { return a.seq < b.seq; });
    }
    for (const Record& r : order) f(slab_[r.entry].key, slab_[r.entry].value, slab_[r.entry].nbytes);
  }
  // The LRU name of the same walk: the eviction order, recency only under LRU's lead.
  template <typename F>
  void ForEachLruToMru(F&& f) const {
    ForEachInEvictionOrder(std::forward<F>(f));
  }

 private:
  static constexpr std::uint32_t kNone = SlotIndex::kNone;
  static constexpr std::uint64_t kMinHistoryWindow = 1024;
  static constexpr std::uint64_t kHistoryWindowPerEntry = 30;

  struct EntryFields {
    K key;
    V value;
    std::int64_t nbytes = 0;
    std::uint64_t seq = 0;  // sequence of the latest touch; 0 = free slot
  };
  static constexpr std::size_t kCacheLine = 64;
  struct alignas(sizeof(EntryFields) == kCacheLine ? kCacheLine : alignof(EntryFields)) Entry : EntryFields {};
  using Record = EvictionOrder::Record;
  // Kept apart from Entry so that an Entry of ContentKey + EmbeddingPtr stays
  // one cache line; indexed like slab_.
  struct Meta {
    double seconds = 0;
    std::uint64_t frequency = 0;
  };
  // The sequence of an entry's latest touch (0: a free slot), for the orders.
  auto SeqOf() const {
    return [this](std::uint32_t e) { return slab_[e].seq; };
  }

  std::optional<PoppedEntry<V>> Take(const K& key, bool requested) {
    const std::size_t h = hash_(key);
    const std::uint32_t e = Find(key, h);
    if (requested) Requested(h, e);
    if (e == kNone) return std::nullopt;
    PoppedEntry<V> out{std::move(slab_[e].value), slab_[e].nbytes, CostOf(e)};
    Remove(e, h);
    return out;
  }

  // Tells kAdaptive's duel of a request for hash h, held at e (kNone: a miss).
  void Requested(std::size_t h, std::uint32_t e) {
    if (!duel_ || !duel_->Sampled(h)) return;
    e == kNone ? duel_->OnGet(h, false, 0, 0) : duel_->OnGet(h, true, slab_[e].nbytes, RankSeconds(e));
  }

  // Whether the next victim is GDSF's (lowest priority) rather than LRU's.
  bool ByHeap() const { return ranked_ && !(logged_ && duel_ && duel_->lru_leads()); }

  TenantId TenantOf(std::uint32_t e) const { return ledger_ ? tenant_[e] : kSharedTenant; }
  EvictionOrder& OrderOf(std::uint32_t e) { return orders_[TenantOf(e)]; }
  const EvictionOrder& OrderOf(std::uint32_t e) const { return orders_[TenantOf(e)]; }

  EntryCost CostOf(std::uint32_t e) const { return EntryCost{meta_[e].seconds, meta_[e].frequency, TenantOf(e)}; }

  std::size_t OrderBytes() const {
    std::size_t n = orders_.capacity() * sizeof(EvictionOrder);
    for (const EvictionOrder& o : orders_) n += o.memory_bytes();
    return n;
  }

  // Charges a new entry e to `tenant` (a ledger is on).
  void Charge(std::uint32_t e, TenantId tenant, std::int64_t nbytes) {
    if (tenant_.size() < slab_.size()) tenant_.resize(slab_.size(), kSharedTenant);
    if (orders_.size() <= tenant) orders_.resize(static_cast<std::size_t>(tenant) + 1);
    tenant_[e] = tenant;
    ledger_->Charge(tenant, nbytes);
  }

  // A replace of e charged to `tenant` with `nbytes`: the old charge is
  // dropped, and e moves to the new tenant's order (its old log record goes
  // stale with the Touch that follows).
  void Recharge(std::uint32_t e, TenantId tenant, std::int64_t nbytes) {
    const TenantId old = tenant_[e];
    ledger_->Discharge(old, slab_[e].nbytes);
    if (old != tenant) {
      if (ranked_) orders_[old].heap.Erase(e);
      --orders_[old].size;
      Charge(e, tenant, 0);
      ++orders_[tenant].size;
    }
    ledger_->Charge(tenant, nbytes);
  }

  // The entry holding `key` (whose hash is h), or kNone. An Eq that changes
  // the cache (by re-entering it) restarts the probe on the changed index.
  std::uint32_t Find(const K& key, std::size_t h) const {
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

  std::uint32_t Allocate(const K& key, V&& value, std::int64_t nbytes) {
    ++version_;
    if (!free_.empty()) {
      const std::uint32_t e = free_.back();
      free_.pop_back();
      slab_[e] = Entry{{key, std::move(value), nbytes, 0}};
      return e;
    }
    slab_.push_back(Entry{{key, std::move(value), nbytes, 0}});
    meta_.emplace_back();
    return static_cast<std::uint32_t>(slab_.size() - 1);
  }

  // GDSF's ranking cost of entry e: its own, or the refetch from the tier
  // below (CacheOptions::refetch_seconds_per_byte).
  double RankSeconds(std::uint32_t e) const {
    const std::int64_t n = slab_[e].nbytes;
    if (options_.refetch_seconds_per_byte >= 0 && n <= options_.refetch_max_bytes) {
      return static_cast<double>(n) * options_.refetch_seconds_per_byte;
    }
    return meta_[e].seconds;
  }

  // GDSF's frequency after a reference (a put or a hit) to the key whose
  // hash is h: `resident` (the count while held), or the history's count of
  // the key's references if that is higher.
  std::uint64_t Referenced(std::size_t h, std::uint64_t resident) {
    if (!history_) return resident;
    return std::max<std::uint64_t>(resident, history_->Record(h));
  }

  // GDSF, kHistory: starts the reference history at the first eviction
  // (until then nothing was forgotten, and the resident counts are exact).
  void StartHistory() {
    std::uint64_t window = options_.gdsf_history_window;
    if (window == 0)
      window = std::max<std::uint64_t>(kMinHistoryWindow, kHistoryWindowPerEntry * static_cast<std::uint64_t>(size_));
    history_ = std::make_unique<AdmissionFilter>(AdmissionFilterOptions{window});
  }

  // GDSF: (re)keys e at clock + frequency x cost / size (on probation: the clock alone).
  void Rank(std::uint32_t e) {
    const double size = static_cast<double>(std::max<std::int64_t>(slab_[e].nbytes, 1));
    const bool probation =
        meta_[e].frequency <= 1 && history_ && (duel_ ? duel_->probation_leads() : !logged_ && options_.gdsf_probation);
    const double priority =
        clock_ + (probation ? 0.0 : static_cast<double>(meta_[e].frequency) * RankSeconds(e) / size);
    GdsfHeap& heap = OrderOf(e).heap;
    heap.contains(e) ? heap.Update(e, priority, slab_[e].seq) : heap.Push(e, priority, slab_[e].seq);
  }

  // Marks e most recently touched: re-ranks it (GDSF), logs it (LRU); kAdaptive does both.
  void Touch(std::uint32_t e) {
    slab_[e].seq = ++seq_;
    if (ranked_) Rank(e);
    if (!logged_) return;
    OrderOf(e).Log(e, seq_, SeqOf());
  }

  // Frees slab slot e, whose key hashes to h (value already moved out by
  // pop/evict where needed). The key, and the value if still held, are
  // destroyed last, once the cache is consistent again.
  void Remove(std::uint32_t e, std::size_t h) {
    ++version_;
    index_.Erase(e, h, EntryHash());
    EvictionOrder& o = OrderOf(e);
    if (ranked_) o.heap.Erase(e);
    --o.size;
    if (ledger_) ledger_->Discharge(tenant_[e], slab_[e].nbytes);
    Entry dead = std::move(slab_[e]);
    slab_[e] = Entry{};
    meta_[e] = Meta{};
    cur_bytes_ -= dead.nbytes;
    free_.push_back(e);
    --size_;
  }

  // o's next victim other than `keep` (the entry being put), or kNone when
  // o holds nothing else. Under LRU `keep` was touched last, so it is o's
  // LRU entry only when it is o's only one.
  std::uint32_t Candidate(EvictionOrder& o, std::uint32_t keep) {
    if (o.size == 0) return kNone;
    if (!ByHeap()) {
      const std::uint32_t e = o.LruEntry(SeqOf());
      return e != keep ? e : kNone;
    }
    const GdsfHeap::Node& min = o.heap.Min();
    if (min.id != keep) return min.id;
    return o.heap.size() > 1 ? o.heap.SecondMin().id : kNone;
  }

  // Whether a goes before b in the global order (oldest touch, or lowest
  // GDSF priority then oldest).
  bool Before(std::uint32_t a, std::uint32_t b) const {
    if (!ByHeap()) return slab_[a].seq < slab_[b].seq;
    return GdsfHeap::Less(OrderOf(a).heap.node(a), OrderOf(b).heap.node(b));
  }

  // The next victim, never `keep`, or kNone. With reservations: the first,
  // in the global order, of the candidates of tenants over their
  // reservation (O(T) over the tenants seen).
  std::uint32_t NextVictim(std::uint32_t keep) {
    if (!ledger_) return Candidate(orders_[0], keep);
    std::uint32_t best = kNone;
    for (std::size_t t = 0; t < orders_.size(); ++t) {
      if (!ledger_->Over(static_cast<TenantId>(t))) continue;
      const std::uint32_t c = Candidate(orders_[t], keep);
      if (c != kNone && (best == kNone || Before(c, best))) best = c;
    }
    return best;
  }

  // Evicts while over capacity, never `keep` (kNone: no entry is exempt).
  void Evict(std::uint32_t keep = kNone) {
    while (cur_bytes_ > capacity_bytes_ && size_ > 0) {
      const std::uint32_t e = NextVictim(keep);
      if (e == kNone) break;
      if (ranked_ && !history_ && options_.gdsf_frequency == GdsfFrequency::kHistory) StartHistory();
      if (logged_ && ranked_ && !duel_) duel_ = std::make_unique<PolicyDuel>(options_, capacity_bytes_, size_);
      // Hashed before anything changes: a Hash that throws leaves the victim
      // in place and still first in line, not half-removed.
      const std::size_t h = hash_(slab_[e].key);
      if (ByHeap()) {
        clock_ = std::max(clock_, OrderOf(e).heap.node(e).priority);
      } else {
        OrderOf(e).ConsumeLru();  // e's record
        ++lru_victims_;
      }
      K key = std::move(slab_[e].key);
      V value = std::move(slab_[e].value);
      const std::int64_t nbytes = slab_[e].nbytes;
      const EntryCost cost = CostOf(e);
      if (ledger_) ledger_->CountEviction(cost.tenant);
      Remove(e, h);
      ++evictions_;
      if (on_evict_costed_) {
        on_evict_costed_(key, std::move(value), nbytes, cost);
      } else if (on_evict_) {
        on_evict_(key, std::move(value), nbytes);
      }
    }
    for (EvictionOrder& o : orders_) o.TrimConsumed(SeqOf());
  }

  std::int64_t capacity_bytes_;
  CacheOptions options_;
  bool ranked_ = false;  // GDSF's heap, frequency and clock are kept (kGdsf, kAdaptive)
  bool logged_ = true;   // the recency log is kept (kLru, kAdaptive)
  EvictHook on_evict_;
  CostedEvictHook on_evict_costed_;
  Hash hash_;
  Eq eq_;
  SlotIndex index_;
  std::vector<Entry> slab_;
  std::vector<std::uint32_t> free_;
  std::vector<Meta> meta_;                                             // parallel to slab_
  std::vector<EvictionOrder> orders_ = std::vector<EvictionOrder>(1);  // by tenant; one without a ledger
  std::vector<TenantId> tenant_;                                       // parallel to slab_ while a ledger is on
  std::unique_ptr<TenantLedger> ledger_;                               // null: no reservations
  std::unique_ptr<AdmissionFilter> history_;                           // GDSF kHistory, from the first eviction
  std::unique_ptr<PolicyDuel> duel_;                                   // kAdaptive, from the first eviction
  double clock_ = 0;                                                   // GDSF only
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
