// src/worker/batch_output.h (internal to epd::worker): checks a tower batch's
// output and cuts it into one Embedding per item.
//
// A batch output holds the rows of every item that decoded, in batch order
// (epd/core/vision_tower.h). CheckOutput decides whether it can be used at all; a
// BatchOutputReader then hands out each item's rows as an Embedding that owns
// them: copied out of host output (never a view into the batch output, which
// the tower may reuse), or adopted by the worker's adopt_device_rows hook for
// device output. AdoptRows fences that hook: its exceptions and malformed
// results become the item's status.
//
// Thread safety: thread-compatible; the worker calls them on its owning
// thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "epd/core/embedding.h"
#include "epd/core/status.h"
#include "epd/core/vision_tower.h"

namespace epd::internal {

using AdoptDeviceRowsFn = std::function<StatusOr<EmbeddingPtr>(const DeviceRows&)>;

// OK when `out` is a well-formed output of `tower` for `items` items of
// `tokens` post-merge tokens in total; else the kInternal error that fails
// the batch (the tower's error, a wrong row count, a shape other than the
// tower declares, byte sizes that disagree with the shape, or device output
// with a null pointer or no adopt hook: `can_adopt` false).
Status CheckOutput(const StatusOr<TowerOutput>& out, std::int64_t items, std::int64_t tokens, const VisionTower& tower,
                   bool can_adopt);

// `adopt(rows)` behind a fence: its errors, exceptions, a null result or one
// whose shape, grid or byte count differs from `rows` become the item's status
// (kInternal, or the hook's own status).
StatusOr<EmbeddingPtr> AdoptRows(const AdoptDeviceRowsFn& adopt, const DeviceRows& rows);

// Walks a batch output that passed CheckOutput, item by item in batch order.
// `out` and `adopt` must outlive the reader.
class BatchOutputReader {
 public:
  BatchOutputReader(const TowerOutput& out, const AdoptDeviceRowsFn& adopt) : out_(out), adopt_(adopt) {}

  // The next item's `tokens` rows as an Embedding of its own (host output:
  // a copy, charged exactly main + deepstack bytes; device output: what
  // AdoptRows gives), carrying the item's patch `grid`. The rows are
  // consumed even when adoption fails.
  StatusOr<EmbeddingPtr> Next(const GridTHW& grid, std::int64_t tokens);

 private:
  const TowerOutput& out_;
  const AdoptDeviceRowsFn& adopt_;
  std::size_t main_off_ = 0;  // bytes of `main` consumed so far
  std::size_t deep_off_ = 0;  // bytes of `deepstack` consumed so far
};

}  // namespace epd::internal
