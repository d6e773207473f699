// The sampling arithmetic of Qwen's reference video pipeline, qwen-vl-utils
// (src/qwen_vl_utils/vision_process.py; the version in QwenLM/Qwen3-VL,
// which also serves Qwen2-VL and Qwen2.5-VL through image_patch_size), and
// the frame-list path and per-chunk patch rows built on it. No FFmpeg here:
// the container decoder (epd::video) calls these functions, so a server
// without FFmpeg still samples frame lists identically.
//
// Exactness is the point, as for SmartResize: the LLM side reserves one
// placeholder per post-merge token, and Qwen2.5-VL's M-RoPE uses the
// seconds per temporal step, so a frame count, a resized size or a timestamp
// that differs from the reference changes the prompt. Every quantity below
// is computed in the same IEEE-double operations as the Python original.
//
// Where we deviate from qwen-vl-utils, and why (each also in docs/VIDEO.md):
//   - FRAME_FACTOR (fixed 2 there) is cfg.temporal_patch_size here; equal for
//     all three Qwen-VL generations.
//   - Frame indices: qwen-vl-utils rounds torch.linspace, which is float32;
//     we round the exact rational (total - 1) * i / (n - 1) in integers. The
//     two agree for every video we measured below 8,374 frames (torch 1.13,
//     all even n <= 768); above, float32 rounding can move an index by one
//     frame, and torch's own answer then depends on its SIMD width, so an
//     exact rule is the reproducible choice.
//   - max_pixels: s.max_pixels plays VIDEO_MAX_PIXELS' role in the budget
//     formula (the contract in epd/media/video.h); with the defaults this is the
//     reference's value exactly.
//   - A frame list is resized once, from the first frame's size, instead of
//     fetch_image's per-image resize followed by a second video resize.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "epd/media/video.h"
#include "patchify.h"

namespace epd {
namespace {

// qwen-vl-utils round_by_factor / ceil_by_factor / floor_by_factor, on
// doubles as in Python (number / factor is a true division there).
double RoundByFactor(double number, double factor) { return internal::RoundHalfEven(number / factor) * factor; }
double CeilByFactor(double number, double factor) { return std::ceil(number / factor) * factor; }
double FloorByFactor(double number, double factor) { return std::floor(number / factor) * factor; }

// qwen-vl-utils' smart_resize defaults when only resized_height/width are
// given: IMAGE_MIN_TOKEN_NUM (4) and IMAGE_MAX_TOKEN_NUM (16384) merged
// tokens of factor^2 pixels each (vision_process.py, smart_resize).
constexpr std::int64_t kImageMinTokens = 4;
constexpr std::int64_t kImageMaxTokens = 16384;

// VIDEO_MIN_TOKEN_NUM, VIDEO_MAX_TOKEN_NUM and MODEL_SEQ_LEN * 0.9 of
// qwen-vl-utils (QwenLM/Qwen3-VL): per-frame and whole-video budgets in
// merged tokens; pixels are tokens * factor^2.
constexpr std::int64_t kVideoMinTokens = 128;
constexpr std::int64_t kVideoMaxTokens = 768;
constexpr std::int64_t kVideoTotalTokens = 115'200;  // 128000 * 0.9
// SPATIAL_MERGE_SIZE of qwen-vl-utils: factor = patch * 2.
constexpr std::int64_t kSpatialMerge = 2;

std::string Num(double v) {
  std::string s = std::to_string(v);
  // Trim trailing zeros of std::to_string's fixed 6 decimals.
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

Status CheckResizedFrame(const RgbImage& f, std::int64_t height, std::int64_t width, std::size_t index) {
  if (f.width != width || f.height != height ||
      f.pixels.size() != static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3) {
    return InvalidArgument("video frame " + std::to_string(index) + " is " + std::to_string(f.width) + "x" +
                           std::to_string(f.height) + " (WxH, " + std::to_string(f.pixels.size()) +
                           " bytes), expected " + std::to_string(width) + "x" + std::to_string(height) + " RGB8");
  }
  return Status::Ok();
}

}  // namespace

VideoSampling VideoSampling::ForPatchSize(int patch_size) {
  VideoSampling s;
  const std::int64_t f = kSpatialMerge * patch_size;
  s.min_pixels = kVideoMinTokens * f * f;
  s.max_pixels = kVideoMaxTokens * f * f;
  s.total_pixels = kVideoTotalTokens * f * f;
  return s;
}

Status VideoSampling::Validate() const {
  auto bad = [](const std::string& what) { return InvalidArgument("invalid VideoSampling: " + what); };
  if (!std::isfinite(fps) || !(fps > 0)) return bad("fps " + Num(fps) + " is not finite and positive");
  if (nframes && *nframes < 1) return bad("nframes " + std::to_string(*nframes) + " is below 1");
  if (min_frames < 1) return bad("min_frames " + std::to_string(min_frames) + " is below 1");
  if (max_frames < min_frames) {
    return bad("max_frames " + std::to_string(max_frames) + " is below min_frames " + std::to_string(min_frames));
  }
  if (min_pixels < 1) return bad("min_pixels " + std::to_string(min_pixels) + " is below 1");
  if (max_pixels < min_pixels) {
    return bad("max_pixels " + std::to_string(max_pixels) + " is below min_pixels " + std::to_string(min_pixels));
  }
  if (total_pixels < 1) return bad("total_pixels " + std::to_string(total_pixels) + " is below 1");
  if (resized_height.has_value() != resized_width.has_value()) {
    return bad("resized_height and resized_width must be set together");
  }
  if (resized_height && (*resized_height < 1 || *resized_width < 1)) {
    return bad("resized size " + std::to_string(*resized_height) + "x" + std::to_string(*resized_width) +
               " (HxW) is not positive");
  }
  return Status::Ok();
}

// smart_nframes (vision_process.py), FRAME_FACTOR = temporal_patch_size.
StatusOr<std::int64_t> SampleFrameCount(const VideoSampling& s, std::int64_t total_frames, double video_fps,
                                        std::int64_t temporal_patch_size) {
  if (Status st = s.Validate(); !st.ok()) return st;
  if (total_frames < 1)
    return InvalidArgument("video has no frames (total_frames " + std::to_string(total_frames) + ")");
  if (!std::isfinite(video_fps) || !(video_fps > 0)) {
    return InvalidArgument("video frame rate " + Num(video_fps) + " fps is not finite and positive");
  }
  if (temporal_patch_size < 1) {
    return InvalidArgument("temporal_patch_size " + std::to_string(temporal_patch_size) + " is below 1");
  }
  const double ff = static_cast<double>(temporal_patch_size);
  const double total = static_cast<double>(total_frames);
  double n;
  if (s.nframes) {
    n = RoundByFactor(static_cast<double>(*s.nframes), ff);
  } else {
    const double min_frames = CeilByFactor(static_cast<double>(s.min_frames), ff);
    // The reference's default max_frames is min(FPS_MAX_FRAMES, total); the
    // min with total below makes a user value and the default agree.
    const double max_frames = FloorByFactor(static_cast<double>(s.max_frames), ff);
    n = total / video_fps * s.fps;
    n = std::min(std::min(std::max(n, min_frames), max_frames), total);
    n = FloorByFactor(n, ff);
  }
  if (!(ff <= n && n <= total)) {
    return InvalidArgument("sampled frame count " + Num(n) + " is outside [" + std::to_string(temporal_patch_size) +
                           ", " + std::to_string(total_frames) + "]: the video has " + std::to_string(total_frames) +
                           " frames, too few for one temporal patch of " + std::to_string(temporal_patch_size) +
                           " at these sampling options");
  }
  return static_cast<std::int64_t>(n);
}

std::vector<std::int64_t> SampleFrameIndices(std::int64_t total_frames, std::int64_t nframes) {
  std::vector<std::int64_t> idx;
  if (nframes < 1 || total_frames < 1) return idx;
  idx.reserve(static_cast<std::size_t>(nframes));
  if (nframes == 1) {  // torch.linspace(a, b, 1) == [a]
    idx.push_back(0);
    return idx;
  }
  // round((total - 1) * i / (n - 1)), half to even, exactly in integers
  // (both factors < 2^31 for any stream the limits admit, so no overflow;
  // the products are computed in unsigned __int128 regardless).
  const unsigned __int128 d = static_cast<unsigned __int128>(nframes - 1);
  for (std::int64_t i = 0; i < nframes; ++i) {
    const unsigned __int128 num = static_cast<unsigned __int128>(total_frames - 1) * static_cast<unsigned __int128>(i);
    unsigned __int128 q = num / d;
    const unsigned __int128 r = num % d;
    if (2 * r > d || (2 * r == d && (q & 1) == 1)) ++q;
    idx.push_back(static_cast<std::int64_t>(q));
  }
  return idx;
}

StatusOr<ResizedSize> VideoFrameSize(std::int64_t height, std::int64_t width, std::int64_t nframes,
                                     const VideoSampling& s, const PreprocessConfig& cfg) {
  if (Status st = s.Validate(); !st.ok()) return st;
  if (Status st = cfg.Validate(); !st.ok()) return st;
  if (nframes < 1) return InvalidArgument("video frame count " + std::to_string(nframes) + " is below 1");
  const double f2 = static_cast<double>(cfg.factor() * cfg.factor());
  if (s.resized_height) {
    // fetch_video: smart_resize(resized_height, resized_width, factor) with
    // smart_resize's own (image) bounds.
    return internal::SmartResizeWithBounds(*s.resized_height, *s.resized_width, cfg, kImageMinTokens * f2,
                                           kImageMaxTokens * f2);
  }
  // fetch_video: max_pixels = max(min(VIDEO_MAX_PIXELS, total_pixels /
  // nframes * FRAME_FACTOR), int(min_pixels * 1.05)); a float in Python,
  // kept a double here because smart_resize's beta uses it unrounded.
  const double min_pixels = static_cast<double>(s.min_pixels);
  const double budget =
      static_cast<double>(s.total_pixels) / static_cast<double>(nframes) * static_cast<double>(cfg.temporal_patch_size);
  const double max_pixels =
      std::max(std::min(static_cast<double>(s.max_pixels), budget), std::trunc(min_pixels * 1.05));
  return internal::SmartResizeWithBounds(height, width, cfg, min_pixels, max_pixels);
}

StatusOr<SampledVideo> SampleFrameList(std::span<const std::span<const std::uint8_t>> frames, const VideoSampling& s,
                                       const PreprocessConfig& cfg, const DecodeLimits& limits,
                                       const VideoLimits& video_limits) {
  if (Status st = s.Validate(); !st.ok()) return st;
  if (Status st = cfg.Validate(); !st.ok()) return st;
  if (frames.empty()) return InvalidArgument("video frame list is empty");
  const std::int64_t count = static_cast<std::int64_t>(frames.size());
  if (count > video_limits.max_source_frames) {
    return InvalidArgument("video frame list has " + std::to_string(count) + " frames, over the limit of " +
                           std::to_string(video_limits.max_source_frames));
  }
  const std::int64_t T = cfg.temporal_patch_size;
  // fetch_video's list branch: nframes = ceil_by_factor(len, FRAME_FACTOR),
  // the last frame repeated to fill.
  const std::int64_t padded = (count + T - 1) / T * T;

  SampledVideo out;
  out.frames.reserve(static_cast<std::size_t>(padded));
  ResizedSize size;
  for (std::int64_t i = 0; i < count; ++i) {
    StatusOr<RgbImage> img = DecodeImage(frames[static_cast<std::size_t>(i)], limits, cfg.decode);
    if (!img.ok()) {
      return InvalidArgument("video frame " + std::to_string(i) + " does not decode: " + img.status().message());
    }
    if (i == 0) {
      StatusOr<ResizedSize> sz = VideoFrameSize(img->height, img->width, padded, s, cfg);
      if (!sz.ok()) return sz.status();
      size = *sz;
      // All frames are resized to `size`; refuse before holding them.
      const double bytes =
          static_cast<double>(padded) * static_cast<double>(size.height) * static_cast<double>(size.width) * 3.0;
      if (bytes > static_cast<double>(video_limits.max_decoded_bytes)) {
        return InvalidArgument("video of " + std::to_string(padded) + " frames at " + std::to_string(size.width) + "x" +
                               std::to_string(size.height) + " is " + Num(bytes) +
                               " bytes of RGB8, over max_decoded_bytes " +
                               std::to_string(video_limits.max_decoded_bytes));
      }
    }
    StatusOr<RgbImage> resized =
        ResizeRgb(*img, static_cast<int>(size.width), static_cast<int>(size.height), cfg.resample);
    if (!resized.ok()) return resized.status();
    out.frames.push_back(std::move(*resized));
  }
  while (static_cast<std::int64_t>(out.frames.size()) < padded) out.frames.push_back(out.frames.back());

  out.grid = GridTHW{padded / T, size.height / cfg.patch_size, size.width / cfg.patch_size};
  out.timestamps_s.reserve(out.frames.size());
  for (std::int64_t i = 0; i < padded; ++i) out.timestamps_s.push_back(static_cast<double>(i) / s.fps);
  // The list branch reports its sample_fps option (default 2.0) as is.
  out.sample_fps = s.fps;
  out.seconds_per_grid_t = static_cast<double>(T) / out.sample_fps;
  out.source_frames = count;
  out.source_fps = s.fps;
  return out;
}

StatusOr<PreprocessedImage> PreprocessChunk(const SampledVideo& video, std::int64_t t, const PreprocessConfig& cfg) {
  if (Status st = cfg.Validate(); !st.ok()) return st;
  const std::int64_t T = cfg.temporal_patch_size;
  const std::int64_t n = static_cast<std::int64_t>(video.frames.size());
  if (n == 0 || n % T != 0) {
    return InvalidArgument("video has " + std::to_string(n) +
                           " frames, not a positive multiple of temporal_patch_size " + std::to_string(T));
  }
  if (t < 0 || t >= n / T) {
    return InvalidArgument("temporal chunk " + std::to_string(t) + " is out of range [0, " + std::to_string(n / T) +
                           ")");
  }
  const std::int64_t H = video.frames.front().height, W = video.frames.front().width;
  if (H < 1 || W < 1 || H % cfg.factor() != 0 || W % cfg.factor() != 0) {
    return InvalidArgument("video frames are " + std::to_string(W) + "x" + std::to_string(H) +
                           " (WxH), not positive multiples of factor " + std::to_string(cfg.factor()));
  }
  const std::uint8_t* frames[64];  // temporal_patch_size <= 64 (Validate)
  for (std::int64_t k = 0; k < T; ++k) {
    const std::size_t index = static_cast<std::size_t>(t * T + k);
    if (Status st = CheckResizedFrame(video.frames[index], H, W, index); !st.ok()) return st;
    frames[k] = video.frames[index].pixels.data();
  }
  PreprocessedImage out;
  out.grid = GridTHW{1, H / cfg.patch_size, W / cfg.patch_size};
  out.merge_size = cfg.merge_size;
  out.patch_dim = cfg.patch_dim();
  out.patches.resize(static_cast<std::size_t>(out.grid.patches() * out.patch_dim));
  // The image path's fused normalise-and-patchify, T distinct frames.
  const internal::PatchWriter writer(cfg, static_cast<int>(W));
  const std::size_t stride = static_cast<std::size_t>(W) * 3;
  const std::uint8_t* band[64];
  for (std::int64_t y0 = 0; y0 < H; y0 += cfg.patch_size) {
    for (std::int64_t k = 0; k < T; ++k) band[k] = frames[k] + static_cast<std::size_t>(y0) * stride;
    writer.Band(band, stride, static_cast<int>(y0), out.patches.data(), 0);
  }
  return out;
}

}  // namespace epd
