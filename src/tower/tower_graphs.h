// src/tower/tower_graphs.h (internal to the checkpoint towers; CUDA builds
// only, EPD_TOWER_CUDA): CUDA graphs of the tower forward, one per grid list
// (the (batch, grid) bucket), bounded, least recently used evicted.
//
// A forward of a small batch launches about a dozen kernels per block, so at
// batch 1-4 the host's launch rate, not the GPU, can bound it. A graph
// replays the whole forward with one launch.
//
// Protocol per grid list (key):
//   - first sight: the forward runs eagerly on a device copy of the pixels
//     (the warm-up: cuBLAS and the flash kernels initialise outside capture)
//     and its result is returned; then the same forward is captured on a side
//     stream (cudaStreamCaptureModeThreadLocal, so other threads' CUDA calls,
//     such as the GPU tier's copies, are not affected), with that device
//     copy as the graph's static input;
//   - later: the pixels are copied (asynchronously, from pinned memory) into
//     the static input and the graph is replayed on the current stream.
// A different grid list is a different key, so a change of grid or batch
// shape never replays a graph of another shape; entries beyond the capacity
// are dropped (their memory pool with them). The graph holds the
// ForwardMeta it was captured with, since its kernels read those tensors.
// If a capture fails, graphs are turned off for this tower (the reason is
// kept) and every later call runs eagerly; the failed call still returns
// its eager result.
//
// Returned tensors are the graph's static outputs on a replay: the caller
// copies them before the next Run. Thread-compatible (the tower's Encode).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "forward_layout.h"
#include "tower_model.h"

namespace epd::internal {

struct GraphStats {
  std::int64_t replays = 0;
  std::int64_t captures = 0;
  GridCacheStats cache;     // entries, evictions
  std::string disabled_by;  // "" while graphs are on
};

class TowerGraphs {
 public:
  using Forward = std::function<std::pair<Tensor, Tensor>(const Tensor& pixels)>;

  TowerGraphs(std::size_t capacity, c10::Device device);
  ~TowerGraphs();

  // See the header comment. host_pixels [patches, patch_dim] in the compute
  // dtype (pinned); `forward` runs the tower on device pixels with `meta`.
  std::pair<Tensor, Tensor> Run(const GridListCache<const ForwardMeta>::Key& key,
                                std::shared_ptr<const ForwardMeta> meta, const Tensor& host_pixels,
                                const Forward& forward);

  GraphStats stats() const;

 private:
  struct Entry;
  c10::Device device_;
  GridListCache<Entry> cache_;
  std::int64_t replays_ = 0;
  std::int64_t captures_ = 0;
  std::string disabled_by_;
};

}  // namespace epd::internal
