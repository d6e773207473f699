// src/worker/video_items.h (internal to epd::worker): the parts of a video
// item's path that need none of the worker's state: its whole-video key, its
// decode into temporal chunks with their keys, the concatenation of the
// chunks' rows, and the timings kept for whole-video hits.
//
// How the worker uses them (video_serving.h, docs/VIDEO.md):
//   whole-video key (VideoItemKey) -> L1/L2 hit with a known timing: done,
//   no decode. Otherwise CheckBeforeDecode, then PrepareVideo decodes and
//   samples the video on a video decode thread and keys each temporal chunk
//   (temporal_patch_size frames); every chunk is then served as an image is
//   (hit, join, or a tower job of grid (1, h, w) whose rows PreprocessChunk
//   makes on a decode helper). When the last chunk arrives, ConcatChunks
//   builds the video's embedding, which is cached under the whole-video key
//   and delivered with its VideoTiming.
//
// Thread safety: the free functions are pure and thread-safe;
// VideoTimingCache is thread-compatible (the worker's owning thread).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <stop_token>
#include <unordered_map>
#include <vector>

#include "epd/core/encode_types.h"
#include "epd/media/content_key.h"
#include "epd/media/video.h"
#include "epd/worker/encode_request.h"
#include "epd/worker/worker_options.h"

namespace epd::internal {

// The sampling a video item uses: its own, else the worker's default.
const VideoSampling& SamplingFor(const WorkerOptions& options, const VideoInput& video);

// The whole-video key (ComputeVideoKey over the container bytes or the frame
// images, the sampling, model and config). kInvalidArgument when the input
// holds both or neither of a container and frames.
StatusOr<ContentKey> VideoItemKey(const WorkerOptions& options, const VideoInput& video);

// A decoded, sampled video, cut into chunks.
struct PreparedVideo {
  std::shared_ptr<const SampledVideo> video;  // shared with the chunks' preprocess tasks
  std::vector<ContentKey> chunk_keys;         // one per temporal patch, in order
  GridTHW grid;                               // (t, h, w); each chunk is (1, h, w)
  std::shared_ptr<const VideoTiming> timing;
  // Wall time of the decode and sampling (PrepareVideo), set by the caller
  // that timed it; each chunk's cost carries its share (docs/PLAN.md).
  double decode_seconds = 0;
};

// What can be refused without a decode (cheap; at Submit): the input's
// shape (a container or frames, not both), the sampling's Validate, and
// kFailedPrecondition for a container when no decode_video is set.
Status CheckBeforeDecode(const WorkerOptions& options, const VideoInput& input);

// Decodes (options.decode_video for a container, SampleFrameList for frames)
// and keys every chunk, in `chunk_ns` when set; `stop` is handed to decode_video, which returns early
// (kCancelled) once it is requested. Errors: CheckBeforeDecode's, the
// decoder's (kInvalidArgument for bad input or a decode over video_limits),
// kInvalidArgument when the decoder's output breaks the SampledVideo
// contract (frame count, sizes, grid). Thread-safe (a decode thread runs it).
StatusOr<PreparedVideo> PrepareVideo(const WorkerOptions& options, const VideoInput& input,
                                     const std::optional<KeyNamespace>& chunk_ns, std::stop_token stop = {});

// The patch rows of the whole video as ONE tower item of grid (t, h, w):
// the chunks' rows (PreprocessChunk) in order. For the whole-video path
// (a tower without temporal_chunks_independent, or chunk caching off).
StatusOr<PreprocessedImage> PreprocessWholeVideo(const SampledVideo& video, const PreprocessConfig& cfg);

// The video's embedding: the chunks' main rows concatenated in order, the
// deepstack rows likewise, grid `grid`. Chunks held in device or pinned
// memory are copied to the host first. Errors: a chunk whose shape differs
// from the first's or whose rows do not sum to grid's tokens (kInternal),
// ToHost's errors.
StatusOr<EmbeddingPtr> ConcatChunks(std::span<const EmbeddingPtr> chunks, const GridTHW& grid, std::int64_t merge_size);

// Timings of videos cached whole, for at most `capacity` keys (the oldest
// inserted is forgotten first). A forgotten timing only costs the next
// repeat its decode: the video is then served from its chunks.
class VideoTimingCache {
 public:
  explicit VideoTimingCache(std::int64_t capacity) : capacity_(capacity) {}
  std::shared_ptr<const VideoTiming> Find(const ContentKey& key) const;
  void Put(const ContentKey& key, std::shared_ptr<const VideoTiming> timing);

 private:
  std::int64_t capacity_;
  std::unordered_map<ContentKey, std::shared_ptr<const VideoTiming>, ContentKeyHash> map_;
  std::deque<ContentKey> order_;  // insertion order
};

}  // namespace epd::internal
