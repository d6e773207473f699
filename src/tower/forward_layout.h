// src/tower/forward_layout.h (internal to the checkpoint towers): everything
// a Qwen-VL tower forward needs to know about a batch that follows from the
// host-side grid list alone, and a bounded cache of it keyed by that list.
// No torch here: the layout is plain integers, built on the host, so the
// forward never reads a device value to learn where a segment starts.
//
// Row order of a forward: items in batch order; within an item, frame by
// frame; within a frame, merge blocks in raster order and the m x m patches
// of a block in raster order (the Qwen2-VL processor's order). With windows
// (Qwen2.5-VL), merge blocks are permuted window by window before the first
// block, so each window is one contiguous run of rows, and put back after the
// merger (modeling_qwen2_5_vl.py, get_window_index).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "epd/core/grid.h"

namespace epd::internal {

// One attention segment: rows [begin, begin + length) of the forward.
struct Segment {
  std::int64_t begin = 0;
  std::int64_t length = 0;
};

// Segments of one length, for one batched attention call. `begin` is the
// first row when the segments are one contiguous run of rows, else -1 and
// `rows` lists their rows, segment after segment (count * length entries).
struct SegmentGroup {
  std::int64_t length = 0;
  std::int64_t count = 0;
  std::int64_t begin = -1;
  std::vector<std::int64_t> rows;
};

// The attention segments of one kind (frames or windows), in row order.
struct AttentionLayout {
  std::vector<Segment> segments;
  // cu_seqlens: [segments + 1], cu_seqlens[0] = 0, cu_seqlens[i + 1] =
  // cu_seqlens[i] + segments[i].length (the flash-attention varlen contract).
  std::vector<std::int64_t> cu_seqlens;
  std::int64_t max_length = 0;
  // The segments grouped by length, in order of first appearance.
  std::vector<SegmentGroup> groups;
};

struct ForwardLayout {
  std::int64_t patches = 0;  // rows of the forward
  AttentionLayout frames;    // one segment per frame of each item
  AttentionLayout windows;   // empty unless windowed
  // Windowed only: merge blocks (units of m * m rows) in window order, a
  // permutation of [0, patches / m^2), and its inverse.
  std::vector<std::int64_t> window_order;
  std::vector<std::int64_t> window_inverse;
  // [patches * 2]: (row, column) in its frame of each row of the forward,
  // in forward order (window order when windowed): the rotary positions.
  std::vector<std::int32_t> positions;
};

// Groups `segments` by length, in order of first appearance. O(rows).
std::vector<SegmentGroup> GroupSegments(const std::vector<Segment>& segments);

// The layout of a batch of `grids` (each t, h, w >= 1, h and w multiples of
// merge_size: the tower validated them). window_blocks: the window side in
// merge blocks (window_size / patch_size / merge_size, 4 for Qwen2.5-VL),
// 0 for no window attention. Windows tile each frame from its top-left; the
// last row and column of windows are cut short when the frame is not a
// multiple of the window. O(patches).
ForwardLayout BuildForwardLayout(std::span<const GridTHW> grids, std::int64_t merge_size, std::int64_t window_blocks);

// Counters of a GridListCache.
struct GridCacheStats {
  std::int64_t hits = 0;
  std::int64_t misses = 0;
  std::int64_t evictions = 0;
  std::int64_t size = 0;
  std::int64_t capacity = 0;
  friend bool operator==(const GridCacheStats&, const GridCacheStats&) = default;
};

// A least-recently-used cache of shared values keyed by a batch's grid list
// (the exact sequence of (t, h, w)); V is const for immutable values.
// Capacity 0 caches nothing (every Find misses). An evicted value lives on
// while a holder (e.g. a captured CUDA graph) keeps it. O(log n * key
// length) per call.
// Thread-compatible (the tower calls it from its one Encode thread).
template <typename V>
class GridListCache {
 public:
  using Key = std::vector<std::int64_t>;  // t, h, w of each item

  explicit GridListCache(std::size_t capacity) : capacity_(capacity) {}

  static Key MakeKey(std::span<const GridTHW> grids) {
    Key key;
    key.reserve(grids.size() * 3);
    for (const GridTHW& g : grids) {
      key.push_back(g.t);
      key.push_back(g.h);
      key.push_back(g.w);
    }
    return key;
  }

  // The cached value for `key`, or null (a miss). Counts a hit or a miss.
  std::shared_ptr<V> Find(const Key& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) {
      ++stats_.misses;
      return nullptr;
    }
    ++stats_.hits;
    order_.splice(order_.begin(), order_, it->second);  // most recent first
    return it->second->second;
  }

  // Stores `value` under `key` (replacing any), evicting the least recently
  // used entries beyond the capacity.
  void Insert(const Key& key, std::shared_ptr<V> value) {
    if (capacity_ == 0) return;
    if (const auto it = index_.find(key); it != index_.end()) {
      order_.erase(it->second);
      index_.erase(it);
    }
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++stats_.evictions;
    }
  }

  GridCacheStats stats() const {
    GridCacheStats s = stats_;
    s.size = static_cast<std::int64_t>(order_.size());
    s.capacity = static_cast<std::int64_t>(capacity_);
    return s;
  }

 private:
  using Entry = std::pair<Key, std::shared_ptr<V>>;
  std::size_t capacity_;
  std::list<Entry> order_;
  std::map<Key, typename std::list<Entry>::iterator> index_;
  GridCacheStats stats_;
};

}  // namespace epd::internal
