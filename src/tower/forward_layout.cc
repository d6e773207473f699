// The host-side layout of a Qwen-VL tower forward (forward_layout.h).
#include "forward_layout.h"

#include <algorithm>
#include <cstddef>

namespace epd::internal {
namespace {

AttentionLayout MakeAttentionLayout(std::vector<Segment> segments) {
  AttentionLayout a;
  a.cu_seqlens.reserve(segments.size() + 1);
  a.cu_seqlens.push_back(0);
  for (const Segment& s : segments) {
    a.cu_seqlens.push_back(a.cu_seqlens.back() + s.length);
    a.max_length = std::max(a.max_length, s.length);
  }
  a.groups = GroupSegments(segments);
  a.segments = std::move(segments);
  return a;
}

// (row, column) of every patch in processor order: per frame, merge blocks in
// raster order, the m x m patches of a block in raster order.
std::vector<std::int32_t> RasterPositions(std::span<const GridTHW> grids, std::int64_t m, std::int64_t patches) {
  std::vector<std::int32_t> pos;
  pos.reserve(static_cast<std::size_t>(patches * 2));
  for (const GridTHW& g : grids) {
    for (std::int64_t t = 0; t < g.t; ++t) {
      for (std::int64_t by = 0; by < g.h / m; ++by) {
        for (std::int64_t bx = 0; bx < g.w / m; ++bx) {
          for (std::int64_t iy = 0; iy < m; ++iy) {
            for (std::int64_t ix = 0; ix < m; ++ix) {
              pos.push_back(static_cast<std::int32_t>(by * m + iy));
              pos.push_back(static_cast<std::int32_t>(bx * m + ix));
            }
          }
        }
      }
    }
  }
  return pos;
}

// Qwen2.5-VL's window order of the merge blocks and the window segments in
// that order (in patches): a window is vm x vm merge blocks, windows tile
// each frame in raster order, blocks within a window in raster order.
void Windows(std::span<const GridTHW> grids, std::int64_t m, std::int64_t vm, std::vector<std::int64_t>* order,
             std::vector<Segment>* segments) {
  const std::int64_t unit = m * m;
  std::int64_t base = 0;   // first merge block of the frame
  std::int64_t start = 0;  // first row of the next window
  for (const GridTHW& g : grids) {
    const std::int64_t bh = g.h / m;
    const std::int64_t bw = g.w / m;
    for (std::int64_t t = 0; t < g.t; ++t, base += bh * bw) {
      for (std::int64_t wy = 0; wy < bh; wy += vm) {
        for (std::int64_t wx = 0; wx < bw; wx += vm) {
          const std::int64_t y_end = std::min(wy + vm, bh);
          const std::int64_t x_end = std::min(wx + vm, bw);
          for (std::int64_t y = wy; y < y_end; ++y) {
            for (std::int64_t x = wx; x < x_end; ++x) order->push_back(base + y * bw + x);
          }
          const std::int64_t n = (y_end - wy) * (x_end - wx) * unit;
          segments->push_back({start, n});
          start += n;
        }
      }
    }
  }
}

}  // namespace

std::vector<SegmentGroup> GroupSegments(const std::vector<Segment>& segments) {
  std::vector<SegmentGroup> groups;
  std::vector<std::vector<const Segment*>> members;
  for (const Segment& s : segments) {
    const auto it =
        std::find_if(groups.begin(), groups.end(), [&](const SegmentGroup& g) { return g.length == s.length; });
    const auto k = static_cast<std::size_t>(it - groups.begin());
    if (it == groups.end()) {
      groups.emplace_back().length = s.length;
      members.emplace_back();
    }
    members[k].push_back(&s);
  }
  for (std::size_t k = 0; k < groups.size(); ++k) {
    SegmentGroup& g = groups[k];
    g.count = static_cast<std::int64_t>(members[k].size());
    bool contiguous = true;
    for (std::size_t i = 1; i < members[k].size(); ++i) {
      contiguous = contiguous && members[k][i]->begin == members[k][i - 1]->begin + g.length;
    }
    if (contiguous) {
      g.begin = members[k].front()->begin;
      continue;
    }
    g.rows.reserve(static_cast<std::size_t>(g.count * g.length));
    for (const Segment* s : members[k]) {
      for (std::int64_t r = 0; r < g.length; ++r) g.rows.push_back(s->begin + r);
    }
  }
  return groups;
}

ForwardLayout BuildForwardLayout(std::span<const GridTHW> grids, std::int64_t merge_size, std::int64_t window_blocks) {
  ForwardLayout layout;
  std::vector<Segment> frames;
  for (const GridTHW& g : grids) {
    for (std::int64_t t = 0; t < g.t; ++t) {
      frames.push_back({layout.patches, g.h * g.w});
      layout.patches += g.h * g.w;
    }
  }
  layout.frames = MakeAttentionLayout(std::move(frames));
  std::vector<std::int32_t> raster = RasterPositions(grids, merge_size, layout.patches);
  if (window_blocks <= 0) {
    layout.positions = std::move(raster);
    return layout;
  }
  std::vector<Segment> windows;
  Windows(grids, merge_size, window_blocks, &layout.window_order, &windows);
  layout.windows = MakeAttentionLayout(std::move(windows));
  layout.window_inverse.resize(layout.window_order.size());
  for (std::size_t i = 0; i < layout.window_order.size(); ++i) {
    layout.window_inverse[static_cast<std::size_t>(layout.window_order[i])] = static_cast<std::int64_t>(i);
  }
  // The positions move with their merge blocks: 2 * m^2 entries per block.
  const std::size_t unit = static_cast<std::size_t>(2 * merge_size * merge_size);
  layout.positions.resize(raster.size());
  for (std::size_t i = 0; i < layout.window_order.size(); ++i) {
    const auto src =
        raster.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(layout.window_order[i]) * unit);
    std::copy(src, src + static_cast<std::ptrdiff_t>(unit),
              layout.positions.begin() + static_cast<std::ptrdiff_t>(i * unit));
  }
  return layout;
}

}  // namespace epd::internal
