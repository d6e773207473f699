// epd/core/internal/eviction_order.h (internal): LRU's eviction order, a
// recency log of (entry, sequence) records in touch order.
//
// The cache stamps each entry with the sequence of its latest touch (0 for a
// free slot) and lets the policy read the stamps (`seq_of(e)`), as CacheLib
// keeps an eviction container's hook inside the item. A record is current iff
// its sequence equals the entry's stamp; the first current record is the exact
// LRU entry; stale ones are skipped and, once they are more than 2n + 64 of
// the log (n the entries in the order), compacted away. A hit so writes one
// record and never touches neighbouring entries the way a linked list's
// unlink does.
//
// Complexity: Log O(1) amortised (a compaction is linear in the log, once
// per >= n touches); LruEntry O(1) amortised.
// Memory: 16 bytes per record, at most 3n + 64 unconsumed ones plus up to
// 4096 consumed ones (or half the log).
// Thread safety: thread-compatible.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace epd::internal {

class RecencyLog {
 public:
  struct Record {
    std::uint32_t entry;
    std::uint64_t seq;
  };

  // Appends e's touch, with sequence seq; `held` is the entries in the order.
  template <typename SeqOf>
  [[gnu::always_inline]] void Log(std::uint32_t e, std::uint64_t seq, std::size_t held, const SeqOf& seq_of) {
    log_.push_back(Record{e, seq});
    if (log_.size() - head_ > 3 * held + 64) Compact(seq_of);
  }

  // The LRU entry, whose record is left at the head (stale records before it
  // are dropped). REQUIRES: the order holds an entry.
  template <typename SeqOf>
  std::uint32_t LruEntry(const SeqOf& seq_of) {
    for (;;) {
      assert(head_ < log_.size());
      const Record r = log_[head_];
      if (seq_of(r.entry) == r.seq) return r.entry;
      ++head_;
    }
  }

  // Consumes the record LruEntry left at the head (its entry is evicted).
  void ConsumeLru() { ++head_; }

  // Drops consumed and stale records once the consumed ones are the larger
  // part of a long log.
  template <typename SeqOf>
  void TrimConsumed(const SeqOf& seq_of) {
    if (head_ > 4096 && head_ * 2 > log_.size()) Compact(seq_of);
  }

  // Visits the current records, oldest first.
  template <typename SeqOf, typename F>
  void ForEachCurrent(const SeqOf& seq_of, F&& f) const {
    for (std::size_t i = head_; i < log_.size(); ++i) {
      if (seq_of(log_[i].entry) == log_[i].seq) f(log_[i]);
    }
  }

  std::size_t memory_bytes() const { return log_.capacity() * sizeof(Record); }

 private:
  template <typename SeqOf>
  [[gnu::noinline, gnu::cold]] void Compact(const SeqOf& seq_of) {
    std::size_t out = 0;
    for (std::size_t i = head_; i < log_.size(); ++i) {
      const Record r = log_[i];
      if (seq_of(r.entry) == r.seq) log_[out++] = r;
    }
    log_.resize(out);
    head_ = 0;
  }

  std::vector<Record> log_;
  std::size_t head_ = 0;  // first record not yet consumed
};

}  // namespace epd::internal
