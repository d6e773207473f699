// epd/video_decoder.h: decodes a video container with FFmpeg (libavformat,
// libavcodec, libswscale) and samples it as Qwen's reference pipeline does
// (epd/video.h). Library epd::video, at the edge; the worker reaches it only
// through WorkerOptions::decode_video, which the CLI and server set.
//
// Thread safety: DecodeVideo is thread-safe (each call owns its FFmpeg
// contexts).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "epd/preprocess.h"
#include "epd/status.h"
#include "epd/video.h"

namespace epd {

// What the container's header says, before any frame is decoded.
struct VideoInfo {
  std::string container;  // e.g. "mov,mp4,m4a,3gp,3g2,mj2"
  std::string codec;      // e.g. "h264", "vp9"
  std::int64_t width = 0;
  std::int64_t height = 0;
  std::int64_t frames = 0;  // stream frame count (estimated from duration * fps when the header has none)
  double fps = 0;
  double duration_s = 0;
};

// Reads the header only. Errors (kInvalidArgument): not a container FFmpeg
// knows, no video stream, an unsupported codec (named), a claimed size,
// duration or frame count over `limits`.
StatusOr<VideoInfo> ProbeVideo(std::span<const std::uint8_t> bytes, const VideoLimits& limits = {});

// Probes, samples SampleFrameCount frames at SampleFrameIndices, decodes them,
// converts to RGB8 and resizes every one to VideoFrameSize (cfg.resample).
// Errors (kInvalidArgument): ProbeVideo's, a corrupt or truncated stream, a
// zero-frame video, a decoded total over limits.max_decoded_bytes.
StatusOr<SampledVideo> DecodeVideo(std::span<const std::uint8_t> bytes, const VideoSampling& sampling,
                                   const PreprocessConfig& cfg, const VideoLimits& limits = {});

}  // namespace epd
