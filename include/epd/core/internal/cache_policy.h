// epd/core/internal/cache_policy.h (internal): the seam between an
// EmbeddingCache (epd/core/embedding_cache.h) and its eviction policy.
//
// The cache owns storage: the slab of entries, the hash index, the byte
// accounting, the hooks, re-entry safety and the counters. A policy owns its
// order (a recency log, a heap, a duel, per-tenant orders) and never calls
// back into the cache; it learns of each event through the calls below and
// reads only what it is handed: an EntryRef, the entry's EntryMeta (cost and
// frequency, which the policy may update: GDSF's frequency is the policy's
// rule), and `seq_of(e)`, the touch stamp the cache keeps inside each entry
// (0 for a free slot), as CacheLib keeps a container's hook in the item.
//
// Calls, for entry ids (slab indices) the cache hands out:
//   Admits(cost, nbytes)   whether a put may be made room for (a reservation
//                          can refuse it; the policy counts the refusal)
//   Insert(ref, meta, cost, seq_of)   a new entry, stamped; sets meta.frequency
//   Replace(ref, old_nbytes, meta, cost, seq_of)   a re-put, stamped again
//   Hit(ref, meta, seq_of) / Miss(hash)   a Get
//   Requested(ref, meta)   a PopRequested that found the entry (a request)
//   Remove(ref)            a Pop: forget the entry
//   Victim(keep, seq_of)   the next victim, never `keep`, or kNoEntry; pure
//                          but for dropping stale records
//   Prepare(entries)       the cache is about to evict with `entries` held
//                          (starts state kept from the first eviction on)
//   Evict(ref)             forget the victim; true when it was LRU's
//   Trim(seq_of)           after an eviction run
//   rank_epoch(), Rerank(ref, meta)   Cao and Irani's rule: a newcomer is
//                          ranked again when its victims moved the ranking
//   FillCost(id, cost)     what a Pop or the hook hands on besides the meta
//   ForEach(seq_of, f)     entries in eviction order, next victim first
//   memory_bytes()         bookkeeping held now
// Thread safety: thread-compatible, as the cache that owns the policy.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "epd/core/cache_options.h"

namespace epd::internal {

inline constexpr std::uint32_t kNoEntry = 0xffffffffu;

// The entry an event is about, as the cache sees it at that moment.
struct EntryRef {
  std::uint32_t id;
  std::uint64_t hash;   // the key's hash (the cache's Hash)
  std::uint64_t seq;    // its touch stamp now
  std::int64_t nbytes;  // its charge now
};

// What the cache keeps per entry beside the slab: the cost (seconds, as
// stored) and the frequency (references; GDSF's f).
struct EntryMeta {
  double seconds = 0;
  std::uint64_t frequency = 0;
};

// An entry's place in a global order: lower goes first (GDSF's priority,
// 0 under recency; then the touch stamp).
struct VictimKey {
  double priority;
  std::uint64_t seq;
  friend bool operator<(const VictimKey& a, const VictimKey& b) {
    return a.priority < b.priority || (a.priority == b.priority && a.seq < b.seq);
  }
};

// The stamp reader a policy is handed (the cache passes a lambda of this shape).
using SeqOfArchetype = std::function<std::uint64_t(std::uint32_t)>;

template <typename P>
concept CachePolicy = requires(P p, const P cp, const EntryRef& r, EntryMeta& m, const EntryCost& c,
                               const SeqOfArchetype& s, std::uint32_t e, std::uint64_t h, EntryCost& out) {
  { p.Admits(c, r.nbytes) } -> std::same_as<bool>;
  p.Insert(r, m, c, s);
  p.Replace(r, r.nbytes, m, c, s);
  p.Hit(r, m, s);
  p.Miss(h);
  p.Requested(r, m);
  p.Remove(r);
  { p.Victim(e, s) } -> std::same_as<std::uint32_t>;
  p.Prepare(std::size_t{1});
  { p.Evict(r) } -> std::same_as<bool>;
  p.Trim(s);
  { cp.rank_epoch() } -> std::same_as<std::uint64_t>;
  p.Rerank(r, m);
  cp.FillCost(e, out);
  { cp.memory_bytes() } -> std::convertible_to<std::size_t>;
};

}  // namespace epd::internal
