// See epd/worker/item_probe.h. Why the probe reuses the worker's own rules
// rather than computing keys and grids afresh: a router that counts tokens
// or routes by a probe's answer must see exactly what an encode of the same
// bytes will key and produce, so the key is KeysFor's (the one place the
// tenant namespace is applied) and the image grid HeaderProbe's (the grid an
// encode checks expected_tokens and hits against).
#include "epd/worker/item_probe.h"

#include <span>

#include "item_rules.h"
#include "video_items.h"

namespace epd {
namespace {

// A frame list's grid: SampleFrameList's arithmetic on the first frame's
// displayed size, without decoding any frame.
StatusOr<GridTHW> FrameListGrid(const WorkerOptions& o, const VideoInput& video) {
  const PreprocessConfig& cfg = o.preprocess;
  StatusOr<ProbedGrid> first = ProbeGrid(video.frames.front().span(), cfg, o.limits);
  if (!first.ok()) return InvalidArgument("video frame 0 does not decode: " + first.status().message());
  const std::int64_t t = cfg.temporal_patch_size;
  const auto count = static_cast<std::int64_t>(video.frames.size());
  const std::int64_t padded = (count + t - 1) / t * t;
  const bool apply = cfg.decode.apply_exif_orientation;
  StatusOr<ResizedSize> size = VideoFrameSize(first->info.DisplayHeight(apply), first->info.DisplayWidth(apply), padded,
                                              internal::SamplingFor(o, video), cfg);
  if (!size.ok()) return size.status();
  return GridTHW{padded / t, size->height / cfg.patch_size, size->width / cfg.patch_size};
}

StatusOr<GridTHW> VideoGrid(const WorkerOptions& o, const VideoInput& video) {
  if (Status s = internal::CheckBeforeDecode(o, video); !s.ok()) return s;
  if (video.container.empty()) return FrameListGrid(o, video);
  if (!o.probe_video) {
    return FailedPrecondition(
        "this server probes no video containers (no probe_video); send the video as a "
        "list of frame images");
  }
  return o.probe_video(video.container.span(), internal::SamplingFor(o, video), o.preprocess, o.video_limits);
}

// The grid of one item; {0, 0, 0} for a caller_key without media.
StatusOr<GridTHW> ItemGrid(const WorkerOptions& o, const EncodeItemInput& item) {
  if (item.is_video()) return VideoGrid(o, *item.video);
  if (item.media.empty()) return GridTHW{};
  internal::HeaderProbe header(item.media, o);
  const StatusOr<ProbedGrid>& probed = header.Get();
  if (!probed.ok()) return probed.status();
  return probed->grid;
}

// The item as the clients key it for routing: no namespace, and a video
// without sampling options keyed over VideoSampling{}.
EncodeRequest RouteRequest(const EncodeItemInput& item) {
  EncodeRequest r;
  r.items.push_back(item);
  EncodeItemInput& copy = r.items.back();
  if (copy.is_video() && !copy.video->sampling.has_value()) copy.video->sampling = VideoSampling{};
  return r;
}

bool RouteDiffers(const EncodeRequest& request, const EncodeItemInput& item) {
  return request.key_namespace.has_value() || (item.is_video() && !item.video->sampling.has_value());
}

}  // namespace

std::vector<StatusOr<ItemProbe>> ProbeItems(const WorkerOptions& options, const EncodeRequest& request) {
  const std::vector<StatusOr<ContentKey>> keys = internal::KeysFor(options, request);
  std::vector<StatusOr<ItemProbe>> out;
  out.reserve(request.items.size());
  for (std::size_t i = 0; i < request.items.size(); ++i) {
    const EncodeItemInput& item = request.items[i];
    if (!keys[i].ok()) {
      out.emplace_back(keys[i].status());
      continue;
    }
    StatusOr<GridTHW> grid = ItemGrid(options, item);
    if (!grid.ok()) {
      out.emplace_back(grid.status());
      continue;
    }
    ItemProbe p{*keys[i], *keys[i], *grid, grid->tokens(options.preprocess.merge_size)};
    if (RouteDiffers(request, item)) {
      StatusOr<ContentKey> route = internal::KeysFor(options, RouteRequest(item)).front();
      if (!route.ok()) {
        out.emplace_back(route.status());
        continue;
      }
      p.route_key = *route;
    }
    out.emplace_back(p);
  }
  return out;
}

}  // namespace epd
