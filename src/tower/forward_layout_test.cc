// The host-side layout of a tower forward (forward_layout.h) and its cache.
// Expected values are worked out here from the definitions (frame sizes,
// window tiling, raster order), not from the code under test.
#include "forward_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

namespace epd::internal {
namespace {

TEST(ForwardLayoutTest, FramesGiveCuSeqlensPerFrameOfEachItem) {
  // (1, 4, 6): one frame of 24 patches; (2, 4, 4): two frames of 16.
  const std::vector<GridTHW> grids = {{1, 4, 6}, {2, 4, 4}};
  const ForwardLayout l = BuildForwardLayout(grids, 2, 0);
  EXPECT_EQ(l.patches, 56);
  EXPECT_EQ(l.frames.cu_seqlens, (std::vector<std::int64_t>{0, 24, 40, 56}));
  EXPECT_EQ(l.frames.max_length, 24);
  EXPECT_TRUE(l.windows.segments.empty());
  EXPECT_TRUE(l.window_order.empty());
  // Groups by length, first appearance first: 24 at row 0; the two 16s are adjacent.
  ASSERT_EQ(l.frames.groups.size(), 2u);
  EXPECT_EQ(l.frames.groups[0].length, 24);
  EXPECT_EQ(l.frames.groups[0].begin, 0);
  EXPECT_EQ(l.frames.groups[1].length, 16);
  EXPECT_EQ(l.frames.groups[1].count, 2);
  EXPECT_EQ(l.frames.groups[1].begin, 24);
  EXPECT_TRUE(l.frames.groups[1].rows.empty());
}

TEST(ForwardLayoutTest, RasterPositionsFollowMergeBlocks) {
  // Grid 1 x 4 x 6, m = 2: block (by, bx) holds rows 4 * (by * 3 + bx) + (iy * 2 + ix).
  const std::vector<GridTHW> grids = {{1, 4, 6}};
  const ForwardLayout l = BuildForwardLayout(grids, 2, 0);
  ASSERT_EQ(l.positions.size(), 48u);
  for (int by = 0; by < 2; ++by) {
    for (int bx = 0; bx < 3; ++bx) {
      for (int iy = 0; iy < 2; ++iy) {
        for (int ix = 0; ix < 2; ++ix) {
          const int r = 4 * (by * 3 + bx) + iy * 2 + ix;
          const auto row = static_cast<std::size_t>(r);
          EXPECT_EQ(l.positions[2 * row], 2 * by + iy) << row;
          EXPECT_EQ(l.positions[2 * row + 1], 2 * bx + ix) << row;
        }
      }
    }
  }
}

TEST(ForwardLayoutTest, WindowsTileEachFrameAndCutTheEdges) {
  // Qwen2.5-VL: 18 x 22 patches = 9 x 11 merge blocks, windows of 4 x 4 blocks.
  const std::vector<GridTHW> grids = {{1, 18, 22}, {1, 8, 8}};
  const std::int64_t m = 2;
  const std::int64_t vm = 4;
  const ForwardLayout l = BuildForwardLayout(grids, m, vm);
  // Brute force: each merge block's window (row-major over windows), per item.
  std::vector<std::int64_t> want_sizes;
  std::vector<std::int64_t> want_order;
  std::int64_t base = 0;
  for (const GridTHW& g : grids) {
    const std::int64_t bh = g.h / m;
    const std::int64_t bw = g.w / m;
    std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::int64_t>> members;  // ordered (wy, wx)
    for (std::int64_t y = 0; y < bh; ++y) {
      for (std::int64_t x = 0; x < bw; ++x) members[{y / vm, x / vm}].push_back(base + y * bw + x);
    }
    for (const auto& [w, blocks] : members) {
      want_sizes.push_back(static_cast<std::int64_t>(blocks.size()) * m * m);
      want_order.insert(want_order.end(), blocks.begin(), blocks.end());
    }
    base += bh * bw;
  }
  // 3 x 3 windows of sides {4, 4, 1} x {4, 4, 3} blocks, then one full 4 x 4 window.
  EXPECT_EQ(want_sizes, (std::vector<std::int64_t>{64, 64, 48, 64, 64, 48, 16, 16, 12, 64}));
  std::vector<std::int64_t> got_sizes;
  for (const Segment& s : l.windows.segments) got_sizes.push_back(s.length);
  EXPECT_EQ(got_sizes, want_sizes);
  EXPECT_EQ(l.window_order, want_order);
  EXPECT_EQ(l.windows.max_length, 64);
  EXPECT_EQ(l.windows.cu_seqlens.back(), l.patches);
  // The inverse undoes the order.
  ASSERT_EQ(l.window_inverse.size(), l.window_order.size());
  for (std::size_t i = 0; i < l.window_order.size(); ++i) {
    EXPECT_EQ(l.window_inverse[static_cast<std::size_t>(l.window_order[i])], static_cast<std::int64_t>(i));
  }
  // Frames are untouched by the permutation: one segment per item.
  EXPECT_EQ(l.frames.cu_seqlens, (std::vector<std::int64_t>{0, 396, 460}));
  // Positions move with their blocks: row r is patch (r % 4) of block order[r / 4].
  for (std::size_t r = 0; r < static_cast<std::size_t>(l.patches); ++r) {
    std::int64_t block = l.window_order[r / 4];
    std::int64_t bw = 11;
    if (block >= 99) {  // the second item
      block -= 99;
      bw = 4;
    }
    const std::int64_t within = static_cast<std::int64_t>(r % 4);
    EXPECT_EQ(l.positions[2 * r], (block / bw) * 2 + within / 2) << r;
    EXPECT_EQ(l.positions[2 * r + 1], (block % bw) * 2 + within % 2) << r;
  }
  // Length groups: 64 (windows 0, 1, 3, 4 of item 0 and item 1's: not one
  // run), 48, 16 (adjacent), 12.
  ASSERT_EQ(l.windows.groups.size(), 4u);
  const SegmentGroup& g64 = l.windows.groups[0];
  EXPECT_EQ(g64.length, 64);
  EXPECT_EQ(g64.count, 5);
  EXPECT_EQ(g64.begin, -1);
  ASSERT_EQ(g64.rows.size(), 5u * 64u);
  EXPECT_EQ(g64.rows[64], 64);             // the second window starts at row 64
  EXPECT_EQ(g64.rows[128], 64 + 64 + 48);  // the third 64 follows the first 48
  EXPECT_EQ(l.windows.groups[2].length, 16);
  EXPECT_EQ(l.windows.groups[2].begin, 64 * 4 + 48 * 2);
}

TEST(GridListCacheTest, CountsHitsMissesAndEvictsTheLeastRecentlyUsed) {
  GridListCache<const std::string> cache(2);
  const std::vector<GridTHW> a = {{1, 4, 4}};
  const std::vector<GridTHW> b = {{1, 4, 4}, {1, 4, 4}};
  const std::vector<GridTHW> c = {{2, 4, 4}};
  const auto ka = cache.MakeKey(a);
  const auto kb = cache.MakeKey(b);
  const auto kc = cache.MakeKey(c);
  EXPECT_NE(ka, kb);  // the batch size is part of the key
  EXPECT_EQ(cache.Find(ka), nullptr);
  cache.Insert(ka, std::make_shared<const std::string>("a"));
  cache.Insert(kb, std::make_shared<const std::string>("b"));
  ASSERT_NE(cache.Find(ka), nullptr);  // a is now the most recent
  EXPECT_EQ(*cache.Find(ka), "a");
  cache.Insert(kc, std::make_shared<const std::string>("c"));  // evicts b
  EXPECT_EQ(cache.Find(kb), nullptr);
  EXPECT_EQ(*cache.Find(kc), "c");
  // hits, misses, evictions, size, capacity.
  EXPECT_EQ(cache.stats(), (GridCacheStats{3, 2, 1, 2, 2}));
}

TEST(GridListCacheTest, CapacityZeroCachesNothing) {
  GridListCache<const int> cache(0);
  const auto k = cache.MakeKey(std::vector<GridTHW>{{1, 2, 2}});
  cache.Insert(k, std::make_shared<const int>(1));
  EXPECT_EQ(cache.Find(k), nullptr);
  EXPECT_EQ(cache.stats().size, 0);
  EXPECT_EQ(cache.stats().misses, 1);
}

}  // namespace
}  // namespace epd::internal
