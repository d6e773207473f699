// HashRing (epd/l3/l3_ring.h). Points are sorted by position, ties (two 64-bit
// hashes equal: practically never) broken by shard name, so the ring does
// not depend on the order the names were listed in.
#include "epd/l3/l3_ring.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "epd/core/status.h"

namespace epd {

HashRing::HashRing(std::vector<std::string> names, int virtual_nodes) : names_(std::move(names)) {
  if (names_.empty()) throw Error(StatusCode::kInvalidArgument, "HashRing needs at least one shard");
  if (virtual_nodes <= 0) throw Error(StatusCode::kInvalidArgument, "HashRing needs virtual_nodes > 0");
  points_.reserve(names_.size() * static_cast<std::size_t>(virtual_nodes));
  for (std::size_t s = 0; s < names_.size(); ++s) {
    for (int i = 0; i < virtual_nodes; ++i) {
      const std::string point = names_[s] + "#" + std::to_string(i);
      points_.emplace_back(XXH3_64bits(point.data(), point.size()), s);
    }
  }
  std::sort(points_.begin(), points_.end(), [this](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : names_[a.second] < names_[b.second];
  });
}

std::size_t HashRing::ShardFor(const ContentKey& key) const {
  std::uint64_t pos = 0;
  for (int i = 7; i >= 0; --i) pos = (pos << 8) | key.bytes[static_cast<std::size_t>(i)];
  auto it = std::lower_bound(points_.begin(), points_.end(), pos,
                             [](const auto& point, std::uint64_t p) { return point.first < p; });
  if (it == points_.end()) it = points_.begin();
  return it->second;
}

}  // namespace epd
