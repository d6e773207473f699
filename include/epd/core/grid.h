// epd/core/grid.h: the (t, h, w) patch grid of one visual item, Qwen2-VL style.
//
// t counts temporal patches (1 for a still image, whose frame is repeated to
// fill the temporal patch of 2), h and w count 14x14 patches. The merger folds
// each merge x merge (2x2) block of patches into one post-merge token, so
//   patches = t * h * w,   tokens = t * h * w / (merge * merge).
// Source: the Qwen2-VL image processor and vision merger (Qwen2-VL report,
// arXiv:2409.12191, section 2.1).
#pragma once

#include <cstdint>
#include <string>

namespace epd {

struct GridTHW {
  std::int64_t t = 0;
  std::int64_t h = 0;
  std::int64_t w = 0;

  std::int64_t patches() const { return t * h * w; }
  // Post-merge tokens; h and w are multiples of merge_size for valid grids.
  std::int64_t tokens(std::int64_t merge_size = 2) const { return t * h * w / (merge_size * merge_size); }
  // False for the default {0, 0, 0}, which stands for "not recorded" (e.g.
  // an embedding read from a file written before grids were kept).
  bool known() const { return t > 0 && h > 0 && w > 0; }
  // "(t, h, w)", the form every message that names a grid uses.
  std::string ToString() const {
    return "(" + std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(w) + ")";
  }

  friend bool operator==(const GridTHW&, const GridTHW&) = default;
};

}  // namespace epd
