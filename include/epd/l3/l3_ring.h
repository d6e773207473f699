// epd/l3/l3_ring.h: consistent hashing of content keys over the shared tier's
// shards (one per --l3 URL).
//
// Each shard is placed on a 64-bit ring at `virtual_nodes` points,
// XXH3-64("<name>#<i>"); a key goes to the shard owning the first point at
// or after its position (its first 8 bytes, little-endian: the key is a
// uniform digest already), wrapping around. Adding an (N+1)-th shard
// therefore moves only the keys that land on the new shard's points, about
// 1/(N+1) of them, and removing one moves only that shard's keys; plain
// `hash % N` would move nearly all of them. With 160 points per shard each
// shard's share stays within about ±15% of 1/N (the spread of the arcs
// shrinks with the square root of the point count).
// Reference for the scheme: Karger et al., "Consistent Hashing and Random
// Trees" (STOC 1997); the 160-point default is the one ketama popularised.
//
// Complexity: construction O(N * virtual_nodes * log); ShardFor O(log(N *
// virtual_nodes)). Memory: 16 bytes per point.
// Thread safety: immutable after construction; thread-safe.
//
// Example:
//   HashRing ring({"10.0.0.1:6379/0", "10.0.0.2:6379/0"});
//   std::size_t shard = ring.ShardFor(key);   // index into the names
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "epd/core/content_key_type.h"

namespace epd {

class HashRing {
 public:
  // REQUIRES: !names.empty(), virtual_nodes > 0 (throws epd::Error otherwise).
  // A shard's placement depends only on its own name, so the same name keeps
  // its keys whatever other shards are listed, in whatever order.
  explicit HashRing(std::vector<std::string> names, int virtual_nodes = 160);

  // Index into names() of the shard holding `key`.
  std::size_t ShardFor(const ContentKey& key) const;
  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;
  std::vector<std::pair<std::uint64_t, std::size_t>> points_;  // (position, shard), sorted
};

}  // namespace epd
