// epd/core/internal/entry_slab.h (internal): the storage of an EmbeddingCache
// (epd/core/embedding_cache.h): a slab of entries with stable indices and a
// free list, their costs beside them, and the hash index that finds them
// (epd/core/internal/slot_index.h).
//
// An entry is (key, value, charge, touch stamp); the stamp is 0 for a free
// slot and is what the eviction policies read (epd/core/internal/cache_policy.h).
// An entry of exactly one cache line (ContentKey + EmbeddingPtr) is aligned to
// one, so a hit reads one slab line. Costs (EntryMeta) sit in a parallel
// vector so that such an entry stays one line.
//
// Re-entry: Find's comparison (the caller's Eq) may change the slab by
// re-entering the cache; every Add and Release bumps a version, and a probe
// whose comparison saw the version move starts again on the index as it is.
// Complexity: Find, Add and Release O(1) expected; Grow O(slots) when it
// rehashes. Thread safety: thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "epd/core/internal/cache_policy.h"
#include "epd/core/internal/slot_index.h"

namespace epd::internal {

template <typename K, typename V, typename Hash, typename Eq>
class EntrySlab {
  struct Fields {
    K key;
    V value;
    std::int64_t nbytes = 0;
    std::uint64_t seq = 0;  // stamp of the latest touch; 0 = free slot
  };
  static constexpr std::size_t kCacheLine = 64;

 public:
  static constexpr std::uint32_t kNone = SlotIndex::kNone;
  struct alignas(sizeof(Fields) == kCacheLine ? kCacheLine : alignof(Fields)) Entry : Fields {};

  EntrySlab(Hash hash, Eq eq) : hash_(std::move(hash)), eq_(std::move(eq)) {}

  std::size_t HashOf(const K& key) const { return hash_(key); }

  // The entry holding `key` (whose hash is h), or kNone.
  [[gnu::always_inline]] std::uint32_t Find(const K& key, std::size_t h) const {
    return index_.Find(h, [&](std::uint32_t e) -> std::optional<bool> {
      const std::uint64_t version = version_;
      const bool equal = eq_(slab_[e].key, key);
      if (version_ != version) return std::nullopt;
      return equal;
    });
  }

  // A new entry of hash h, stamped `seq`, with a zero cost; then the index
  // grows while `held` entries would fill more than half of it.
  std::uint32_t Add(const K& key, V&& value, std::int64_t nbytes, std::uint64_t seq, std::size_t h, std::size_t held) {
    ++version_;
    std::uint32_t e;
    if (!free_.empty()) {
      e = free_.back();
      free_.pop_back();
      slab_[e] = Entry{{key, std::move(value), nbytes, seq}};
    } else {
      slab_.push_back(Entry{{key, std::move(value), nbytes, seq}});
      meta_.emplace_back();
      e = static_cast<std::uint32_t>(slab_.size() - 1);
    }
    index_.Insert(e, h);
    if (held * 2 > index_.slots()) index_.Rehash(index_.slots() * 2, EntryHash());
    return e;
  }

  // Frees slot e, of hash h, and hands its entry back: the caller destroys
  // it (key, and value if still held) once its own bookkeeping is done.
  Entry Release(std::uint32_t e, std::size_t h) {
    ++version_;
    index_.Erase(e, h, EntryHash());
    Entry dead = std::move(slab_[e]);
    slab_[e] = Entry{};
    meta_[e] = EntryMeta{};
    free_.push_back(e);
    return dead;
  }

  Entry& operator[](std::uint32_t e) { return slab_[e]; }
  const Entry& operator[](std::uint32_t e) const { return slab_[e]; }
  EntryMeta& meta(std::uint32_t e) { return meta_[e]; }
  const EntryMeta& meta(std::uint32_t e) const { return meta_[e]; }
  std::size_t slots() const { return slab_.size(); }

  // The touch stamps, as the policies read them.
  auto SeqOf() const {
    return [this](std::uint32_t e) { return slab_[e].seq; };
  }

  // Index, entry records beyond key and value, free list and costs.
  std::size_t memory_bytes() const {
    return index_.memory_bytes() + slab_.capacity() * (sizeof(Entry) - sizeof(K) - sizeof(V)) +
           free_.capacity() * sizeof(std::uint32_t) + meta_.capacity() * sizeof(EntryMeta);
  }

 private:
  // An entry's full hash, which the index asks for only past 2^32 slots.
  auto EntryHash() const {
    return [this](std::uint32_t e) { return hash_(slab_[e].key); };
  }

  Hash hash_;
  Eq eq_;
  SlotIndex index_;
  std::vector<Entry> slab_;
  std::vector<std::uint32_t> free_;
  std::vector<EntryMeta> meta_;  // parallel to slab_
  std::uint64_t version_ = 0;    // bumped when an entry is added or removed (see Find)
};

}  // namespace epd::internal
