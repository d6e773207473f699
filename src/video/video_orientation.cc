// See video_orientation.h.
#include "video_orientation.h"

extern "C" {
#include <libavformat/avformat.h>
#include <libavutil/display.h>
#include <libavutil/frame.h>
}

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

namespace epd::internal {
namespace {

// FFmpeg side data `data` of `size` bytes as a display matrix, or null.
const std::int32_t* DisplayMatrix(const std::uint8_t* data, std::size_t size) {
  return data != nullptr && size >= 9 * sizeof(std::int32_t) ? reinterpret_cast<const std::int32_t*>(data) : nullptr;
}

}  // namespace

VideoOrientation OrientationOfMatrix(const std::int32_t* matrix) {
  VideoOrientation o;
  if (matrix == nullptr) return o;
  std::int32_t m[9];
  std::memcpy(m, matrix, sizeof(m));
  const double det = static_cast<double>(m[0]) * m[4] - static_cast<double>(m[1]) * m[3];
  if (det == 0) return o;
  // Mirrored: M = R * F with F = (x -> -x), so R is M with its first row
  // (a, b: the image of the x axis) negated.
  o.hflip = det < 0;
  if (o.hflip) {
    m[0] = -m[0];
    m[1] = -m[1];
  }
  const double ccw = av_display_rotation_get(m);
  if (!std::isfinite(ccw)) return VideoOrientation{};
  const double quarters = std::round(ccw / 90.0);
  o.quarter_turn = std::fabs(ccw - 90.0 * quarters) <= 1.0;
  const long degrees = o.quarter_turn ? std::lround(quarters) * 90 : std::lround(ccw);
  o.ccw_degrees = static_cast<int>(((degrees % 360) + 360) % 360);
  return o;
}

VideoOrientation StreamOrientation(const AVStream* stream) {
  std::size_t size = 0;
  const std::uint8_t* data = av_stream_get_side_data(stream, AV_PKT_DATA_DISPLAYMATRIX, &size);
  return OrientationOfMatrix(DisplayMatrix(data, size));
}

VideoOrientation FrameOrientation(const AVFrame* frame) {
  const AVFrameSideData* sd = av_frame_get_side_data(frame, AV_FRAME_DATA_DISPLAYMATRIX);
  return sd == nullptr ? VideoOrientation{} : OrientationOfMatrix(DisplayMatrix(sd->data, sd->size));
}

Status CheckQuarterTurn(const VideoOrientation& o) {
  if (o.quarter_turn) return Status::Ok();
  return InvalidArgument("the video's display matrix turns it by " + std::to_string(o.ccw_degrees) +
                         " degrees, not a multiple of 90: only quarter turns and flips are applied (send the "
                         "video with rotation off to encode it as stored)");
}

RgbImage OrientFrame(RgbImage frame, const VideoOrientation& o) {
  if (o.identity()) return frame;
  const int q = o.ccw_degrees / 90;
  const std::int64_t w = frame.width, h = frame.height;
  RgbImage out;
  out.width = (q % 2 == 1) ? frame.height : frame.width;
  out.height = (q % 2 == 1) ? frame.width : frame.height;
  out.pixels.resize(frame.pixels.size());
  // Each shown pixel (X, Y) reads the stored pixel the turn, then the flip,
  // brought there (the inverse of: flip x, then turn q times by 90 degrees
  // counterclockwise, y down).
  for (std::int64_t y_out = 0; y_out < out.height; ++y_out) {
    for (std::int64_t x_out = 0; x_out < out.width; ++x_out) {
      std::int64_t x = x_out, y = y_out;
      switch (q) {
        case 1:
          x = w - 1 - y_out;
          y = x_out;
          break;
        case 2:
          x = w - 1 - x_out;
          y = h - 1 - y_out;
          break;
        case 3:
          x = y_out;
          y = h - 1 - x_out;
          break;
        default:
          break;
      }
      if (o.hflip) x = w - 1 - x;
      const std::uint8_t* src = frame.pixels.data() + (y * w + x) * 3;
      std::uint8_t* dst = out.pixels.data() + (y_out * out.width + x_out) * 3;
      dst[0] = src[0];
      dst[1] = src[1];
      dst[2] = src[2];
    }
  }
  return out;
}

}  // namespace epd::internal
