// Decoding: format sniffing, the shared checks, EXIF orientation and the
// alpha policy. The per-format decoders live in decode_<format>.cc.
//
// Order of checks, on every path: magic bytes -> header (dimensions) ->
// zero size -> pixel limit -> allocate -> decode -> alpha policy (per row or
// in place) -> EXIF orientation. Nothing proportional to the claimed image
// size is allocated before the limit check, which is what makes a tiny file
// with a huge header harmless.
//
// Orientation is applied after decoding rather than inside each decoder:
// it is one well-tested transform for five formats, and it costs one extra
// RGB buffer only for orientations 5-8 (the flips are done in place).
#include "epd/media/image.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>

#include "image_internal.h"

namespace epd {
namespace internal {

std::string Dims(std::int64_t w, std::int64_t h) { return std::to_string(w) + "x" + std::to_string(h); }

Status CheckPixelLimit(std::int64_t width, std::int64_t height, const DecodeLimits& limits) {
  const std::int64_t pixels = width * height;  // each side < 2^31: no overflow
  if (pixels > limits.max_pixels) {
    return InvalidArgument("too many pixels: the image is " + Dims(width, height) + " = " + std::to_string(pixels) +
                           " pixels, over the decode limit of " + std::to_string(limits.max_pixels) +
                           " pixels (--max-decode-pixels)");
  }
  return Status::Ok();
}

Status Corrupt(std::string_view format, std::string_view why) {
  return InvalidArgument("corrupt or truncated " + std::string(format) + " data: " + std::string(why));
}

void RgbaToRgbInPlace(std::uint8_t* rgba, std::size_t n, bool composite_mode, const AlphaPolicy& alpha) {
  const bool composite = composite_mode && alpha.composite;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t* s = rgba + 4 * i;
    std::uint8_t* d = rgba + 3 * i;
    if (composite) {
      const std::uint8_t a = s[3];
      const std::uint8_t r = BlendOver(s[0], a, alpha.background[0]);
      const std::uint8_t g = BlendOver(s[1], a, alpha.background[1]);
      const std::uint8_t b = BlendOver(s[2], a, alpha.background[2]);
      d[0] = r;
      d[1] = g;
      d[2] = b;
    } else {
      // d <= s, and the three bytes are read before the overlap can matter
      // (memmove semantics).
      std::memmove(d, s, 3);
    }
  }
}

namespace {

// Mirrors each row of a w x h RGB image in place (FLIP_LEFT_RIGHT).
void MirrorRows(std::uint8_t* p, std::size_t w, std::size_t h) {
  for (std::size_t y = 0; y < h; ++y) {
    std::uint8_t* row = p + y * w * 3;
    for (std::size_t x = 0; x < w / 2; ++x) std::swap_ranges(row + x * 3, row + x * 3 + 3, row + (w - 1 - x) * 3);
  }
}

// Reverses the rows of a w x h RGB image in place (FLIP_TOP_BOTTOM).
void FlipRows(std::uint8_t* p, std::size_t w, std::size_t h) {
  for (std::size_t y = 0; y < h / 2; ++y) std::swap_ranges(p + y * w * 3, p + (y + 1) * w * 3, p + (h - 1 - y) * w * 3);
}

// Orientations 5 to 8, which swap the axes: `img` becomes h wide and w
// tall; out(x, y) = in(sx, sy) with, per PIL's Image.transpose:
// 5 TRANSPOSE (y, x); 6 ROTATE_270 (y, h-1-x); 7 TRANSVERSE (w-1-y, h-1-x);
// 8 ROTATE_90 (w-1-y, x).
void Transpose(RgbImage& img, int orientation) {
  const std::size_t w = static_cast<std::size_t>(img.width);
  const std::size_t h = static_cast<std::size_t>(img.height);
  const std::uint8_t* p = img.pixels.data();
  std::vector<std::uint8_t> out(img.pixels.size());
  for (std::size_t y = 0; y < w; ++y) {
    for (std::size_t x = 0; x < h; ++x) {
      const std::size_t sx = orientation == 5 || orientation == 6 ? y : w - 1 - y;
      const std::size_t sy = orientation == 5 || orientation == 8 ? x : h - 1 - x;
      std::memcpy(&out[(y * h + x) * 3], p + (sy * w + sx) * 3, 3);
    }
  }
  img.pixels = std::move(out);
  std::swap(img.width, img.height);
}

}  // namespace

void ApplyOrientation(RgbImage& img, int orientation) {
  const std::size_t w = static_cast<std::size_t>(img.width);
  const std::size_t h = static_cast<std::size_t>(img.height);
  std::uint8_t* p = img.pixels.data();
  switch (orientation) {
    case 2:  // FLIP_LEFT_RIGHT
      MirrorRows(p, w, h);
      return;
    case 3:  // ROTATE_180
      MirrorRows(p, w, h);
      FlipRows(p, w, h);
      return;
    case 4:  // FLIP_TOP_BOTTOM
      FlipRows(p, w, h);
      return;
    case 5:
    case 6:
    case 7:
    case 8:
      Transpose(img, orientation);
      return;
    default:
      return;
  }
}

std::uint32_t ReadBe32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 | p[3];
}
std::uint32_t ReadLe32(const std::uint8_t* p) {
  return std::uint32_t{p[3]} << 24 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[1]} << 8 | p[0];
}
std::uint16_t ReadLe16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | p[1] << 8); }

}  // namespace internal

namespace {

using internal::ByteSpan;

bool StartsWith(ByteSpan bytes, std::string_view prefix) {
  return bytes.size() >= prefix.size() && std::memcmp(bytes.data(), prefix.data(), prefix.size()) == 0;
}

std::string HexPrefix(ByteSpan bytes, std::size_t n) {
  std::string out;
  char buf[4];
  for (std::size_t i = 0; i < bytes.size() && i < n; ++i) {
    std::snprintf(buf, sizeof(buf), i == 0 ? "%02x" : " %02x", bytes[i]);
    out += buf;
  }
  return out;
}

// A human name for common formats we do not decode, to make the error useful.
std::string_view GuessOtherFormat(ByteSpan b) {
  if (StartsWith(b, std::string_view("II*\0", 4)) || StartsWith(b, std::string_view("MM\0*", 4))) return "TIFF";
  if (b.size() >= 12 && std::memcmp(b.data() + 4, "ftyp", 4) == 0) return "HEIF/AVIF/MP4";
  if (StartsWith(b, std::string_view("\0\0\0\x0cjP  ", 8))) return "JPEG 2000";
  return "";
}

Status UnsupportedFormat(ByteSpan bytes) {
  std::string msg = "unsupported image format: first bytes [" + HexPrefix(bytes, 8) + "]";
  if (auto name = GuessOtherFormat(bytes); !name.empty()) {
    msg += " look like ";
    msg += name;
  }
  msg += "; supported: JPEG (ff d8 ff), PNG (89 50 4e 47), WebP (RIFF....WEBP), GIF (GIF87a/GIF89a), BMP (BM)";
  return InvalidArgument(std::move(msg));
}

enum class Sniffed { kJpeg, kPng, kWebp, kGif, kBmp, kOther };

Sniffed Sniff(ByteSpan bytes) {
  // Short prefixes on purpose: a mangled rest of the signature gets the
  // format's own "corrupt" message rather than "unsupported format".
  if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff) return Sniffed::kJpeg;
  if (StartsWith(bytes, "\x89PNG")) return Sniffed::kPng;
  if (StartsWith(bytes, "RIFF") && bytes.size() >= 12 && std::memcmp(bytes.data() + 8, "WEBP", 4) == 0) {
    return Sniffed::kWebp;
  }
  if (StartsWith(bytes, "GIF87a") || StartsWith(bytes, "GIF89a")) return Sniffed::kGif;
  if (StartsWith(bytes, "BM")) return Sniffed::kBmp;
  return Sniffed::kOther;
}

}  // namespace

std::string_view ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "jpeg";
    case ImageFormat::kPng:
      return "png";
    case ImageFormat::kWebp:
      return "webp";
    case ImageFormat::kGif:
      return "gif";
    case ImageFormat::kBmp:
      return "bmp";
  }
  return "unknown";
}

StatusOr<AlphaPolicy> ParseAlphaPolicy(std::string_view text) {
  if (text == "white") return AlphaPolicy{};
  if (text == "none") return AlphaPolicy{.composite = false, .background = {0, 0, 0}};
  AlphaPolicy policy;
  std::string_view rest = text;
  for (int c = 0; c < 3; ++c) {
    const std::size_t comma = rest.find(',');
    const std::string_view part = c < 2 ? rest.substr(0, comma) : rest;
    unsigned value = 256;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size() || value > 255 ||
        (c < 2 && comma == std::string_view::npos)) {
      return InvalidArgument("rgba background '" + std::string(text) +
                             "' is not 'white', 'none' or 'R,G,B' with each 0..255");
    }
    policy.background[c] = static_cast<std::uint8_t>(value);
    if (c < 2) rest = rest.substr(comma + 1);
  }
  return policy;
}

std::string AlphaPolicyName(const AlphaPolicy& policy) {
  if (!policy.composite) return "none";
  const auto& b = policy.background;
  if (b[0] == 255 && b[1] == 255 && b[2] == 255) return "white";
  return std::to_string(b[0]) + "," + std::to_string(b[1]) + "," + std::to_string(b[2]);
}

Status CheckDecodeLimits(const ImageInfo& info, const DecodeLimits& limits) {
  return internal::CheckPixelLimit(info.width, info.height, limits);
}

StatusOr<ImageInfo> ProbeImage(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return InvalidArgument("empty input: no image bytes");
  switch (Sniff(bytes)) {
    case Sniffed::kJpeg:
      return internal::ProbeJpeg(bytes);
    case Sniffed::kPng:
      return internal::ProbePng(bytes);
    case Sniffed::kWebp:
      return internal::ProbeWebp(bytes);
    case Sniffed::kGif:
      return internal::ProbeGif(bytes);
    case Sniffed::kBmp:
      return internal::ProbeBmp(bytes);
    case Sniffed::kOther:
      break;
  }
  return UnsupportedFormat(bytes);
}

StatusOr<RgbImage> DecodeImage(std::span<const std::uint8_t> bytes, const DecodeLimits& limits,
                               const DecodeOptions& options) {
  if (limits.max_pixels <= 0) {
    return InvalidArgument("DecodeLimits.max_pixels must be positive, got " + std::to_string(limits.max_pixels));
  }
  if (bytes.empty()) return InvalidArgument("empty input: no image bytes");
  StatusOr<RgbImage> img = UnsupportedFormat(bytes);
  int orientation = 1;
  switch (Sniff(bytes)) {
    case Sniffed::kJpeg:
      img = internal::DecodeJpeg(bytes, limits, options);
      if (options.apply_exif_orientation) orientation = internal::JpegOrientation(bytes);
      break;
    case Sniffed::kPng:
      img = internal::DecodePng(bytes, limits, options);
      if (options.apply_exif_orientation) orientation = internal::PngOrientation(bytes);
      break;
    case Sniffed::kWebp: {
      img = internal::DecodeWebp(bytes, limits, options);
      if (img.ok() && options.apply_exif_orientation) {
        auto info = internal::ProbeWebp(bytes);
        if (info.ok()) orientation = info->orientation;
      }
      break;
    }
    case Sniffed::kGif:  // no EXIF in GIF or BMP
      img = internal::DecodeGif(bytes, limits, options);
      break;
    case Sniffed::kBmp:
      img = internal::DecodeBmp(bytes, limits, options);
      break;
    case Sniffed::kOther:
      break;
  }
  if (img.ok()) internal::ApplyOrientation(*img, orientation);
  return img;
}

}  // namespace epd
