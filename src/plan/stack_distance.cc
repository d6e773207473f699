// See epd/plan/stack_distance.h. Invariant: tree_[c] holds, at each live
// class-c key's position, that key's current bytes and 0 everywhere else, so
// Prefix(tree_[c], p) is the bytes of the class-c keys last accessed at or
// before p. tree_[1] stays empty until a class-1 key arrives.
#include "epd/plan/stack_distance.h"

#include <algorithm>
#include <utility>

namespace epd {

ByteStackDistance::ByteStackDistance(std::size_t positions) {
  tree_[0].assign(std::max<std::size_t>(positions, 16) + 1, 0);
  slots_.reserve(std::min<std::size_t>(positions, std::size_t{1} << 20));
}

void ByteStackDistance::Add(std::vector<std::int64_t>& tree, std::uint32_t pos, std::int64_t delta) {
  for (std::size_t i = pos; i < tree.size(); i += i & (~i + 1)) tree[i] += delta;
}

std::int64_t ByteStackDistance::Prefix(const std::vector<std::int64_t>& tree, std::uint32_t pos) {
  std::int64_t sum = 0;
  for (std::size_t i = pos; i > 0; i -= i & (~i + 1)) sum += tree[i];
  return sum;
}

// Linear-time Fenwick build: push each node's sum into its parent.
std::vector<std::int64_t> ByteStackDistance::Build(std::vector<std::int64_t> values) {
  const std::size_t size = values.size() - 1;
  for (std::size_t i = 1; i <= size; ++i) {
    const std::size_t parent = i + (i & (~i + 1));
    if (parent <= size) values[parent] += values[i];
  }
  return values;
}

void ByteStackDistance::Renumber() {
  std::vector<std::pair<std::uint32_t, Slot*>> live;
  live.reserve(slots_.size());
  for (auto& [key, slot] : slots_) live.emplace_back(slot.pos, &slot);
  std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const std::size_t size = std::max<std::size_t>(2 * live.size() + 16, tree_[0].size() - 1);
  std::vector<std::int64_t> values[2];
  values[0].assign(size + 1, 0);
  if (!tree_[1].empty()) values[1].assign(size + 1, 0);
  for (std::size_t i = 0; i < live.size(); ++i) {
    Slot& s = *live[i].second;
    s.pos = static_cast<std::uint32_t>(i + 1);
    values[s.cls][i + 1] = s.bytes;
  }
  for (int c = 0; c < 2; ++c) {
    if (!values[c].empty()) tree_[c] = Build(std::move(values[c]));
  }
  now_ = static_cast<std::uint32_t>(live.size());
}

ByteStackDistance::Split ByteStackDistance::AccessSplit(std::uint64_t key, std::int64_t bytes, int cls) {
  if (now_ + 1 >= tree_[0].size()) Renumber();
  if (cls == 1 && tree_[1].empty()) tree_[1].assign(tree_[0].size(), 0);
  auto [it, fresh] = slots_.try_emplace(key, Slot{0, static_cast<std::uint32_t>(cls), 0});
  Split out;
  Slot& s = it->second;
  if (!fresh) {
    out.cold = false;
    for (int c = 0; c < 2; ++c) {
      if (!tree_[c].empty()) out.above[c] = class_total_[c] - Prefix(tree_[c], s.pos);
    }
    Add(tree_[s.cls], s.pos, -s.bytes);
    class_total_[s.cls] -= s.bytes;
    total_ -= s.bytes;
  }
  s.pos = ++now_;
  s.bytes = bytes;
  Add(tree_[s.cls], now_, bytes);
  class_total_[s.cls] += bytes;
  total_ += bytes;
  return out;
}

std::int64_t ByteStackDistance::Access(std::uint64_t key, std::int64_t bytes) {
  const Split d = AccessSplit(key, bytes, 0);
  return d.cold ? kCold : d.above[0] + d.above[1] + bytes;
}

void ByteStackDistance::Forget(std::uint64_t key) {
  auto it = slots_.find(key);
  if (it == slots_.end()) return;
  const Slot& s = it->second;
  Add(tree_[s.cls], s.pos, -s.bytes);
  class_total_[s.cls] -= s.bytes;
  total_ -= s.bytes;
  slots_.erase(it);
}

std::size_t ByteStackDistance::memory_bytes() const {
  // A node (next pointer, key, slot) and its malloc header, plus a bucket.
  constexpr std::size_t kNode = 8 + sizeof(std::uint64_t) + sizeof(Slot) + 16;
  return (tree_[0].capacity() + tree_[1].capacity()) * sizeof(std::int64_t) + slots_.size() * kNode +
         slots_.bucket_count() * sizeof(void*);
}

}  // namespace epd
