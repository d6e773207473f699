// CheckRequestShape (epd/server/request_shape.h): the request-shape rules of
// every front, with one message each.
#include "epd/server/request_shape.h"

#include <string>

#include "request_id.h"

namespace epd {
namespace {

Status CheckItemKind(const ItemShape& item, std::size_t index) {
  const std::string at = "item " + std::to_string(index);
  const bool is_video = item.video || item.video_frames;
  if (is_video) {
    if (item.image || item.caller_key || (item.video && item.video_frames)) {
      return InvalidArgument(at +
                             " mixes kinds: a video item sets exactly one of `video` and `video_frames`, "
                             "and neither `image` nor `caller_key`");
    }
    if (item.video_frames && item.frame_count == 0) return InvalidArgument(at + " has `video_frames` without frames");
  } else if (!item.image && !item.caller_key) {
    return InvalidArgument(at +
                           " is empty: set `image` to JPEG or PNG bytes, `caller_key` to a key "
                           "this server has cached, or `video` / `video_frames`");
  }
  return Status::Ok();
}

}  // namespace

Status CheckRequestShape(const RequestShape& request, const RequestShapeLimits& limits) {
  if (request.message_bytes > limits.max_request_bytes) {
    return ResourceExhausted("the request is " + std::to_string(request.message_bytes) +
                             " bytes; this server accepts at most " + std::to_string(limits.max_request_bytes) +
                             " (split it, or raise --max-request-mb)");
  }
  const auto n = static_cast<std::int64_t>(request.items.size());
  if (n == 0) return InvalidArgument("the request has no items; send at least one image");
  if (n > limits.max_items) {
    return InvalidArgument("the request has " + std::to_string(n) + " items; this server accepts at most " +
                           std::to_string(limits.max_items) +
                           " per request (split it, or raise --max-items-per-request)");
  }
  for (std::size_t i = 0; i < request.items.size(); ++i) {
    if (Status s = CheckItemKind(request.items[i], i); !s.ok()) return s;
  }
  return internal::CheckClientRequestId(request.id);
}

}  // namespace epd
