// epd/core/internal/slot_index.h (internal: not part of the API): the hash index of an EmbeddingCache
// (epd/core/embedding_cache.h), from a key's hash to the slab index of its
// entry.
//
// Open addressing with linear probing and backward-shift deletion (no
// tombstones), holding (low 32 bits of the hash, entry index) per 8-byte slot:
// those bits are both the slot's home position and the tag a probe compares
// before the caller compares keys (for keys sharing a home, the bits above
// the index size tell them apart), so deletion and rehashing never read the
// entries. Past 2^32 slots the stored bits no longer give the home, and
// Erase and Rehash ask the caller for the full hash of an entry instead.
//
// The index holds no keys: the caller compares them (Find's `same`), which
// keeps the cache's re-entry rule here: a comparison that changed the cache
// (by re-entering it) answers "changed", and the probe starts again on the
// index as it then is. No reference into the slots is held across a call
// of `same`.
//
// Size: the caller keeps the load factor at most 1/2 (Rehash to double);
// the slot count is a power of two, at least 1.
// Complexity: Find, Insert and Erase O(1) expected; Rehash O(slots).
// Memory: 8 bytes per slot (16-32 bytes per entry at load 1/4 to 1/2).
// Thread safety: thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace epd::internal {

class SlotIndex {
 public:
  static constexpr std::uint32_t kNone = 0xffffffffu;

  explicit SlotIndex(std::size_t slots = 16) : slots_(slots) {}

  std::size_t slots() const { return slots_.size(); }
  std::size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }

  // The entry whose key `same` accepts among those of hash h, or kNone.
  // same(e) returns true or false, or nullopt when the comparison changed
  // the cache (the probe then starts again).
  template <typename Same>
  [[gnu::always_inline]] std::uint32_t Find(std::size_t h, Same&& same) const {
    for (;;) {  // once more each time a comparison changed the cache
      const std::size_t mask = slots_.size() - 1;
      const std::uint32_t lo = Lo(h);
      for (std::size_t i = h & mask;; i = (i + 1) & mask) {
        const Slot s = slots_[i];
        if (s.entry == kNone) return kNone;
        if (s.hash_lo != lo) continue;
        const std::optional<bool> equal = same(s.entry);
        if (!equal.has_value()) break;
        if (*equal) return s.entry;
      }
    }
  }

  // Adds entry e of hash h. REQUIRES: a free slot (load factor < 1).
  void Insert(std::uint32_t e, std::size_t h) { InsertSlot(Slot{Lo(h), e}, h & (slots_.size() - 1)); }

  // Removes entry e, of hash h. hash_of(e') gives an entry's full hash, asked
  // only past 2^32 slots. REQUIRES: e is in the index.
  template <typename HashOf>
  void Erase(std::uint32_t e, std::size_t h, const HashOf& hash_of) {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = h & mask;
    while (slots_[i].entry != e) i = (i + 1) & mask;
    std::size_t j = i;
    for (;;) {
      j = (j + 1) & mask;
      if (slots_[j].entry == kNone) break;
      const std::size_t home = Home(slots_[j], mask, hash_of);
      // Move j into the hole at i unless j's home lies cyclically in (i, j].
      const bool home_in_range = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
      if (!home_in_range) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
  }

  // Rebuilds the index with `slots` slots (a power of two), from its own
  // slots; asks hash_of only past 2^32 slots.
  template <typename HashOf>
  void Rehash(std::size_t slots, const HashOf& hash_of) {
    std::vector<Slot> old(slots, Slot{});
    old.swap(slots_);
    const std::size_t mask = slots - 1;
    for (const Slot& s : old) {
      if (s.entry != kNone) InsertSlot(s, Home(s, mask, hash_of));
    }
  }

 private:
  struct Slot {
    std::uint32_t hash_lo = 0;  // low 32 bits of the hash: tag and home slot
    std::uint32_t entry = kNone;
  };

  static std::uint32_t Lo(std::size_t h) { return static_cast<std::uint32_t>(h); }

  template <typename HashOf>
  static std::size_t Home(const Slot& s, std::size_t mask, const HashOf& hash_of) {
    if (mask <= 0xffffffffu) return s.hash_lo & mask;
    return hash_of(s.entry) & mask;
  }

  void InsertSlot(Slot s, std::size_t home) {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = home;
    while (slots_[i].entry != kNone) i = (i + 1) & mask;
    slots_[i] = s;
  }

  std::vector<Slot> slots_;
};

}  // namespace epd::internal
