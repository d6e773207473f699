// epd/core/internal/adaptive_policy.h (internal): EvictionPolicy::kAdaptive,
// an LRU and a GDSF order over the same entries and the duel
// (epd/core/policy_duel.h) that says whose victim goes next
// (epd/core/cache_options.h defines the rule; epd/core/internal/cache_policy.h
// the calls).
//
// Every entry is in both orders: the recency log (LruPolicy) and GDSF's heap
// with its frequency, history and clock (GdsfPolicy). From the first eviction
// on the duel's three miniature caches see a hash sample of the requests and
// puts; each eviction takes the leader's victim (GDSF's before the duel
// starts), the clock moves only on a heap victim, and an entry is ranked with
// probation while that expert leads.
//
// The ranking and the duel are an AdaptiveState, shared by the policies of one
// cache (TenantPartition's per-tenant orders): one duel per cache.
// Complexity: GDSF's, plus up to three miniature operations per sampled call.
// Memory: LRU's and GDSF's, plus the duel's (about 3 x R x the entries).
// Thread safety: thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "epd/core/cache_options.h"
#include "epd/core/internal/cache_policy.h"
#include "epd/core/internal/gdsf_policy.h"
#include "epd/core/internal/lru_policy.h"
#include "epd/core/policy_duel.h"

namespace epd::internal {

// What the adaptive orders of one cache share.
struct AdaptiveState {
  AdaptiveState(const CacheOptions& o, std::int64_t capacity_bytes) : ranking(o), capacity(capacity_bytes) {
    ranking.probation = false;  // the duel decides, once it exists
  }
  // Whether the next victim is GDSF's (the heap) rather than LRU's.
  bool ByHeap() const { return !(duel && duel->lru_leads()); }
  void Follow() { ranking.probation = duel && duel->probation_leads(); }

  GdsfRanking ranking;
  std::int64_t capacity;
  std::unique_ptr<PolicyDuel> duel;  // from the first eviction on
};

class AdaptivePolicy {
 public:
  AdaptivePolicy(const CacheOptions& o, std::int64_t capacity_bytes)
      : AdaptivePolicy(std::make_shared<AdaptiveState>(o, capacity_bytes)) {}
  explicit AdaptivePolicy(const std::shared_ptr<AdaptiveState>& s)
      : state_(s), gdsf_(std::shared_ptr<GdsfRanking>(s, &s->ranking)) {}
  AdaptivePolicy Sibling() const { return AdaptivePolicy(state_); }

  bool Admits(const EntryCost&, std::int64_t) { return true; }

  template <typename SeqOf>
  void Insert(const EntryRef& r, EntryMeta& m, const EntryCost& c, const SeqOf& seq_of) {
    gdsf_.Insert(r, m, c, seq_of);
    lru_.Add(r, seq_of);
    Put(r, m, c.frequency);
  }
  template <typename SeqOf>
  void Replace(const EntryRef& r, std::int64_t old_nbytes, EntryMeta& m, const EntryCost& c, const SeqOf& seq_of) {
    gdsf_.Replace(r, old_nbytes, m, c, seq_of);
    lru_.Touch(r, seq_of);
    Put(r, m, c.frequency);
  }
  void Join() {
    gdsf_.Join();
    lru_.Join();
  }
  template <typename SeqOf>
  void Hit(const EntryRef& r, EntryMeta& m, const SeqOf& seq_of) {
    Requested(r, m);
    gdsf_.Hit(r, m, seq_of);
    lru_.Touch(r, seq_of);
  }
  void Miss(std::uint64_t h) { Request(h, false, 0, 0); }
  void Requested(const EntryRef& r, const EntryMeta& m) {
    Request(r.hash, true, r.nbytes, state_->ranking.RankSeconds(r.nbytes, m.seconds));
  }
  void Remove(const EntryRef& r) {
    gdsf_.Remove(r);
    lru_.Remove(r);
  }

  template <typename SeqOf>
  std::uint32_t Victim(std::uint32_t keep, const SeqOf& seq_of) {
    return state_->ByHeap() ? gdsf_.Victim(keep, seq_of) : lru_.Victim(keep, seq_of);
  }
  void Prepare(std::size_t entries) {
    gdsf_.Prepare(entries);
    if (!state_->duel) {
      state_->duel = std::make_unique<PolicyDuel>(state_->ranking.options, state_->capacity, entries);
      state_->Follow();
    }
  }
  bool Evict(const EntryRef& r) {
    if (state_->ByHeap()) {
      gdsf_.Evict(r);  // moves the clock
      lru_.Remove(r);  // its records go stale with the slot
      return false;
    }
    lru_.Evict(r);
    gdsf_.Remove(r);
    return true;
  }
  template <typename SeqOf>
  void Trim(const SeqOf& seq_of) {
    lru_.Trim(seq_of);
  }
  std::uint64_t rank_epoch() const { return gdsf_.rank_epoch(); }
  void Rerank(const EntryRef& r, const EntryMeta& m) { gdsf_.Rerank(r, m); }
  void FillCost(std::uint32_t, EntryCost&) const {}

  template <typename SeqOf>
  VictimKey KeyOf(std::uint32_t e, const SeqOf& seq_of) const {
    return state_->ByHeap() ? gdsf_.KeyOf(e, seq_of) : lru_.KeyOf(e, seq_of);
  }
  template <typename SeqOf, typename F>
  void ForEach(const SeqOf& seq_of, F&& f) const {
    state_->ByHeap() ? gdsf_.ForEach(seq_of, f) : lru_.ForEach(seq_of, f);
  }

  double clock() const { return gdsf_.clock(); }
  const AdmissionFilter* history() const { return gdsf_.history(); }
  const PolicyDuel* duel() const { return state_->duel.get(); }
  std::size_t size() const { return lru_.size(); }
  // This order's bytes, the shared state's (history and duel), and both.
  std::size_t OrderBytes() const { return lru_.OrderBytes() + gdsf_.OrderBytes(); }
  std::size_t SharedBytes() const { return gdsf_.SharedBytes() + (state_->duel ? state_->duel->memory_bytes() : 0); }
  std::size_t memory_bytes() const { return OrderBytes() + SharedBytes(); }

 private:
  // A request for hash h (held or not), told to the duel.
  void Request(std::uint64_t h, bool hit, std::int64_t nbytes, double seconds) {
    PolicyDuel* d = state_->duel.get();
    if (d == nullptr || !d->Sampled(h)) return;
    d->OnGet(h, hit, nbytes, seconds);
    state_->Follow();
  }
  // A put of r, told to the duel.
  void Put(const EntryRef& r, const EntryMeta& m, std::uint64_t frequency) {
    PolicyDuel* d = state_->duel.get();
    if (d != nullptr && d->Sampled(r.hash)) {
      d->OnPut(r.hash, r.nbytes, state_->ranking.RankSeconds(r.nbytes, m.seconds), frequency);
    }
  }

  std::shared_ptr<AdaptiveState> state_;
  LruPolicy lru_;
  GdsfPolicy gdsf_;
};

}  // namespace epd::internal
