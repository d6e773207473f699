// epd/video/video_decoder.h: decodes a video container with FFmpeg (libavformat,
// libavcodec, libswscale) and samples it as Qwen's reference pipeline does
// (epd/media/video.h). Library epd::video, at the edge; the worker reaches it only
// through WorkerOptions::decode_video, which the CLI and server set.
//
// The frame count sampling uses is the number of packets of the video
// stream (decord's len(VideoReader), the MP4 sample table), counted in a
// demux-only pass; every limit that bounds an allocation is checked on the
// header before FFmpeg reads a frame. Formulas, limits and the error table:
// docs/VIDEO.md.
//
// Cost: one header parse and a demux-only pass, then a sequential decode up
// to the last sampled frame; memory is the sampled frames after resize
// (frames * H' * W' * 3 bytes, bounded by VideoLimits::max_decoded_bytes)
// plus one decoded frame and the decoder's reference frames.
// Rotation: by default (VideoSampling::apply_rotation) frames are shown as
// the stream's display matrix says, as `ffmpeg` autorotates: a phone video
// stored landscape with a 90-degree matrix is sampled, keyed and encoded
// portrait (VideoOrientation below; docs/VIDEO.md). Applying it costs one
// copy of each sampled frame at its source size.
// Ownership: the input span is only read during the call; the result owns
// its pixels.
// Thread safety: ProbeVideo and DecodeVideo are thread-safe (each call owns
// its FFmpeg contexts). The first call routes FFmpeg's process-wide log to a
// silent callback whose last error line is added to error messages.
//
// Example:
//   epd::PreprocessConfig cfg;                        // Qwen2-VL defaults
//   auto video = epd::DecodeVideo(mp4_bytes, {}, cfg);  // fps 2, 4..768 frames
//   if (!video.ok()) return video.status();           // kInvalidArgument, named
//   for (std::int64_t t = 0; t < video->grid.t; ++t) {
//     auto rows = epd::PreprocessChunk(*video, t, cfg);  // grid (1, h, w)
//   }
#pragma once

#include <cstdint>
#include <span>
#include <stop_token>
#include <string>

#include "epd/core/grid.h"
#include "epd/core/status.h"
#include "epd/media/preprocess.h"
#include "epd/media/video.h"

namespace epd {

// How a display matrix says to show a stream's frames: mirrored left to
// right first when `hflip`, then turned counterclockwise by `ccw_degrees`
// (a vertical flip is hflip with 180). The matrices read are FFmpeg's
// AV_PKT_DATA_DISPLAYMATRIX stream side data (MP4/MOV's tkhd matrix) and
// AV_FRAME_DATA_DISPLAYMATRIX frame side data (an H.264/HEVC
// display-orientation SEI); the angle is av_display_rotation_get's of the
// matrix without its flip, the flip the sign of its determinant.
struct VideoOrientation {
  int ccw_degrees = 0;  // 0, 90, 180 or 270 when quarter_turn; else the angle, rounded, in [0, 360)
  bool hflip = false;
  // False for an angle more than 1 degree away from a multiple of 90 (the
  // tolerance ffmpeg's autorotate uses); DecodeVideo refuses such a video
  // while rotation is on, rather than encode it as stored.
  bool quarter_turn = true;

  bool identity() const { return quarter_turn && ccw_degrees == 0 && !hflip; }
  // A quarter turn either way: the displayed frame is height x width.
  bool swaps_axes() const { return quarter_turn && (ccw_degrees == 90 || ccw_degrees == 270); }
  bool operator==(const VideoOrientation&) const = default;
};

// What the container's header says, before any frame is decoded.
struct VideoInfo {
  std::string container;  // e.g. "mov,mp4,m4a,3gp,3g2,mj2"
  std::string codec;      // e.g. "h264", "vp9"
  std::int64_t width = 0;
  std::int64_t height = 0;
  std::int64_t frames = 0;  // stream frame count (estimated from duration * fps when the header has none)
  double fps = 0;
  double duration_s = 0;
  // The container's display matrix (identity when it has none). width and
  // height above are the stored frame's; display_* are as shown.
  VideoOrientation orientation;
  std::int64_t display_width() const { return orientation.swaps_axes() ? height : width; }
  std::int64_t display_height() const { return orientation.swaps_axes() ? width : height; }
};

// Reads the header (and FFmpeg's stream info: a frame or two are decoded).
// Errors (kInvalidArgument): empty input, not a container FFmpeg knows or a
// header cut short, no video stream, an unsupported codec (named with its
// fourcc), no frame size or rate, a claimed size, duration or frame count
// over `limits`, or a claimed frame count whose decode (frames x area) is
// over limits.max_decode_frames / max_decode_pixels.
StatusOr<VideoInfo> ProbeVideo(std::span<const std::uint8_t> bytes, const VideoLimits& limits = {});

// The grid (t, h, w) DecodeVideo gives, from the header alone: the frame
// count is info.frames (the header's; exact when it lists every frame, as an
// MP4 sample table does, an estimate from duration * fps otherwise) and the
// frame size the displayed one when s.apply_rotation (a 90-degree video's
// grid is portrait). Orientation carried only in the bitstream (an SEI, no
// container matrix) is known at decode, not here. Errors (kInvalidArgument):
// SampleFrameCount's, VideoFrameSize's, s.Validate()'s, an angle that is not
// a quarter turn while s.apply_rotation.
StatusOr<GridTHW> VideoHeaderGrid(const VideoInfo& info, const VideoSampling& s, const PreprocessConfig& cfg);

// Probes, samples SampleFrameCount frames at SampleFrameIndices, decodes them,
// converts to RGB8 (swscale, at the source size), turns and flips each as
// its display matrix says when sampling.apply_rotation (the container's
// matrix; without one, the first decoded frame's side data), and resizes
// every one to VideoFrameSize of the displayed size with epd::ResizeRgb
// (cfg.resample), as the image path does.
// Timestamps are the frames' PTS in seconds from the stream's start.
// Errors (kInvalidArgument): invalid sampling or cfg, ProbeVideo's, a corrupt
// or truncated stream, a zero-frame video, too few frames for one temporal
// patch, a sampled total over limits.max_decoded_bytes (checked before
// decoding), decode work over limits.max_decode_frames or max_decode_pixels
// (checked on the header, after the demux pass and frame by frame), a decode
// longer than limits.max_decode_seconds (checked between frames), or a
// display matrix whose angle is not a quarter turn while
// sampling.apply_rotation (naming the angle).
// kCancelled once `stop` is requested: the decode stops before its next
// frame (a caller whose request was cancelled or passed its deadline).
StatusOr<SampledVideo> DecodeVideo(std::span<const std::uint8_t> bytes, const VideoSampling& sampling,
                                   const PreprocessConfig& cfg, const VideoLimits& limits = {},
                                   std::stop_token stop = {});

}  // namespace epd
