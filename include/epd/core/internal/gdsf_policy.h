// epd/core/internal/gdsf_policy.h (internal): GreedyDual-Size-Frequency
// eviction, with its reference history and probation
// (epd/core/cache_options.h defines the rule; epd/core/internal/cache_policy.h
// the calls).
//
// Each entry is ranked priority = clock + frequency x cost / size in an
// indexed heap (epd/core/internal/gdsf_heap.h; ties to the older touch
// stamp). The victim is the lowest; the clock then becomes max(clock, its
// priority). Under GdsfFrequency::kHistory a TinyLFU-style history
// (epd/core/admission_filter.h) starts at the first eviction, sized 30 x the
// entries then held (at least 1024) unless gdsf_history_window is set, and
// the frequency after a reference is the larger of the resident count and the
// history's. With probation on (gdsf_probation, or kAdaptive's duel), an
// entry of frequency 1 is ranked at the clock alone once the history exists.
//
// The clock, the history and the probation switch are a GdsfRanking, which
// the policies of one cache share (TenantPartition's per-tenant orders, and
// AdaptivePolicy's GDSF half): priorities are comparable across them.
//
// Complexity: Insert, Replace, Hit, Remove, Evict O(log n); Victim O(1);
// ForEach O(n log n). Memory: 24 bytes per heap node plus 4 per slab slot,
// and the history's (about 6 bytes per windowed reference).
// Thread safety: thread-compatible.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "epd/core/admission_filter.h"
#include "epd/core/cache_options.h"
#include "epd/core/internal/cache_policy.h"
#include "epd/core/internal/gdsf_heap.h"

namespace epd {
class PolicyDuel;
}  // namespace epd

namespace epd::internal {

// What every GDSF order of one cache shares.
struct GdsfRanking {
  static constexpr std::uint64_t kMinHistoryWindow = 1024;
  static constexpr std::uint64_t kHistoryWindowPerEntry = 30;

  explicit GdsfRanking(const CacheOptions& o) : options(o), probation(o.gdsf_probation) {}

  // The cost GDSF ranks an entry by: its own, or the refetch from the tier
  // below (CacheOptions::refetch_seconds_per_byte).
  double RankSeconds(std::int64_t nbytes, double seconds) const {
    if (options.refetch_seconds_per_byte >= 0 && nbytes <= options.refetch_max_bytes) {
      return static_cast<double>(nbytes) * options.refetch_seconds_per_byte;
    }
    return seconds;
  }
  // The frequency after a reference to hash h, `resident` counted while held.
  std::uint64_t Referenced(std::uint64_t h, std::uint64_t resident) {
    return history ? std::max<std::uint64_t>(resident, history->Record(h)) : resident;
  }
  // Starts the history at the first eviction (kHistory), with `entries` held.
  void Prepare(std::size_t entries) {
    if (history || options.gdsf_frequency != GdsfFrequency::kHistory) return;
    std::uint64_t window = options.gdsf_history_window;
    if (window == 0) {
      window = std::max<std::uint64_t>(kMinHistoryWindow, kHistoryWindowPerEntry * static_cast<std::uint64_t>(entries));
    }
    history = std::make_unique<AdmissionFilter>(AdmissionFilterOptions{window});
    ++epoch;
  }
  void Advance(double priority) {
    if (priority > clock) {
      clock = priority;
      ++epoch;
    }
  }

  CacheOptions options;
  bool probation;  // rank frequency-1 entries at the clock (with a history)
  double clock = 0;
  std::unique_ptr<AdmissionFilter> history;
  std::uint64_t epoch = 0;  // bumped when the clock moves or the history starts
};

class GdsfPolicy {
 public:
  explicit GdsfPolicy(std::shared_ptr<GdsfRanking> ranking) : ranking_(std::move(ranking)) {}
  explicit GdsfPolicy(const CacheOptions& o) : GdsfPolicy(std::make_shared<GdsfRanking>(o)) {}
  GdsfPolicy Sibling() const { return GdsfPolicy(ranking_); }

  bool Admits(const EntryCost&, std::int64_t) { return true; }

  template <typename SeqOf>
  void Insert(const EntryRef& r, EntryMeta& m, const EntryCost& c, const SeqOf&) {
    m.frequency = ranking_->Referenced(r.hash, c.frequency);
    ++size_;
    Rank(r, m);
  }
  template <typename SeqOf>
  void Replace(const EntryRef& r, std::int64_t, EntryMeta& m, const EntryCost& c, const SeqOf&) {
    m.frequency = ranking_->Referenced(r.hash, std::max(m.frequency + 1, c.frequency));
    Rank(r, m);
  }
  // An entry moved in from another order (TenantPartition); its Replace follows.
  void Join() { ++size_; }
  template <typename SeqOf>
  void Hit(const EntryRef& r, EntryMeta& m, const SeqOf&) {
    m.frequency = ranking_->Referenced(r.hash, m.frequency + 1);
    Rank(r, m);
  }
  void Miss(std::uint64_t) {}
  void Requested(const EntryRef&, const EntryMeta&) {}
  void Remove(const EntryRef& r) {
    heap_.Erase(r.id);
    --size_;
  }

  template <typename SeqOf>
  std::uint32_t Victim(std::uint32_t keep, const SeqOf&) const {
    if (size_ == 0) return kNoEntry;
    const GdsfHeap::Node& min = heap_.Min();
    if (min.id != keep) return min.id;
    return heap_.size() > 1 ? heap_.SecondMin().id : kNoEntry;
  }
  void Prepare(std::size_t entries) { ranking_->Prepare(entries); }
  bool Evict(const EntryRef& r) {
    ranking_->Advance(heap_.node(r.id).priority);
    Remove(r);
    return false;
  }
  template <typename SeqOf>
  void Trim(const SeqOf&) {}
  std::uint64_t rank_epoch() const { return ranking_->epoch; }
  void Rerank(const EntryRef& r, const EntryMeta& m) { Rank(r, m); }
  void FillCost(std::uint32_t, EntryCost&) const {}

  // (Re)keys r at clock + frequency x cost / size (on probation: the clock alone).
  void Rank(const EntryRef& r, const EntryMeta& m) {
    const GdsfRanking& k = *ranking_;
    const double size = static_cast<double>(std::max<std::int64_t>(r.nbytes, 1));
    const bool probation = m.frequency <= 1 && k.history && k.probation;
    const double priority =
        k.clock + (probation ? 0.0 : static_cast<double>(m.frequency) * k.RankSeconds(r.nbytes, m.seconds) / size);
    heap_.contains(r.id) ? heap_.Update(r.id, priority, r.seq) : heap_.Push(r.id, priority, r.seq);
  }

  template <typename SeqOf>
  VictimKey KeyOf(std::uint32_t e, const SeqOf&) const {
    const GdsfHeap::Node& n = heap_.node(e);
    return VictimKey{n.priority, n.seq};
  }
  template <typename SeqOf, typename F>
  void ForEach(const SeqOf&, F&& f) const {
    std::vector<GdsfHeap::Node> order(heap_.nodes());
    std::sort(order.begin(), order.end(), GdsfHeap::Less);
    for (const GdsfHeap::Node& n : order) f(n.id);
  }

  GdsfRanking& ranking() { return *ranking_; }
  const GdsfRanking& ranking() const { return *ranking_; }
  double clock() const { return ranking_->clock; }
  const AdmissionFilter* history() const { return ranking_->history.get(); }
  const PolicyDuel* duel() const { return nullptr; }
  std::size_t size() const { return size_; }
  // This order's bytes, the shared ranking's (its history), and both.
  std::size_t OrderBytes() const { return heap_.memory_bytes(); }
  std::size_t SharedBytes() const { return ranking_->history ? ranking_->history->memory_bytes() : 0; }
  std::size_t memory_bytes() const { return OrderBytes() + SharedBytes(); }

 private:
  std::shared_ptr<GdsfRanking> ranking_;
  GdsfHeap heap_;
  std::size_t size_ = 0;  // entries in this order
};

}  // namespace epd::internal
