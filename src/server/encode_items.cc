// See encode_items.h.
#include "encode_items.h"

#include <utility>

#include "proto_convert.h"

namespace epd::internal {

EncodeItemInput ItemFromProto(v1::EncodeItem&& item, const VideoSampling& defaults) {
  EncodeItemInput in;
  in.expected_tokens = item.expected_tokens();
  in.is_public = item.public_();
  if (!item.video().empty() || item.has_video_frames()) {
    VideoInput v;
    v.container = std::move(*item.mutable_video());
    for (std::string& f : *item.mutable_video_frames()->mutable_frames()) v.frames.emplace_back(std::move(f));
    if (item.has_sampling()) v.sampling = FromProto(item.sampling(), defaults);
    in.video = std::move(v);
    return in;
  }
  in.media = std::move(*item.mutable_image());
  if (!item.caller_key().empty()) in.caller_key = item.caller_key();
  return in;
}

}  // namespace epd::internal
