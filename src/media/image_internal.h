// src/media/image_internal.h (internal to epd::media): the per-format
// decoders behind epd::ProbeImage / epd::DecodeImage, and the helpers they
// share. image.cc sniffs the format, then calls one Probe/Decode pair below;
// each decoder checks the pixel limit before allocating and returns RGB8 in
// the stored orientation with the alpha policy applied; image.cc applies the
// EXIF orientation last.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "epd/core/status.h"
#include "epd/media/image.h"

namespace epd::internal {

using ByteSpan = std::span<const std::uint8_t>;

StatusOr<ImageInfo> ProbeJpeg(ByteSpan bytes);
StatusOr<RgbImage> DecodeJpeg(ByteSpan bytes, const DecodeLimits& limits, const DecodeOptions& options);
// Pixels DecodeAndPreprocess decodes into and reuses from image to image:
// grown when an image needs more, never zero-filled (the decoder writes
// every byte it hands out). RGB8, width * height * 3 bytes valid.
struct PixelBuffer {
  std::unique_ptr<std::uint8_t[]> data;
  std::size_t capacity = 0;
  int width = 0;  // of the pixels
  int height = 0;
  int stored_width = 0;  // the JPEG's own, before any DCT scaling
  int stored_height = 0;
};

// DecodeJpeg's path without allocation once warm, for DecodeAndPreprocess:
// a 3-channel JPEG is decoded into `out` with this thread's decompressor and
// true returned; a CMYK/YCCK one is left alone and false returned (the
// caller takes DecodeJpeg). Same checks and errors as DecodeJpeg. The pixels
// are in stored orientation. With a `min_size` callback (stored width,
// height -> the least width and height wanted, or {0, 0}), the decode is
// DCT-scaled by the smallest of 1/8, 1/4, 1/2 that keeps both sides at
// least that (PreprocessConfig::jpeg_dct_scaling).
using MinSize = std::pair<int, int> (*)(int width, int height, const void* context);
StatusOr<bool> DecodeJpegRgbInto(ByteSpan bytes, const DecodeLimits& limits, PixelBuffer& out,
                                 MinSize min_size = nullptr, const void* context = nullptr);
StatusOr<ImageInfo> ProbePng(ByteSpan bytes);
StatusOr<RgbImage> DecodePng(ByteSpan bytes, const DecodeLimits& limits, const DecodeOptions& options);
StatusOr<ImageInfo> ProbeWebp(ByteSpan bytes);
StatusOr<RgbImage> DecodeWebp(ByteSpan bytes, const DecodeLimits& limits, const DecodeOptions& options);
StatusOr<ImageInfo> ProbeGif(ByteSpan bytes);
StatusOr<RgbImage> DecodeGif(ByteSpan bytes, const DecodeLimits& limits, const DecodeOptions& options);
StatusOr<ImageInfo> ProbeBmp(ByteSpan bytes);
StatusOr<RgbImage> DecodeBmp(ByteSpan bytes, const DecodeLimits& limits, const DecodeOptions& options);

// "WxH".
std::string Dims(std::int64_t w, std::int64_t h);
// "too many pixels: ..." when width * height > limits.max_pixels.
Status CheckPixelLimit(std::int64_t width, std::int64_t height, const DecodeLimits& limits);
// "corrupt or truncated <format> data: <why>".
Status Corrupt(std::string_view format, std::string_view why);

// Rewrites `n` RGBA pixels in `rgba` as RGB in place (the RGB result occupies
// the first 3 * n bytes; safe because each write lands at or before its
// read): composited per `alpha` when `composite_mode` (the image is one
// Pillow opens as mode "RGBA", see AlphaPolicy), else alpha dropped.
void RgbaToRgbInPlace(std::uint8_t* rgba, std::size_t n, bool composite_mode, const AlphaPolicy& alpha);

// Pillow's paste-with-mask blend of one channel: round((src * a + bg *
// (255 - a)) / 255) computed as Paste.c's DIV255 (exact rounding).
inline std::uint8_t BlendOver(std::uint8_t src, std::uint8_t a, std::uint8_t bg) {
  const unsigned v = unsigned{bg} * (255u - a) + unsigned{src} * a + 128u;
  return static_cast<std::uint8_t>(((v >> 8) + v) >> 8);
}

// EXIF: the Orientation value (1..8) in a TIFF-structured EXIF block
// (optionally prefixed "Exif\0\0"), 1 when absent, malformed or out of range.
int ExifOrientation(ByteSpan exif);
// The orientation in a JPEG's first APP1 "Exif" segment (markers scanned up
// to the first SOS; Pillow keeps the first such segment).
int JpegOrientation(ByteSpan jpeg);
// The orientation in a PNG's eXIf chunk (chunk headers walked to IEND or the
// end of the data; the chunk may follow IDAT, Pillow reads it there too).
int PngOrientation(ByteSpan png);

// Transposes `img` as PIL.Image.transpose does for EXIF orientation 2..8
// (see DecodeOptions). 1 or out of range: unchanged. 5-8 allocate a new
// buffer of the same size.
void ApplyOrientation(RgbImage& img, int orientation);

std::uint32_t ReadBe32(const std::uint8_t* p);
std::uint32_t ReadLe32(const std::uint8_t* p);
std::uint16_t ReadLe16(const std::uint8_t* p);

}  // namespace epd::internal
