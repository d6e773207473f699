// TEMPORARY (branch vchunk): stand-ins for the video sampling functions of
// epd/video.h until the vdec branch's implementation is merged, so the
// worker's video path links and its tests run. VideoSampling::Validate and
// PreprocessChunk are complete; SampleFrameList decodes the frames but does
// no resize (it requires frames already at a size that is a multiple of
// cfg.factor()); SampleFrameCount/Indices/VideoFrameSize are left out.
// Delete this file when vdec lands.
#include <array>
#include <cmath>
#include <string>

#include "epd/video.h"

namespace epd {

Status VideoSampling::Validate() const {
  if (!(fps > 0) || !std::isfinite(fps)) return InvalidArgument("sampling fps must be > 0 and finite");
  if (nframes.has_value() && *nframes < 1) return InvalidArgument("sampling nframes must be >= 1");
  if (min_frames < 1 || min_frames > max_frames) return InvalidArgument("sampling needs 1 <= min_frames <= max_frames");
  if (min_pixels < 1 || min_pixels > max_pixels) return InvalidArgument("sampling needs 1 <= min_pixels <= max_pixels");
  if (total_pixels < 1) return InvalidArgument("sampling total_pixels must be >= 1");
  if (resized_height.has_value() != resized_width.has_value()) {
    return InvalidArgument("sampling resized_height and resized_width: both or neither");
  }
  return Status::Ok();
}

StatusOr<SampledVideo> SampleFrameList(std::span<const std::span<const std::uint8_t>> frames,
                                       const VideoSampling& s, const PreprocessConfig& cfg,
                                       const DecodeLimits& limits, const VideoLimits&) {
  if (frames.empty()) return InvalidArgument("a frame list without frames");
  SampledVideo v;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    StatusOr<RgbImage> img = DecodeImage(frames[i], limits, cfg.decode);
    if (!img.ok()) return InvalidArgument("frame " + std::to_string(i) + ": " + img.status().message());
    v.frames.push_back(std::move(*img));
  }
  while (v.frames.size() % static_cast<std::size_t>(cfg.temporal_patch_size) != 0) v.frames.push_back(v.frames.back());
  for (std::size_t i = 0; i < v.frames.size(); ++i) v.timestamps_s.push_back(static_cast<double>(i) / s.fps);
  v.sample_fps = s.fps;
  v.seconds_per_grid_t = static_cast<double>(cfg.temporal_patch_size) / s.fps;
  v.grid = {static_cast<std::int64_t>(v.frames.size()) / cfg.temporal_patch_size,
            v.frames[0].height / cfg.patch_size, v.frames[0].width / cfg.patch_size};
  return v;
}

StatusOr<PreprocessedImage> PreprocessChunk(const SampledVideo& video, std::int64_t t, const PreprocessConfig& cfg) {
  const std::int64_t T = cfg.temporal_patch_size, P = cfg.patch_size, m = cfg.merge_size;
  if (t < 0 || (t + 1) * T > static_cast<std::int64_t>(video.frames.size())) {
    return InvalidArgument("chunk " + std::to_string(t) + " is out of range");
  }
  const RgbImage& f0 = video.frames[static_cast<std::size_t>(t * T)];
  const std::int64_t H = f0.height, W = f0.width;
  if (H % cfg.factor() != 0 || W % cfg.factor() != 0) return InvalidArgument("frame size not a multiple of factor");
  for (std::int64_t k = 0; k < T; ++k) {
    const RgbImage& f = video.frames[static_cast<std::size_t>(t * T + k)];
    if (f.height != H || f.width != W || f.pixels.size() != static_cast<std::size_t>(H * W * 3)) {
      return InvalidArgument("frames of inconsistent size");
    }
  }
  // As Preprocess: x / 255 in double rounded to float, then (x - mean) / std in float.
  std::array<std::array<float, 256>, 3> lut;
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) lut[c][v] = (static_cast<float>(v * (1.0 / 255.0)) - cfg.mean[c]) / cfg.std[c];
  }
  PreprocessedImage out;
  out.grid = {1, H / P, W / P};
  out.merge_size = m;
  out.patch_dim = cfg.patch_dim();
  out.patches.resize(static_cast<std::size_t>(out.grid.patches() * out.patch_dim));
  float* dst = out.patches.data();
  for (std::int64_t by = 0; by < H / P / m; ++by) {
    for (std::int64_t bx = 0; bx < W / P / m; ++bx) {
      for (std::int64_t my = 0; my < m; ++my) {
        for (std::int64_t mx = 0; mx < m; ++mx) {
          const std::int64_t y0 = (by * m + my) * P, x0 = (bx * m + mx) * P;
          for (int c = 0; c < 3; ++c) {
            for (std::int64_t k = 0; k < T; ++k) {
              const std::uint8_t* px = video.frames[static_cast<std::size_t>(t * T + k)].pixels.data();
              for (std::int64_t py = 0; py < P; ++py) {
                for (std::int64_t qx = 0; qx < P; ++qx) *dst++ = lut[c][px[((y0 + py) * W + x0 + qx) * 3 + c]];
              }
            }
          }
        }
      }
    }
  }
  return out;
}

}  // namespace epd
