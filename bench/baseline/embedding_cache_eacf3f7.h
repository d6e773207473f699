// bench/baseline/embedding_cache_eacf3f7.h: EmbeddingCache as it stood at
// commit eacf3f7, the last header before GDSF, kept verbatim but for this
// comment and its namespace (epd::baseline_eacf3f7) so that cache_bench can
// time today's LRU get-hit against it in the same run. Not built into any
// library; benchmarks only.
// epd/core/embedding_cache.h: a bytes-bounded LRU cache of vision-tower outputs,
// keyed by content key.
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
//   - A capacity or nbytes outside [0, kMaxCacheBytes] throws
//     epd::Error(kInvalidArgument) naming the argument; nothing is changed.
//     The bound (2^62 - 1 bytes, 4 EiB) keeps a full cache plus one more
//     charge within the int64 byte counter; the reference's Python ints have
//     no bound, and no memory comes near it.
//
// Ownership: the cache owns one copy of each value. Get() returns a copy of
// the value (for EmbeddingPtr, a shared_ptr: the embedding stays alive for the
// reader after the entry is evicted, replaced or popped). Pop() and on_evict
// move the cache's copy out to the caller.
//
// Performance: get, put and pop are O(1) expected (amortised: the recency log
// is compacted in O(n) once every >= n touches). A hit touches the index slot
// and the entry, and appends 16 bytes to a sequential log; it never touches
// neighbouring entries the way a linked-list LRU's unlink does.
//
// Per-entry bookkeeping, beyond sizeof(K) + sizeof(V):
//   entry record        16 bytes  (nbytes, last-touch sequence), plus padding
//                                 to the entry's alignment
//   index slots      16-32 bytes  (8-byte slots, load factor at most 1/2, doubling)
//   recency log      16-48 bytes  (16-byte records, compacted at 3 per live entry)
// i.e. 48-96 bytes, plus the slab's and the log's spare vector capacity
// (up to 2x from doubling); `bench/cache_bench` measures it from the heap
// (docs/BENCHMARKS.md).
//
// Thread safety: thread-compatible (no internal locking). Use
// ConcurrentEmbeddingCache (epd/core/concurrent_cache.h) to share one across
// threads. The hook runs synchronously inside Put(); it may throw, in which
// case the exception propagates and the cache is left as after the victim's
// removal (the remaining overflow is evicted by the next put).
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
// Design: entries live in a slab (vector, stable indices, free list). The
// index is open addressing with linear probing and backward-shift deletion,
// holding (low 32 bits of the hash, slab index): those bits are both the
// slot's home position and the tag a probe compares before touching the slab
// (for keys sharing a home, the bits above the index size tell them apart),
// so deletion and rehashing never read the slab. An entry that is exactly one
// cache line (ContentKey + EmbeddingPtr) is aligned to one, so a hit reads
// one slab line. Recency is a log of (slab index, sequence)
// records in touch order; each entry stores the sequence of its latest touch,
// so a record is current iff its sequence equals the entry's. The first current
// record in the log is the exact LRU entry: eviction pops stale records until
// it finds one. Benefits: a hit writes only its own entry. Costs: the log holds
// stale records until compaction (bounded at 3 records per live entry).
#pragma once

#include <cassert>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "epd/core/status.h"

namespace epd::baseline_eacf3f7 {

// What a Pop() hands back: the value and the bytes it was charged.
template <typename V>
struct PoppedEntry {
  V value;
  std::int64_t nbytes;
};

// The largest capacity or charge, in bytes, an EmbeddingCache accepts:
// 2^62 - 1, so that a full cache plus one more charge (< 2^63) always fits the
// int64 byte counter.
inline constexpr std::int64_t kMaxCacheBytes = (std::int64_t{1} << 62) - 1;

// The error for a byte count `name` (a capacity or a charge) outside
// [0, kMaxCacheBytes]; `got` is its decimal text, so that a caller holding a
// wider integer (Python's) reports it exactly.
inline Status CacheBytesOutOfRange(const std::string& name, bool negative, const std::string& got) {
  return Status(StatusCode::kInvalidArgument,
                negative ? name + " must be >= 0, got " + got
                         : name + " must be <= " + std::to_string(kMaxCacheBytes) + " (2^62 - 1), got " + got);
}

// Throws epd::Error(kInvalidArgument) unless 0 <= bytes <= kMaxCacheBytes.
inline void CheckCacheBytes(const std::string& name, std::int64_t bytes) {
  if (bytes < 0 || bytes > kMaxCacheBytes) throw Error(CacheBytesOutOfRange(name, bytes < 0, std::to_string(bytes)));
}

template <typename K, typename V, typename Hash = std::hash<K>, typename Eq = std::equal_to<K>>
class EmbeddingCache {
 public:
  // Called once per capacity-overflow victim, oldest first, after the victim
  // has been removed. The value is moved to the hook.
  using EvictHook = std::function<void(const K& key, V&& value, std::int64_t nbytes)>;

  // Throws epd::Error(kInvalidArgument) unless 0 <= capacity_bytes <= kMaxCacheBytes.
  explicit EmbeddingCache(std::int64_t capacity_bytes, EvictHook on_evict = nullptr, Hash hash = Hash(), Eq eq = Eq())
      : capacity_bytes_(capacity_bytes), on_evict_(std::move(on_evict)), hash_(std::move(hash)), eq_(std::move(eq)) {
    CheckCacheBytes("capacity_bytes", capacity_bytes);
    Rehash(16);
  }

  EmbeddingCache(const EmbeddingCache&) = delete;
  EmbeddingCache& operator=(const EmbeddingCache&) = delete;
  EmbeddingCache(EmbeddingCache&&) noexcept = default;
  EmbeddingCache& operator=(EmbeddingCache&&) noexcept = default;

  // Returns a copy of the value and marks it MRU, or nullopt (a miss).
  std::optional<V> Get(const K& key) {
    const std::size_t h = hash_(key);
    const std::uint32_t e = Find(key, h);
    if (e == kNone) {
      ++misses_;
      return std::nullopt;
    }
    Touch(e);
    ++hits_;
    return slab_[e].value;
  }

  // Inserts or replaces `key` as MRU, charging `nbytes`, then evicts LRU
  // entries while over capacity. Throws epd::Error(kInvalidArgument) unless
  // 0 <= nbytes <= kMaxCacheBytes. Skips (returns) when nbytes > capacity_bytes().
  void Put(const K& key, V value, std::int64_t nbytes) {
    CheckCacheBytes("nbytes", nbytes);
    if (nbytes > capacity_bytes_) return;
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
      replaced.emplace(std::exchange(ent.value, std::move(value)));
      ent.nbytes = nbytes;
      Touch(e);
    } else {
      e = Allocate(key, std::move(value), nbytes);
      InsertIndex(e, h);
      cur_bytes_ += nbytes;
      ++size_;
      Touch(e);
      if (size_ * 2 > index_.size()) Rehash(index_.size() * 2);
    }
    Evict();
  }

  // Removes `key` and returns its value and charge; nullopt when absent.
  std::optional<PoppedEntry<V>> Pop(const K& key) {
    const std::size_t h = hash_(key);
    const std::uint32_t e = Find(key, h);
    if (e == kNone) return std::nullopt;
    PoppedEntry<V> out{std::move(slab_[e].value), slab_[e].nbytes};
    Remove(e, h);
    return out;
  }

  bool Contains(const K& key) const { return Find(key, hash_(key)) != kNone; }
  std::size_t size() const { return size_; }
  std::int64_t current_bytes() const { return cur_bytes_; }
  std::int64_t capacity_bytes() const { return capacity_bytes_; }
  std::uint64_t hits() const { return hits_; }
  std::uint64_t misses() const { return misses_; }
  // Capacity-overflow victims removed so far (each one the hook saw, if set).
  std::uint64_t evictions() const { return evictions_; }

  // Bytes of bookkeeping held now (index, entry records, recency log), not
  // counting keys and values. For the overhead figure in the header comment.
  std::size_t bookkeeping_bytes() const {
    return index_.capacity() * sizeof(Slot) + slab_.capacity() * (sizeof(Entry) - sizeof(K) - sizeof(V)) +
           log_.capacity() * sizeof(Record) + free_.capacity() * sizeof(std::uint32_t);
  }

  // Visits entries from LRU to MRU as (key, value, nbytes). O(n) (linear in
  // the recency log, which holds at most 3n + 64 records).
  // For tests and debugging; does not count hits.
  template <typename F>
  void ForEachLruToMru(F&& f) const {
    for (std::size_t i = log_head_; i < log_.size(); ++i) {
      const Record& r = log_[i];
      const Entry& ent = slab_[r.entry];
      if (ent.seq == r.seq) f(ent.key, ent.value, ent.nbytes);
    }
  }

 private:
  static constexpr std::uint32_t kNone = 0xffffffffu;

  struct EntryFields {
    K key;
    V value;
    std::int64_t nbytes = 0;
    std::uint64_t seq = 0;  // sequence of the latest touch; 0 = free slot
  };
  static constexpr std::size_t kCacheLine = 64;
  struct alignas(sizeof(EntryFields) == kCacheLine ? kCacheLine : alignof(EntryFields)) Entry : EntryFields {};
  struct Slot {
    std::uint32_t hash_lo = 0;  // low 32 bits of the hash: tag and home slot
    std::uint32_t entry = kNone;
  };
  struct Record {
    std::uint32_t entry;
    std::uint64_t seq;
  };

  static std::uint32_t Lo(std::size_t h) { return static_cast<std::uint32_t>(h); }

  // Home position of the entry in slot s. The stored 32 bits suffice while
  // the index has at most 2^32 slots; beyond that the key is hashed again.
  std::size_t Home(const Slot& s, std::size_t mask) const {
    if (mask <= 0xffffffffu) return s.hash_lo & mask;
    return hash_(slab_[s.entry].key) & mask;
  }

  // The entry holding `key` (whose hash is h), or kNone. An Eq that changes
  // the cache (by re-entering it) restarts the probe on the changed index.
  std::uint32_t Find(const K& key, std::size_t h) const {
    for (;;) {
      const std::uint64_t version = version_;
      const std::size_t mask = index_.size() - 1;
      const std::uint32_t lo = Lo(h);
      for (std::size_t i = h & mask;; i = (i + 1) & mask) {
        const Slot s = index_[i];
        if (s.entry == kNone) return kNone;
        if (s.hash_lo != lo) continue;
        const bool equal = eq_(slab_[s.entry].key, key);
        if (version_ != version) break;
        if (equal) return s.entry;
      }
    }
  }

  void InsertIndex(std::uint32_t e, std::size_t h) { InsertSlot(Slot{Lo(h), e}, h & (index_.size() - 1)); }

  void InsertSlot(Slot s, std::size_t home) {
    const std::size_t mask = index_.size() - 1;
    std::size_t i = home;
    while (index_[i].entry != kNone) i = (i + 1) & mask;
    index_[i] = s;
  }

  // Backward-shift deletion keeps probe sequences gap-free without tombstones.
  // `h` is the hash of e's key.
  void EraseIndex(std::uint32_t e, std::size_t h) {
    const std::size_t mask = index_.size() - 1;
    std::size_t i = h & mask;
    while (index_[i].entry != e) i = (i + 1) & mask;
    std::size_t j = i;
    for (;;) {
      j = (j + 1) & mask;
      if (index_[j].entry == kNone) break;
      const std::size_t home = Home(index_[j], mask);
      // Move j into the hole at i unless j's home lies cyclically in (i, j].
      const bool home_in_range = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
      if (!home_in_range) {
        index_[i] = index_[j];
        i = j;
      }
    }
    index_[i] = Slot{};
  }

  // Rebuilds the index from its own slots; reads the slab only past 2^32 slots.
  void Rehash(std::size_t slots) {
    std::vector<Slot> old(slots, Slot{});
    old.swap(index_);
    const std::size_t mask = slots - 1;
    for (const Slot& s : old) {
      if (s.entry != kNone) InsertSlot(s, Home(s, mask));
    }
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
    return static_cast<std::uint32_t>(slab_.size() - 1);
  }

  void Touch(std::uint32_t e) {
    slab_[e].seq = ++seq_;
    log_.push_back(Record{e, seq_});
    if (log_.size() - log_head_ > 3 * size_ + 64) CompactLog();
  }

  void CompactLog() {
    std::size_t out = 0;
    for (std::size_t i = log_head_; i < log_.size(); ++i) {
      const Record r = log_[i];
      if (slab_[r.entry].seq == r.seq) log_[out++] = r;
    }
    log_.resize(out);
    log_head_ = 0;
  }

  // Frees slab slot e, whose key hashes to h (value already moved out by
  // pop/evict where needed). The key, and the value if still held, are
  // destroyed last, once the cache is consistent again.
  void Remove(std::uint32_t e, std::size_t h) {
    ++version_;
    EraseIndex(e, h);
    Entry dead = std::move(slab_[e]);
    slab_[e] = Entry{};
    cur_bytes_ -= dead.nbytes;
    free_.push_back(e);
    --size_;
  }

  // Index of the LRU entry, whose record is left at log_head_ (stale records
  // before it are dropped). REQUIRES: size_ > 0.
  std::uint32_t LruEntry() {
    for (;;) {
      assert(log_head_ < log_.size());
      const Record r = log_[log_head_];
      if (slab_[r.entry].seq == r.seq) return r.entry;
      ++log_head_;
    }
  }

  void Evict() {
    while (cur_bytes_ > capacity_bytes_ && size_ > 0) {
      const std::uint32_t e = LruEntry();
      // Hashed before anything changes: a Hash that throws leaves the victim
      // in place and still first in line, not half-removed.
      const std::size_t h = hash_(slab_[e].key);
      ++log_head_;  // consumes e's record
      K key = std::move(slab_[e].key);
      V value = std::move(slab_[e].value);
      const std::int64_t nbytes = slab_[e].nbytes;
      Remove(e, h);
      ++evictions_;
      if (on_evict_) on_evict_(key, std::move(value), nbytes);
    }
    if (log_head_ > 4096 && log_head_ * 2 > log_.size()) CompactLog();
  }

  std::int64_t capacity_bytes_;
  EvictHook on_evict_;
  Hash hash_;
  Eq eq_;
  std::vector<Slot> index_;
  std::vector<Entry> slab_;
  std::vector<std::uint32_t> free_;
  std::vector<Record> log_;
  std::size_t log_head_ = 0;
  std::size_t size_ = 0;
  std::int64_t cur_bytes_ = 0;
  std::uint64_t seq_ = 0;
  std::uint64_t version_ = 0;  // bumped when an entry is added or removed (see Find)
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
  std::uint64_t evictions_ = 0;
};

}  // namespace epd::baseline_eacf3f7
