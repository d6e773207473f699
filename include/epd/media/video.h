// epd/media/video.h: a video as the encode stage sees it: sampling options, limits,
// and the sampled frames that become a grid (t, h, w).
//
// This header is the media layer's (no FFmpeg): the sampling arithmetic of
// Qwen's reference video pipeline (qwen-vl-utils `fetch_video`, `smart_nframes`,
// its torchvision/decord readers) and the frame-list path, which decodes each
// frame with epd::DecodeImage. Decoding a container (MP4/H.264, WebM/VP9, ...)
// lives in its own target at the edge, epd::video (epd/video/video_decoder.h), which
// links FFmpeg.
//
// Qwen-VL video layout (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): the sampled frames
// are all resized to one (H, W); consecutive groups of temporal_patch_size
// frames form one temporal patch, so grid = (frames / temporal_patch_size,
// H / patch, W / patch). A *chunk* is one temporal patch: its patch rows are
// exactly those of an image item of grid (1, H/patch, W/patch) whose two
// "frames" are the chunk's frames (epd/media/preprocess.h layout, channel, frame,
// y, x within a row).
//
// Thread safety: value types; the functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "epd/core/grid.h"
#include "epd/core/status.h"
#include "epd/media/image.h"
#include "epd/media/preprocess.h"

namespace epd {

// Sampling options, per request (a server's flags give the defaults).
// Defaults are qwen-vl-utils' (vision_process.py): FPS 2.0, FPS_MIN_FRAMES 4,
// FPS_MAX_FRAMES 768, VIDEO_MIN_PIXELS 128*28*28, VIDEO_MAX_PIXELS 768*28*28,
// VIDEO_TOTAL_PIXELS 128000*28*28*0.9; pixel values are for patch 14 and are
// scaled by (patch/14)^2 for a checkpoint with another patch size.
struct VideoSampling {
  double fps = 2.0;                     // sampled frames per second of video
  std::optional<std::int64_t> nframes;  // exact frame count instead of fps (rounded to temporal_patch_size)
  std::int64_t min_frames = 4;
  std::int64_t max_frames = 768;
  std::int64_t min_pixels = std::int64_t{128} * 28 * 28;  // per frame, after resize
  std::int64_t max_pixels = std::int64_t{768} * 28 * 28;  // per frame, after resize
  std::int64_t total_pixels = 90'316'800;                 // budget over all sampled frames (128000*28*28*0.9)
  // Optional fixed size (qwen-vl-utils' resized_height / resized_width),
  // still rounded by smart_resize; both or neither.
  std::optional<std::int64_t> resized_height;
  std::optional<std::int64_t> resized_width;
  // Show a container's frames as its display matrix says (turned and
  // flipped, as `ffmpeg` autorotates; epd/video/video_decoder.h), so a
  // 90-degree phone video is encoded portrait. Off: as stored. Frame lists
  // ignore it (each frame image follows PreprocessConfig's EXIF rule). Part
  // of a container's video key.
  bool apply_rotation = true;

  // The qwen-vl-utils defaults for a checkpoint of ViT patch `patch_size`
  // (spatial merge 2, so factor f = 2 * patch_size): min_pixels 128 f^2,
  // max_pixels 768 f^2, total_pixels 128000 f^2 * 0.9 = 115200 f^2; the
  // frame options are the defaults above. Patch 14 (Qwen2-VL, Qwen2.5-VL)
  // gives the defaults above; patch 16 (Qwen3-VL) gives 131072, 786432 and
  // 117964800. Source: qwen-vl-utils fetch_video(image_patch_size=...)
  // (QwenLM/Qwen3-VL, VIDEO_MIN_TOKEN_NUM, VIDEO_MAX_TOKEN_NUM,
  // MODEL_SEQ_LEN). REQUIRES: 1 <= patch_size <= 1024.
  static VideoSampling ForPatchSize(int patch_size);

  // kInvalidArgument naming the field unless fps > 0 and finite, nframes
  // (when set) >= 1, 1 <= min_frames <= max_frames, 1 <= min_pixels <=
  // max_pixels, total_pixels >= 1, resized sizes both set or neither and >= 1.
  Status Validate() const;
};

// Limits checked before large allocations; each violation is
// kInvalidArgument naming the limit and the value.
struct VideoLimits {
  double max_duration_s = 3600;                    // the container's claimed duration
  std::int64_t max_source_frames = 1 << 20;        // frames the stream claims
  std::int64_t max_source_pixels = 8192LL * 8192;  // width * height of a source frame
  std::int64_t max_decoded_bytes = 2LL << 30;      // sampled frames after resize, RGB8, all frames
  // The decode work one container may cost (epd::video's DecodeVideo): the
  // frames the decoder produces (every frame up to the last sampled one, not
  // only the sampled ones), their source pixels summed (frames x area), and
  // the decode's wall time. The frame and pixel bounds are checked on the
  // header when it gives a frame count (ProbeVideo too), again once the
  // demux pass has counted the packets, and while decoding, frame by frame
  // (a stream may grow its frames past the header's size); the time between
  // frames. 2^36 pixels is about 33,000 1080p frames (18 min at 30 fps) or
  // 8,300 4K frames; an 8000x8000 H.264 frame took about 1.75 s to decode on
  // the 2-core machine of issue 27.
  std::int64_t max_decode_frames = 1 << 17;    // 131072, 73 min at 30 fps
  std::int64_t max_decode_pixels = 1LL << 36;  // sum over decoded frames of width * height
  double max_decode_seconds = 60;              // wall time of one decode
};

// The sampled, resized frames of one video, ready for the tower.
struct SampledVideo {
  // frames.size() is a positive multiple of cfg.temporal_patch_size; every
  // frame is RGB8 of the same resized height x width (multiples of
  // cfg.factor()).
  std::vector<RgbImage> frames;
  GridTHW grid;                      // (frames / temporal_patch_size, H / patch, W / patch)
  std::vector<double> timestamps_s;  // presentation time of each sampled frame, seconds
  double sample_fps = 0;             // frames.size() / duration, as qwen-vl-utils reports it
  // Seconds per temporal grid step, temporal_patch_size / sample_fps
  // (Qwen2.5-VL's second_per_grid_ts, used by its M-RoPE).
  double seconds_per_grid_t = 0;
  std::int64_t source_frames = 0;  // frames in the source stream
  double source_fps = 0;
};

// --- sampling arithmetic (qwen-vl-utils), all pure -------------------------

// smart_nframes: the number of frames to sample from total_frames at
// video_fps. Errors (kInvalidArgument): the result is outside
// [temporal_patch_size, total_frames], total_frames < 1, video_fps <= 0.
StatusOr<std::int64_t> SampleFrameCount(const VideoSampling& s, std::int64_t total_frames, double video_fps,
                                        std::int64_t temporal_patch_size);

// Uniform indices over [0, total_frames - 1]: round(linspace(0, total-1, n)),
// rounding half to even as torch.round does. Computed exactly in integers
// ((total - 1) * i / (n - 1)); qwen-vl-utils' float32 torch.linspace agrees
// below 8,374 frames and may differ by one frame above (docs/VIDEO.md).
// Empty when nframes < 1 or total_frames < 1. O(nframes).
std::vector<std::int64_t> SampleFrameIndices(std::int64_t total_frames, std::int64_t nframes);

// The one resized (height, width) for every frame of a video of nframes
// frames of height x width: smart_resize with per-frame min pixels and
// max pixels = max(min(max_pixels, total_pixels / nframes * temporal_patch),
// min_pixels * 1.05). Errors: SmartResize's.
StatusOr<ResizedSize> VideoFrameSize(std::int64_t height, std::int64_t width, std::int64_t nframes,
                                     const VideoSampling& s, const PreprocessConfig& cfg);

// A list of encoded frame images as a video (qwen-vl-utils' list branch):
// each is decoded (DecodeImage with cfg.decode and `limits`), the count is
// padded up to a multiple of temporal_patch_size by repeating the last frame,
// and all are resized to VideoFrameSize of the first frame. Timestamps are
// i / s.fps. Errors (kInvalidArgument): no frames, a frame that does not
// decode (naming its index), limits.
StatusOr<SampledVideo> SampleFrameList(std::span<const std::span<const std::uint8_t>> frames, const VideoSampling& s,
                                       const PreprocessConfig& cfg, const DecodeLimits& limits = {},
                                       const VideoLimits& video_limits = {});

// The patch rows of temporal chunk `t` of `video` (frames [t*T, (t+1)*T)),
// normalised as Preprocess does: [grid.h * grid.w, cfg.patch_dim()] float32,
// the layout of epd/media/preprocess.h. Errors (kInvalidArgument): t out of range,
// frames of inconsistent size.
StatusOr<PreprocessedImage> PreprocessChunk(const SampledVideo& video, std::int64_t t, const PreprocessConfig& cfg);

}  // namespace epd
