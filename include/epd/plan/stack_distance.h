// epd/plan/stack_distance.h: exact byte-weighted LRU stack distances, with
// variable entry sizes.
//
// The stack distance of an access to key k is the bytes an LRU cache must
// hold for that access to hit: size(k) plus the sizes of the distinct keys
// accessed since k's previous access (their latest sizes). Because an LRU
// cache that evicts from its cold end until it fits always holds a prefix of
// the recency stack (Mattson, Gecsei, Slutz, Traiger, "Evaluation techniques
// for storage hierarchies", IBM Systems Journal 1970), an access hits a cache
// of C bytes iff its distance is <= C, for every C at least as large as the
// largest entry (EmbeddingCache skips an entry larger than itself; below
// that size the distances still count such entries, so a curve read there
// is conservative). A first access has no distance (kCold). Exact when
// each key keeps one size (a content key's embedding always has the same
// bytes); a key re-accessed at a smaller size lowers the bytes above older
// keys after the fact, where an LRU cache may already have evicted them, so
// such a trace's distances can read a hit the cache missed (0.0014 of miss
// ratio on a fuzzed trace whose keys change size at random).
//
// Design: a Fenwick tree over access positions holds, at each key's latest
// position, that key's size; the bytes above k are total - prefix(k's
// position), one O(log n) query and two O(log n) updates per access
// (Bennett and Kruskal's "LRU stack processing", IBM J. R&D 1975, counted
// objects the same way). Positions run out after `positions` accesses; the
// live keys are then renumbered in recency order into a tree twice their
// number (amortised O(log n) per access).
//
// Complexity: Access and Forget O(log n) amortised, n = keys held.
// Memory: about 56 bytes per key in the index plus 8 bytes per position
// (memory_bytes() reports it).
// Thread safety: thread-compatible.
//
// Example:
//   ByteStackDistance s;
//   s.Access(1, 100);   // kCold
//   s.Access(2, 50);    // kCold
//   s.Access(1, 100);   // 150: 100 of its own + 50 of key 2
#pragma once

#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

namespace epd {

class ByteStackDistance {
 public:
  // The distance of a first access.
  static constexpr std::int64_t kCold = std::numeric_limits<std::int64_t>::max();

  // `positions`: accesses before the first renumbering (the trace length,
  // when known, avoids any).
  explicit ByteStackDistance(std::size_t positions = 1 << 16);

  // Records an access of `key` charged `bytes` (>= 0) and returns its
  // distance in bytes, or kCold for the key's first access.
  std::int64_t Access(std::uint64_t key, std::int64_t bytes);

  // Two classes of keys, counted apart (SHARDS's exactly tracked head and
  // its sampled tail, which it scales): the bytes above this access's
  // previous one in each class, excluding its own. cold: a first access.
  struct Split {
    bool cold = true;
    std::int64_t above[2] = {0, 0};
  };
  // REQUIRES: cls is 0 or 1 and the key's class never changes.
  Split AccessSplit(std::uint64_t key, std::int64_t bytes, int cls);
  // Drops `key` from the stack, as if never accessed (SHARDS's sampled set
  // shrinking). No-op for an unknown key.
  void Forget(std::uint64_t key);

  std::size_t keys() const { return slots_.size(); }
  // Bytes of the keys held (each at its latest size).
  std::int64_t total_bytes() const { return total_; }
  std::size_t memory_bytes() const;

 private:
  struct Slot {
    std::uint32_t pos;  // 1-based position of the latest access
    std::uint32_t cls;  // which tree holds its bytes
    std::int64_t bytes;
  };

  static void Add(std::vector<std::int64_t>& tree, std::uint32_t pos, std::int64_t delta);
  static std::int64_t Prefix(const std::vector<std::int64_t>& tree, std::uint32_t pos);
  static std::vector<std::int64_t> Build(std::vector<std::int64_t> values);
  void Renumber();

  std::vector<std::int64_t> tree_[2];  // Fenwick per class, 1-based; [0] unused; tree_[1] empty until used
  std::uint32_t now_ = 0;              // latest position used
  std::int64_t total_ = 0;
  std::int64_t class_total_[2] = {0, 0};
  std::unordered_map<std::uint64_t, Slot> slots_;
};

}  // namespace epd
