// epd/core/internal/gdsf_heap.h (internal): the eviction order of GreedyDual-Size-Frequency, an
// indexed binary min-heap of entry ids keyed by (priority, sequence).
//
// GDSF (L. Cherkasova, "Improving WWW Proxies Performance with
// Greedy-Dual-Size-Frequency Caching Policy", HP Labs HPL-98-69, 1998; Squid's
// `heap GDSF` replacement policy) gives each entry
//     priority = clock + frequency x cost / size
// and evicts the entry of lowest priority; the cache's clock then becomes
// that victim's priority, so every entry still resident has aged relative to
// newcomers without being touched. GdsfPolicy (epd/core/internal/gdsf_policy.h)
// owns the clock and the formula; this heap only orders ids.
//
// Ties: equal priorities are ordered by sequence, lowest (oldest touch)
// first, so the order is a pure function of the calls, never of addresses.
//
// Ids are small dense integers (slab indices), at most 2^32 - 2; the heap
// keeps each id's position in a vector indexed by id, so Update and Erase find
// it in O(1) and move it in O(log n).
//
// Complexity: Push, Update, Erase and PopMin O(log n); Min and SecondMin O(1).
// Memory: 24 bytes per node plus 4 bytes per id ever used.
// Thread safety: thread-compatible.
//
// Example:
//   GdsfHeap h;
//   h.Push(7, /*priority=*/1.5, /*seq=*/1);
//   h.Push(3, 0.5, 2);
//   h.Min().id;    // 3
//   h.Update(3, 2.0, 3);
//   h.Min().id;    // 7
#pragma once

#include <cassert>
#include <cstdint>
#include <utility>
#include <vector>

namespace epd::internal {

class GdsfHeap {
 public:
  struct Node {
    double priority;
    std::uint64_t seq;
    std::uint32_t id;
  };

  bool empty() const { return nodes_.empty(); }
  std::size_t size() const { return nodes_.size(); }
  bool contains(std::uint32_t id) const { return id < pos_.size() && pos_[id] != kAbsent; }

  // REQUIRES: !contains(id).
  void Push(std::uint32_t id, double priority, std::uint64_t seq) {
    if (id >= pos_.size()) pos_.resize(static_cast<std::size_t>(id) + 1, kAbsent);
    assert(pos_[id] == kAbsent);
    nodes_.push_back(Node{priority, seq, id});
    pos_[id] = static_cast<std::uint32_t>(nodes_.size() - 1);
    SiftUp(nodes_.size() - 1);
  }

  // Re-keys `id`. REQUIRES: contains(id).
  void Update(std::uint32_t id, double priority, std::uint64_t seq) {
    const std::size_t i = pos_[id];
    const bool up = Less(Node{priority, seq, id}, nodes_[i]);
    nodes_[i].priority = priority;
    nodes_[i].seq = seq;
    if (up) {
      SiftUp(i);
    } else {
      SiftDown(i);
    }
  }

  // REQUIRES: contains(id).
  void Erase(std::uint32_t id) {
    const std::size_t i = pos_[id];
    pos_[id] = kAbsent;
    const std::size_t last = nodes_.size() - 1;
    if (i != last) {
      nodes_[i] = nodes_[last];
      pos_[nodes_[i].id] = static_cast<std::uint32_t>(i);
    }
    nodes_.pop_back();
    if (i < nodes_.size()) {
      // The node moved into the hole may belong above it or below it.
      const std::uint32_t moved = nodes_[i].id;
      SiftUp(i);
      SiftDown(pos_[moved]);
    }
  }

  // The lowest (priority, seq). REQUIRES: !empty().
  const Node& Min() const { return nodes_.front(); }

  // The lowest node other than Min(): one of the root's children.
  // REQUIRES: size() >= 2.
  const Node& SecondMin() const {
    if (nodes_.size() == 2 || Less(nodes_[1], nodes_[2])) return nodes_[1];
    return nodes_[2];
  }

  // The node of `id`. REQUIRES: contains(id).
  const Node& node(std::uint32_t id) const { return nodes_[pos_[id]]; }

  // Every node, in heap (not sorted) order.
  const std::vector<Node>& nodes() const { return nodes_; }

  std::size_t memory_bytes() const {
    return nodes_.capacity() * sizeof(Node) + pos_.capacity() * sizeof(std::uint32_t);
  }

  static bool Less(const Node& a, const Node& b) {
    return a.priority < b.priority || (a.priority == b.priority && a.seq < b.seq);
  }

 private:
  static constexpr std::uint32_t kAbsent = 0xffffffffu;

  void Place(std::size_t i, const Node& n) {
    nodes_[i] = n;
    pos_[n.id] = static_cast<std::uint32_t>(i);
  }

  void SiftUp(std::size_t i) {
    const Node n = nodes_[i];
    while (i > 0) {
      const std::size_t parent = (i - 1) / 2;
      if (!Less(n, nodes_[parent])) break;
      Place(i, nodes_[parent]);
      i = parent;
    }
    Place(i, n);
  }

  void SiftDown(std::size_t i) {
    const Node n = nodes_[i];
    const std::size_t size = nodes_.size();
    for (;;) {
      std::size_t child = 2 * i + 1;
      if (child >= size) break;
      if (child + 1 < size && Less(nodes_[child + 1], nodes_[child])) ++child;
      if (!Less(nodes_[child], n)) break;
      Place(i, nodes_[child]);
      i = child;
    }
    Place(i, n);
  }

  std::vector<Node> nodes_;
  std::vector<std::uint32_t> pos_;  // id -> index in nodes_, kAbsent when not held
};

}  // namespace epd::internal
