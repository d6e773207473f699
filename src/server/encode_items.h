// src/server/encode_items.h (internal): one EncodeItem message as the
// worker's EncodeItemInput, for every RPC that takes an Encode's request
// (Encode, Probe), so the two read an item the same way.
//
// Thread safety: pure; thread-safe.
#pragma once

#include "epd/media/video.h"
#include "epd/v1/encoder.pb.h"
#include "epd/worker/encode_request.h"

namespace epd::internal {

// The item's bytes move out of `item` (a request's bytes are then held
// once). A video item (`video` or `video_frames`) gets its sampling from
// `sampling` with every field left 0 taking `defaults`; an image keeps
// `image`, and `caller_key` when non-empty. REQUIRES: the request passed
// EncodeServer::Impl::Validate (an item is one kind).
EncodeItemInput ItemFromProto(v1::EncodeItem&& item, const VideoSampling& defaults);

}  // namespace epd::internal
