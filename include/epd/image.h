// epd/image.h: decoding encoded images (JPEG, PNG) into interleaved RGB8.
//
// This is the untrusted-input edge of the encode path: every byte string a
// client sends passes through here, so the contract is "never crash, never
// allocate more than the limit, say what is wrong". Dimensions are read from
// the header and checked against DecodeLimits BEFORE any pixel buffer is
// allocated, so a 100000x100000 header in a 100-byte file (a decompression
// bomb) is rejected without touching memory.
//
// Output: RgbImage, pixels row-major, interleaved R,G,B, one uint8 each:
//   pixels.size() == width * height * 3, pixel (x, y) channel c at
//   pixels[(y * width + x) * 3 + c].
// Conversions (matching PIL's Image.convert("RGB"), which the Qwen2-VL
// Hugging Face image processor applies):
//   - grayscale (JPEG or PNG) is replicated to R=G=B;
//   - palette PNG is expanded through its palette;
//   - an alpha channel (PNG RGBA, gray+alpha, palette with tRNS) is dropped,
//     not composited;
//   - 16-bit PNG samples are reduced to 8 bits and treated as sRGB-encoded
//     (not linear) when the file has no gAMA chunk, as PIL does. A PNG that
//     does carry a non-sRGB gAMA chunk is converted to sRGB by libpng (PIL
//     would ignore the chunk); this is rare and the difference is documented.
//   - CMYK/YCCK JPEGs are rejected with a clear error: their inversion
//     convention (Adobe APP14) varies between writers and a wrong guess would
//     silently produce a negative image.
//
// Errors (all StatusCode::kInvalidArgument, the message names the problem):
//   "empty input", "unsupported image format (...)" with the magic bytes seen,
//   "corrupt or truncated JPEG/PNG data: <library message>",
//   "zero-sized image", "too many pixels: WxH ... limit N",
//   "unsupported JPEG colour space: CMYK ...".
// Truncated JPEGs are errors: libjpeg-turbo's "premature end of data" warning
// is promoted to an error rather than returning a half-grey image.
//
// Libraries: libjpeg-turbo's TurboJPEG API (decode flags: accurate integer
// IDCT and fancy upsampling, the libjpeg defaults PIL also uses) and libpng's
// simplified API.
//
// Complexity: O(width * height) time; memory one output buffer (plus, for
// PNGs with alpha, a transient RGBA buffer 4/3 its size).
// Thread safety: the functions are thread-safe (no shared state; each call
// creates its own decoder).
//
// Example:
//   auto info = epd::ProbeImage(bytes);              // cheap: header only
//   if (!info.ok()) return info.status();
//   auto img = epd::DecodeImage(bytes, {.max_pixels = 40'000'000});
//   if (!img.ok()) return img.status();
//   use(img->width, img->height, img->pixels.data());
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "epd/status.h"

namespace epd {

enum class ImageFormat : std::uint8_t { kJpeg = 0, kPng = 1 };

// "jpeg" or "png".
std::string_view ImageFormatName(ImageFormat format);

// What the header says, without decoding pixels.
struct ImageInfo {
  ImageFormat format = ImageFormat::kJpeg;
  int width = 0;   // pixels, > 0
  int height = 0;  // pixels, > 0
};

// An owned, interleaved RGB8 image (see the header comment for the layout).
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> pixels;  // width * height * 3 bytes
};

struct DecodeLimits {
  // Largest width * height accepted (decompression-bomb guard). Default 64 M
  // pixels = 192 MiB of RGB8, far above what Qwen2-VL's max_pixels keeps
  // (about 1 M) but below what a single request should be able to allocate.
  // Must be > 0.
  std::int64_t max_pixels = 64'000'000;
};

// Identifies the format by its magic bytes and reads width/height from the
// header. Does not decode pixel data and applies no pixel limit. A zero-sized
// header is an error.
StatusOr<ImageInfo> ProbeImage(std::span<const std::uint8_t> bytes);

// The decompression-bomb guard, the one place it is written: OK when
// width * height <= limits.max_pixels, else kInvalidArgument ("too many
// pixels: the image is WxH = N pixels, over the decode limit of L pixels").
Status CheckPixelLimit(int width, int height, const DecodeLimits& limits);

// Decodes a JPEG or PNG into RGB8. Checks width * height <= limits.max_pixels
// (CheckPixelLimit) before allocating. Never crashes on arbitrary input.
StatusOr<RgbImage> DecodeImage(std::span<const std::uint8_t> bytes, const DecodeLimits& limits = {});

}  // namespace epd
