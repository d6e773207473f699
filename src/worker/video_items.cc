// Video items: keys, decode into chunks, concatenation, timings.
//
// Why a chunk key over the resized pixels rather than over frame indices or
// timestamps: two clips of one video, or a stream's growing prefixes, sample
// different frame indices at different times, but where they sample the
// same frames at the same size the tower's input is identical, and only the
// pixels say so. The key covers exactly the tower's input (the frames' RGB8
// pixels after resize, plus the config that normalises them), so a chunk hit
// is exact for any tower whose temporal chunks are independent.
#include "video_items.h"

#include <cstring>
#include <string>
#include <utility>

#include "item_rules.h"

namespace epd::internal {

const VideoSampling& SamplingFor(const WorkerOptions& options, const VideoInput& video) {
  return video.sampling.has_value() ? *video.sampling : options.video_sampling;
}

namespace {

Status CheckInput(const VideoInput& video) {
  const bool has_container = !video.container.empty();
  const bool has_frames = !video.frames.empty();
  if (has_container == has_frames) {
    return InvalidArgument(has_container ? "a video item carries both container bytes and frame images; send one"
                                         : "a video item carries neither container bytes nor frame images");
  }
  return Status::Ok();
}

// The decoder's output against the SampledVideo contract (epd/media/video.h), so
// a faulty decoder fails its item rather than the tower batch.
Status CheckSampled(const SampledVideo& v, const PreprocessConfig& cfg) {
  const std::int64_t T = cfg.temporal_patch_size;
  const auto n = static_cast<std::int64_t>(v.frames.size());
  if (n == 0 || n % T != 0) {
    return InvalidArgument("the decoder gave " + std::to_string(n) + " frames, not a positive multiple of " +
                           "temporal_patch_size " + std::to_string(T));
  }
  const RgbImage& f0 = v.frames.front();
  if (f0.width <= 0 || f0.height <= 0 || f0.width % cfg.factor() != 0 || f0.height % cfg.factor() != 0) {
    return InvalidArgument("the decoder gave frames of " + std::to_string(f0.width) + "x" + std::to_string(f0.height) +
                           ", not positive multiples of " + std::to_string(cfg.factor()));
  }
  const GridTHW want{n / T, f0.height / cfg.patch_size, f0.width / cfg.patch_size};
  if (!(v.grid == want)) {
    return InvalidArgument("the decoder's grid " + std::to_string(v.grid.t) + "x" + std::to_string(v.grid.h) + "x" +
                           std::to_string(v.grid.w) + " does not match its " + std::to_string(n) + " frames of " +
                           std::to_string(f0.width) + "x" + std::to_string(f0.height));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ContentKey> VideoItemKey(const WorkerOptions& options, const VideoInput& video) {
  if (Status s = CheckInput(video); !s.ok()) return s;
  const VideoSampling& sampling = SamplingFor(options, video);
  std::vector<std::span<const std::uint8_t>> parts;
  const bool frame_list = video.container.empty();
  if (frame_list) {
    parts.reserve(video.frames.size());
    for (const MediaBytes& f : video.frames) parts.push_back(f.span());
  } else {
    parts.push_back(video.container.span());
  }
  return ComputeVideoKey(options.model_id, options.preprocess, sampling, parts, frame_list, options.key_mode);
}

Status CheckBeforeDecode(const WorkerOptions& options, const VideoInput& input) {
  if (Status s = CheckInput(input); !s.ok()) return s;
  if (Status s = SamplingFor(options, input).Validate(); !s.ok()) return s;
  if (!input.container.empty() && !options.decode_video) {
    return FailedPrecondition(
        "this worker decodes no video containers (built without epd::video); send the video as a "
        "list of frame images");
  }
  return Status::Ok();
}

StatusOr<PreparedVideo> PrepareVideo(const WorkerOptions& options, const VideoInput& input,
                                     const std::optional<KeyNamespace>& chunk_ns, std::stop_token stop) {
  if (Status s = CheckBeforeDecode(options, input); !s.ok()) return s;
  const VideoSampling& sampling = SamplingFor(options, input);
  const PreprocessConfig& cfg = options.preprocess;
  StatusOr<SampledVideo> sampled = Status(StatusCode::kInternal, "not decoded");
  if (!input.container.empty()) {
    sampled = options.decode_video(input.container.span(), sampling, cfg, options.video_limits, std::move(stop));
  } else {
    std::vector<std::span<const std::uint8_t>> frames;
    frames.reserve(input.frames.size());
    for (const MediaBytes& f : input.frames) frames.push_back(f.span());
    sampled = SampleFrameList(frames, sampling, cfg, options.limits, options.video_limits);
  }
  if (!sampled.ok()) return sampled.status();
  if (Status s = CheckSampled(*sampled, cfg); !s.ok()) return s;

  PreparedVideo out;
  out.grid = sampled->grid;
  auto timing = std::make_shared<VideoTiming>();
  timing->timestamps_s = sampled->timestamps_s;
  timing->sample_fps = sampled->sample_fps;
  timing->seconds_per_grid_t = sampled->seconds_per_grid_t;
  out.timing = std::move(timing);
  const std::int64_t T = cfg.temporal_patch_size;
  const std::span<const RgbImage> frames(sampled->frames);
  out.chunk_keys.reserve(static_cast<std::size_t>(out.grid.t));
  for (std::int64_t t = 0; t < out.grid.t; ++t) {
    StatusOr<ContentKey> key = ComputeVideoChunkKey(
        options.model_id, cfg, frames.subspan(static_cast<std::size_t>(t * T), static_cast<std::size_t>(T)),
        options.key_mode);
    if (!key.ok()) return key.status();
    out.chunk_keys.push_back(ChunkKeyIn(chunk_ns, *key));
  }
  out.video = std::make_shared<const SampledVideo>(std::move(*sampled));
  return out;
}

StatusOr<PreprocessedImage> PreprocessWholeVideo(const SampledVideo& video, const PreprocessConfig& cfg) {
  PreprocessedImage out;
  out.grid = video.grid;
  out.merge_size = cfg.merge_size;
  out.patch_dim = cfg.patch_dim();
  out.patches.reserve(static_cast<std::size_t>(video.grid.patches() * cfg.patch_dim()));
  for (std::int64_t t = 0; t < video.grid.t; ++t) {
    StatusOr<PreprocessedImage> chunk = PreprocessChunk(video, t, cfg);
    if (!chunk.ok()) return chunk.status();
    out.patches.insert(out.patches.end(), chunk->patches.begin(), chunk->patches.end());
  }
  return out;
}

StatusOr<EmbeddingPtr> ConcatChunks(std::span<const EmbeddingPtr> chunks, const GridTHW& grid,
                                    std::int64_t merge_size) {
  if (chunks.empty()) return Internal("a video without chunks");
  std::vector<EmbeddingPtr> host;
  host.reserve(chunks.size());
  for (const EmbeddingPtr& c : chunks) {
    StatusOr<EmbeddingPtr> h = ToHost(c);
    if (!h.ok()) return h.status();
    host.push_back(std::move(*h));
  }
  auto out = std::make_shared<Embedding>();
  out->hidden = host.front()->hidden;
  out->deepstack_layers = host.front()->deepstack_layers;
  out->dtype = host.front()->dtype;
  out->grid = grid;
  for (const EmbeddingPtr& c : host) {
    if (c->hidden != out->hidden || c->deepstack_layers != out->deepstack_layers || c->dtype != out->dtype) {
      return Internal("the chunks of a video differ in shape");
    }
    out->tokens += c->tokens;
  }
  if (out->tokens != grid.tokens(merge_size)) {
    return Internal("a video's chunks hold " + std::to_string(out->tokens) + " rows, its grid gives " +
                    std::to_string(grid.tokens(merge_size)));
  }
  out->main.reserve(out->main_bytes());
  out->deepstack.reserve(out->deepstack_bytes());
  for (const EmbeddingPtr& c : host) {
    out->main.insert(out->main.end(), c->main.begin(), c->main.end());
    out->deepstack.insert(out->deepstack.end(), c->deepstack.begin(), c->deepstack.end());
  }
  if (out->nbytes() != out->ExpectedBytes()) return Internal("a video chunk's byte count does not match its shape");
  return EmbeddingPtr(std::move(out));
}

std::shared_ptr<const VideoTiming> VideoTimingCache::Find(const ContentKey& key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : it->second;
}

void VideoTimingCache::Put(const ContentKey& key, std::shared_ptr<const VideoTiming> timing) {
  if (capacity_ <= 0) return;
  auto [it, inserted] = map_.insert_or_assign(key, std::move(timing));
  if (!inserted) return;
  order_.push_back(key);
  while (static_cast<std::int64_t>(order_.size()) > capacity_) {
    map_.erase(order_.front());
    order_.pop_front();
  }
}

}  // namespace epd::internal
