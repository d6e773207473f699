// src/video/video_orientation.h (internal to epd::video): reading a display
// matrix as a VideoOrientation (epd/video/video_decoder.h) and showing a
// decoded frame as it says: the one place rotation and flips are applied.
//
// The matrix (FFmpeg's libavutil/display.h) is 9 int32 in row order
// {a, b, u, c, d, v, x, y, w}, a..d in 16.16 fixed point; a source pixel
// (x, y), with y pointing down, is shown at (a x + c y, b x + d y) plus a
// translation. A negative determinant a d - b c mirrors: it is read as a
// horizontal flip applied first, then the rotation of what is left, whose
// angle is av_display_rotation_get's (counterclockwise degrees).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "epd/core/status.h"
#include "epd/media/image.h"
#include "epd/video/video_decoder.h"

struct AVFrame;
struct AVStream;

namespace epd::internal {

// The orientation of `matrix` (9 entries, or null: none). A degenerate
// matrix (zero scale) reads as the identity, as ffmpeg's autorotate reads it.
VideoOrientation OrientationOfMatrix(const std::int32_t* matrix);

// The orientation of a stream's display matrix (AV_PKT_DATA_DISPLAYMATRIX
// side data), or of a decoded frame's (AV_FRAME_DATA_DISPLAYMATRIX); the
// identity when there is none.
VideoOrientation StreamOrientation(const AVStream* stream);
VideoOrientation FrameOrientation(const AVFrame* frame);

// OK for a quarter turn; else kInvalidArgument naming the angle, and how to
// encode the video as stored instead.
Status CheckQuarterTurn(const VideoOrientation& o);

// `frame` shown as `o` says: mirrored left to right when o.hflip, then
// turned counterclockwise by o.ccw_degrees; a quarter turn swaps width and
// height. REQUIRES: o.quarter_turn, frame.pixels is width * height * 3.
// Cost: one pass over the pixels; the identity returns `frame` unchanged.
RgbImage OrientFrame(RgbImage frame, const VideoOrientation& o);

}  // namespace epd::internal
