// epd/worker/item_probe.h: what an encode of a request's items would key and
// produce, read from their headers without decoding a pixel (the Probe RPC
// and POST /v1/probe, docs/SERVER.md "Probe").
//
// For each item: its content key (exactly the key an encode of the same
// request uses: the worker's own KeysFor, tenant namespace included), its
// route key (the unsalted key the clients send in "x-epd-route"), its patch
// grid (t, h, w) and post-merge tokens. Routers and render tiers use it to
// count placeholder tokens and pick a server by content instead of decoding.
//
// Grid sources (each the one the encode path itself trusts):
//   image       ProbeGrid: the header's size, EXIF orientation applied when
//               preprocess.decode says so, the decode limit checked;
//   frame list  the first frame's header (as ProbeGrid, oriented) resized by
//               VideoFrameSize for the padded frame count, as SampleFrameList
//               does after decoding;
//   container   WorkerOptions::probe_video (ProbeVideo + VideoHeaderGrid):
//               exact when the container lists every frame (an MP4 sample
//               table); an estimate from duration x fps otherwise, and blind
//               to a rotation carried only in the bitstream (docs/VIDEO.md).
// An image item that names only a caller_key has no header: OK, with
// grid {0, 0, 0} and tokens 0 (its key and route key are still given).
//
// Route key: the item's key without the tenant namespace; for a video sent
// without sampling options, the key over VideoSampling{} (what EncodeClient
// and the Python client compute and send), so probe-driven routers and the
// clients route one item to one server.
//
// Errors (per item, the encode's messages): the key's (an empty caller key,
// a video carrying image bytes), ProbeGrid's (kInvalidArgument: unknown
// format, truncated header, too many pixels, aspect ratio), the video's
// sampling Validate, kFailedPrecondition for a container without
// decode_video/probe_video, ProbeVideo's header limits.
// Cost: the content key's hash over each item's bytes (as an encode pays),
// plus a header parse: O(bytes hashed), O(1) in pixels for images; a
// container's probe is a demux-only pass. Under tenant isolation each item
// is hashed twice (key and route key).
// Thread safety: pure, thread-safe; reads `options` and `request` only.
//
// Example:
//   std::vector<epd::StatusOr<epd::ItemProbe>> p = epd::ProbeItems(options, request);
//   if (p[0].ok()) route(p[0]->route_key.Hex(), p[0]->tokens);
#pragma once

#include <cstdint>
#include <vector>

#include "epd/core/content_key_type.h"
#include "epd/core/grid.h"
#include "epd/core/status.h"
#include "epd/worker/encode_request.h"
#include "epd/worker/worker_options.h"

namespace epd {

struct ItemProbe {
  ContentKey key;           // the encode's content key (namespaced under tenant isolation)
  ContentKey route_key;     // the unsalted key clients send in "x-epd-route"
  GridTHW grid;             // (t, h, w) before the merger; {0, 0, 0} = no header (caller_key only)
  std::int64_t tokens = 0;  // grid.tokens(preprocess.merge_size)
};

// One entry per request.items, in order (see the header comment).
std::vector<StatusOr<ItemProbe>> ProbeItems(const WorkerOptions& options, const EncodeRequest& request);

}  // namespace epd
