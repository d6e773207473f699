// epd/server/request_shape.h: the rules on a request's shape that every front
// of an EncodeServer applies before anything is admitted or queued.
//
// One function, CheckRequestShape, holds them, so the gRPC Encode method and
// the OpenAI-compatible HTTP front (epd/openai/openai_front.h) refuse the same
// requests with the same messages; each front only translates the status
// (gRPC code, HTTP status). The rules, in the order checked:
//   - size: a message of more than max_request_bytes (kResourceExhausted);
//   - count: no items, or more than max_items_per_request (kInvalidArgument);
//   - kinds: each item is an image (bytes or a caller key) or a video
//     (container bytes or a non-empty frame list), never both, never none
//     (kInvalidArgument naming the item's index);
//   - request id: a client's id is 1..256 bytes of printable ASCII and does
//     not use the prefix of ids the server assigns (kInvalidArgument).
// Rules that need the worker (expected tokens, a bad image, a queue bound)
// are the worker's, per item (epd/worker/encode_worker.h).
//
// Complexity: O(items + id length). Thread safety: a pure function.
//
// Example:
//   epd::RequestShape shape;
//   shape.items.push_back(epd::ItemShape{.image = true});
//   epd::Status s = epd::CheckRequestShape(shape, {.max_items = 256});
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "epd/core/status.h"

namespace epd {

// Which fields one item sets (what it carries, not the bytes themselves).
struct ItemShape {
  bool image = false;            // image bytes (or a URL a front resolves to them)
  bool caller_key = false;       // a key this server has cached
  bool video = false;            // container bytes (or a URL a front resolves to them)
  bool video_frames = false;     // a frame list, possibly empty
  std::int64_t frame_count = 0;  // frames in that list
};

struct RequestShape {
  std::string id;                   // the client's request id; empty = the server assigns one
  std::int64_t message_bytes = -1;  // the request's size on the wire; -1 = bounded by the front itself
  std::vector<ItemShape> items;
};

// The limits the rules apply (ServerOptions' fields of the same names).
struct RequestShapeLimits {
  std::int64_t max_items = 256;                             // ServerOptions::max_items_per_request
  std::int64_t max_request_bytes = std::int64_t{64} << 20;  // ServerOptions::max_request_bytes
};

// OK, or the first rule `request` breaks (see the header comment), its
// message naming what is wrong and, where one exists, the flag that raises
// the limit.
Status CheckRequestShape(const RequestShape& request, const RequestShapeLimits& limits);

}  // namespace epd
