// epd/core/internal/lru_policy.h (internal): least recently used first, the
// engine reference's policy and EmbeddingCache's default
// (epd/core/internal/cache_policy.h states the calls).
//
// The order is a recency log (epd/core/internal/eviction_order.h): a touch
// appends one record; the victim is the first record still current. The
// entry's frequency counts puts (a re-put adds one), never hits, as it always
// has under LRU; nothing else is kept. Every victim is LRU's.
//
// Complexity: every call O(1) amortised; ForEach O(n) over the log.
// Memory: the log's 16-byte records, at most 3n + 64 unconsumed.
// Thread safety: thread-compatible.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "epd/core/cache_options.h"
#include "epd/core/internal/cache_policy.h"
#include "epd/core/internal/eviction_order.h"

namespace epd {
class AdmissionFilter;
class PolicyDuel;
}  // namespace epd

namespace epd::internal {

class LruPolicy {
 public:
  // A new, empty policy of the same kind (TenantPartition's next tenant).
  LruPolicy Sibling() const { return LruPolicy(); }

  bool Admits(const EntryCost&, std::int64_t) { return true; }

  template <typename SeqOf>
  void Insert(const EntryRef& r, EntryMeta& m, const EntryCost& c, const SeqOf& seq_of) {
    m.frequency = c.frequency;
    Add(r, seq_of);
  }
  template <typename SeqOf>
  void Replace(const EntryRef& r, std::int64_t, EntryMeta& m, const EntryCost& c, const SeqOf& seq_of) {
    m.frequency = std::max(m.frequency + 1, c.frequency);
    Touch(r, seq_of);
  }
  template <typename SeqOf>
  [[gnu::always_inline]] void Hit(const EntryRef& r, EntryMeta&, const SeqOf& seq_of) {
    Touch(r, seq_of);
  }
  // An entry moved in from another order (TenantPartition); its Replace follows.
  void Join() { ++size_; }
  void Miss(std::uint64_t) {}
  void Requested(const EntryRef&, const EntryMeta&) {}
  void Remove(const EntryRef&) { --size_; }

  template <typename SeqOf>
  std::uint32_t Victim(std::uint32_t keep, const SeqOf& seq_of) {
    if (size_ == 0) return kNoEntry;
    const std::uint32_t e = log_.LruEntry(seq_of);
    return e != keep ? e : kNoEntry;  // `keep` was touched last: LRU only when alone
  }
  void Prepare(std::size_t) {}
  bool Evict(const EntryRef&) {
    log_.ConsumeLru();  // the victim's record, left at the head by Victim
    --size_;
    return true;
  }
  template <typename SeqOf>
  void Trim(const SeqOf& seq_of) {
    log_.TrimConsumed(seq_of);
  }
  std::uint64_t rank_epoch() const { return 0; }
  void Rerank(const EntryRef&, const EntryMeta&) {}
  void FillCost(std::uint32_t, EntryCost&) const {}

  template <typename SeqOf>
  VictimKey KeyOf(std::uint32_t e, const SeqOf& seq_of) const {
    return VictimKey{0, seq_of(e)};
  }
  template <typename SeqOf, typename F>
  void ForEach(const SeqOf& seq_of, F&& f) const {
    log_.ForEachCurrent(seq_of, [&](const RecencyLog::Record& r) { f(r.entry); });
  }

  // Low-level parts, for AdaptivePolicy: an entry joins, is touched, leaves.
  template <typename SeqOf>
  void Add(const EntryRef& r, const SeqOf& seq_of) {
    ++size_;
    Touch(r, seq_of);
  }
  template <typename SeqOf>
  [[gnu::always_inline]] void Touch(const EntryRef& r, const SeqOf& seq_of) {
    log_.Log(r.id, r.seq, size_, seq_of);
  }

  double clock() const { return 0; }
  const AdmissionFilter* history() const { return nullptr; }
  const PolicyDuel* duel() const { return nullptr; }
  std::size_t size() const { return size_; }
  std::size_t OrderBytes() const { return log_.memory_bytes(); }
  std::size_t SharedBytes() const { return 0; }
  std::size_t memory_bytes() const { return OrderBytes(); }

 private:
  RecencyLog log_;
  std::size_t size_ = 0;  // entries in this order
};

}  // namespace epd::internal
