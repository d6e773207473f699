// src/worker/adopt_check.h (internal to epd::worker): the check every value
// adopted from outside the process (the shared tier's L3 values, handed in as
// EncodeItemInput::ready) must pass before it is cached or served (issue 27,
// fault 3).
//
// What the request predicts (AdoptExpectation): the post-merge tokens
// (expected_tokens, else the header's count) and, when the item carries
// media, the grid (t, h, w) the header probe gives. What the tower predicts:
// the width (hidden), dtype and deepstack layers (VisionTower::OutputShape).
// A value passes only when it matches all of them, its grid is not
// degenerate and gives its tokens at the worker's merge size, its byte count
// is what its shape implies, and (for host bytes) every main and deepstack
// element is finite. A value from another configuration (another hidden
// size, another merge) fails even when it is authentic under the cluster key:
// authenticity says who wrote it, not that it fits this request.
//
// Complexity: O(1) for the shape, one pass over the bytes for finiteness.
// Thread safety: pure; thread-safe.
#pragma once

#include <cstdint>
#include <optional>

#include "epd/core/embedding.h"
#include "epd/core/grid.h"
#include "epd/core/status.h"
#include "epd/core/vision_tower.h"

namespace epd::internal {

struct AdoptExpectation {
  // Post-merge tokens the item must have; 0 = unknown (a caller key sent
  // without media or expected_tokens): the value's own count, checked
  // against its grid.
  std::int64_t tokens = 0;
  // The header probe's grid; nullopt when the item has no readable header.
  std::optional<GridTHW> grid;
};

// OK, or kDataLoss naming the first check `e` fails (grid, tokens, hidden,
// dtype, deepstack layers, byte count, non-finite rows), e.g. "the shared
// tier's value has grid (1, 8, 16), the image's header gives (1, 16, 8)".
// A device-resident `e` is checked for its shape only.
Status CheckAdoptedValue(const Embedding& e, const AdoptExpectation& want, const VisionTower& tower,
                         std::int64_t merge_size);

}  // namespace epd::internal
