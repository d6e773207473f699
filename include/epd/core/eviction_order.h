// epd/core/eviction_order.h: the order in which an EmbeddingCache
// (epd/core/embedding_cache.h) gives up one tenant's entries: a recency log
// (LRU) and a GDSF heap (epd/core/gdsf_heap.h), either or both as the policy
// needs (epd/core/cache_options.h).
//
// The recency log holds (entry, sequence) records in touch order. Each entry
// has the sequence of its latest touch (the cache keeps it), so a record is
// current iff its sequence equals the entry's; the first current record is the
// exact LRU entry, and stale ones are skipped and, once they are more than
// 2n + 64 of the log (n the entries held), compacted away. A hit so writes
// one record and never touches neighbouring entries the way a linked list's
// unlink does. The caller passes `seq_of(e)`, the sequence of entry e now
// (0 for a free slot).
//
// Complexity: Log O(1) amortised (a compaction is linear in the log, once
// per >= n touches); LruEntry O(1) amortised; the heap O(log n).
// Memory: 16 bytes per record, at most 3n + 64 unconsumed ones plus up to
// 4096 consumed ones (or half the log), plus the heap's.
// Thread safety: thread-compatible.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "epd/core/gdsf_heap.h"

namespace epd {

struct EvictionOrder {
  struct Record {
    std::uint32_t entry;
    std::uint64_t seq;
  };

  std::vector<Record> log;
  std::size_t head = 0;  // first record not yet consumed
  GdsfHeap heap;
  std::size_t size = 0;  // entries held in this order

  // Appends e's touch, with sequence seq.
  template <typename SeqOf>
  void Log(std::uint32_t e, std::uint64_t seq, const SeqOf& seq_of) {
    log.push_back(Record{e, seq});
    if (log.size() - head > 3 * size + 64) Compact(seq_of);
  }

  // The LRU entry, whose record is left at `head` (stale records before it
  // are dropped). REQUIRES: size > 0.
  template <typename SeqOf>
  std::uint32_t LruEntry(const SeqOf& seq_of) {
    for (;;) {
      assert(head < log.size());
      const Record r = log[head];
      if (seq_of(r.entry) == r.seq) return r.entry;
      ++head;
    }
  }

  // Consumes the record LruEntry left at `head` (its entry is evicted).
  void ConsumeLru() { ++head; }

  // Drops consumed and stale records once the consumed ones are the larger
  // part of a long log.
  template <typename SeqOf>
  void TrimConsumed(const SeqOf& seq_of) {
    if (head > 4096 && head * 2 > log.size()) Compact(seq_of);
  }

  // Visits the current records, oldest first.
  template <typename SeqOf, typename F>
  void ForEachCurrent(const SeqOf& seq_of, F&& f) const {
    for (std::size_t i = head; i < log.size(); ++i) {
      if (seq_of(log[i].entry) == log[i].seq) f(log[i]);
    }
  }

  std::size_t memory_bytes() const { return log.capacity() * sizeof(Record) + heap.memory_bytes(); }

 private:
  template <typename SeqOf>
  void Compact(const SeqOf& seq_of) {
    std::size_t out = 0;
    for (std::size_t i = head; i < log.size(); ++i) {
      const Record r = log[i];
      if (seq_of(r.entry) == r.seq) log[out++] = r;
    }
    log.resize(out);
    head = 0;
  }
};

}  // namespace epd
