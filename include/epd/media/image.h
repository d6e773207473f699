// epd/media/image.h: decoding encoded images (JPEG, PNG, WebP, GIF, BMP) into
// interleaved RGB8, with the pixel values Pillow-based engines see.
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
//
// Parity target. The prefill engines behind the encode stage (vLLM, SGLang,
// transformers' load_image) open images with Pillow, apply
// ImageOps.exif_transpose, and convert to RGB (vLLM composites mode-RGBA
// images onto a background first). Their encoder's embeddings are compared
// with ours, so we reproduce Pillow's pixel values, including its quirks;
// the per-format, per-mode table is in docs/KEYS_AND_PREPROCESSING.md and the
// differential test tests/python/test_pillow_parity.py checks it against
// Debian's Pillow 9.4. In short:
//   - grayscale, palette and 1-bit images are expanded as convert("RGB");
//   - 16-bit samples keep their high byte (Pillow's ";16B" raw modes), except
//     16-bit grayscale without alpha, which Pillow opens as mode "I" and
//     clips to 0..255 on convert("RGB") (values >= 255 become white);
//   - no colour management: gAMA, cHRM, iCCP and sRGB chunks and embedded ICC
//     profiles are ignored, as Pillow ignores them;
//   - CMYK and YCCK JPEGs are read with Adobe (inverted) polarity and
//     converted with Pillow's cmyk2rgb formula (Pillow 9.4 assumes the Adobe
//     convention for every 4-channel JPEG, marker or not);
//   - alpha: see AlphaPolicy;
//   - EXIF orientation: see DecodeOptions::apply_exif_orientation.
//
// Errors (all StatusCode::kInvalidArgument, the message names the problem):
//   "empty input", "unsupported image format (...)" with the magic bytes seen,
//   "corrupt or truncated <FORMAT> data: <library message>",
//   "zero-sized image", "too many pixels: WxH ... limit N",
//   "unsupported <FORMAT> ...: <feature>" (e.g. BMP RLE compression).
// Truncated images are errors (a half-grey JPEG must not be cached as a real
// one), where Pillow raises "image file is truncated" too.
//
// Libraries: libjpeg-turbo's TurboJPEG API (accurate integer IDCT and fancy
// upsampling, the libjpeg defaults Pillow also uses), libpng's regular API
// (no gamma transformation requested), libwebp with libwebpdemux, giflib,
// and a small BMP reader of our own (src/media/decode_bmp.cc says why).
//
// Memory (peak, per decode, W x H the stored size): the RGB output, 3 B/px;
// plus 1 B/px for WebP and 4-channel JPEG (decoded as RGBA or CMYK and
// compacted in place); plus the transformed rows of an interlaced PNG
// (3 to 8 B/px); plus 3 B/px while EXIF orientations 5-8 transpose into a new
// buffer; plus libjpeg's coefficient buffer for progressive JPEGs (about 2 B
// per component sample). The worst case is about 12 B/px (a progressive
// 4:4:4 CMYK JPEG), 2.1 GB at the default limit of 178,956,970 pixels; a
// 12000x9000 baseline JPEG measured 325 MB peak RSS, progressive 641 MB
// (docs/KEYS_AND_PREPROCESSING.md).
//
// Complexity: O(width * height) time. Thread safety: the functions are
// thread-safe (no shared state; each call creates its own decoder).
//
// Example:
//   auto info = epd::ProbeImage(bytes);              // cheap: header only
//   if (!info.ok()) return info.status();
//   auto img = epd::DecodeImage(bytes, {.max_pixels = 40'000'000});
//   if (!img.ok()) return img.status();
//   use(img->width, img->height, img->pixels.data());
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/status.h"

namespace epd {

// Values are stable (they name formats in metrics and tests): never renumber.
enum class ImageFormat : std::uint8_t { kJpeg = 0, kPng = 1, kWebp = 2, kGif = 3, kBmp = 4 };

// "jpeg", "png", "webp", "gif" or "bmp".
std::string_view ImageFormatName(ImageFormat format);

// What the header says, without decoding pixels.
struct ImageInfo {
  ImageFormat format = ImageFormat::kJpeg;
  int width = 0;   // pixels as stored, > 0 (GIF: the logical screen grown to
  int height = 0;  // hold the first frame, as Pillow sizes it)
  // EXIF Orientation (tag 0x0112 of IFD0): 1..8, 1 when absent, unreadable
  // or out of range (Pillow's exif_transpose ignores other values too).
  int orientation = 1;

  // The size after EXIF orientation when `apply` is set: orientations 5-8
  // (transpose, rotate 90/270, transverse) swap the sides.
  int DisplayWidth(bool apply) const { return apply && orientation >= 5 ? height : width; }
  int DisplayHeight(bool apply) const { return apply && orientation >= 5 ? width : height; }
};

// An owned, interleaved RGB8 image (see the header comment for the layout).
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> pixels;  // width * height * 3 bytes
};

// PIL.Image.MAX_IMAGE_PIXELS (Pillow 9.4, PIL/Image.py): above it Pillow
// warns; above twice it, Image.open raises DecompressionBombError.
inline constexpr std::int64_t kPillowMaxImagePixels = 89'478'485;
inline constexpr std::int64_t kDefaultMaxDecodePixels = 2 * kPillowMaxImagePixels;

struct DecodeLimits {
  // Largest stored width * height accepted (decompression-bomb guard).
  // Default: Pillow's error threshold, 178,956,970 pixels (512 MiB of RGB8),
  // so whatever a Pillow-based engine opens, we open. Not part of the content
  // key: it decides only whether an image is accepted, never its pixels.
  // Must be > 0.
  std::int64_t max_pixels = kDefaultMaxDecodePixels;
};

// What happens to the alpha channel of images Pillow opens in mode "RGBA":
// PNG colour type 6 (8 or 16 bit) and 16-bit gray+alpha, WebP with the alpha
// flag, 32-bit BMP whose bit masks include alpha. vLLM composites exactly
// those onto a background colour, white by default, and converts every other
// mode with plain convert("RGB"), so LA PNGs, tRNS transparency (palette,
// gray, RGB) and GIF transparency are always dropped, as convert("RGB") does.
struct AlphaPolicy {
  // true: out = round((src * a + background * (255 - a)) / 255) per channel,
  // Pillow's paste-with-mask blend (Paste.c). false: alpha is dropped.
  bool composite = true;
  std::array<std::uint8_t, 3> background{255, 255, 255};  // R, G, B

  friend bool operator==(const AlphaPolicy&, const AlphaPolicy&) = default;
};

// Parses the CLI spelling: "white" (composite on 255,255,255), "none" (drop
// alpha, as convert("RGB")) or "R,G,B" with each 0..255.
// Errors (kInvalidArgument): anything else, naming the text.
StatusOr<AlphaPolicy> ParseAlphaPolicy(std::string_view text);
// The inverse: "white", "none" or "R,G,B".
std::string AlphaPolicyName(const AlphaPolicy& policy);

// How encoded bytes become RGB pixels. Every field changes the pixels, so the
// whole struct is part of the content key (PreprocessConfig::decode).
struct DecodeOptions {
  // Apply the EXIF Orientation tag (JPEG APP1 "Exif", PNG eXIf chunk, WebP
  // EXIF chunk) as PIL.ImageOps.exif_transpose does: 2 mirror, 3 rotate 180,
  // 4 flip, 5 transpose, 6 rotate 90 clockwise, 7 transverse, 8 rotate 90
  // counter-clockwise. Default on: transformers' load_image, current vLLM and
  // SGLang all apply it, and a phone photo is otherwise seen sideways.
  // Not read: XMP tiff:Orientation and PNG "Raw profile type exif" text
  // chunks (Pillow reads those too; both are rare).
  bool apply_exif_orientation = true;
  AlphaPolicy alpha{};

  friend bool operator==(const DecodeOptions&, const DecodeOptions&) = default;
};

// The decode limit check DecodeImage applies, for callers that have only
// the header (e.g. to refuse an image before queueing it): kInvalidArgument
// "too many pixels: the image is WxH = N pixels, over the decode limit of M
// pixels (--max-decode-pixels)" when info.width * info.height >
// limits.max_pixels.
Status CheckDecodeLimits(const ImageInfo& info, const DecodeLimits& limits);

// Identifies the format by its magic bytes and reads width, height and the
// EXIF orientation from the headers (JPEG markers up to the first scan, PNG
// chunk headers, WebP chunk headers, GIF blocks up to the first image
// descriptor). Does not decode pixel data and applies no pixel limit.
// Errors: empty, unknown format, zero size, corrupt header.
StatusOr<ImageInfo> ProbeImage(std::span<const std::uint8_t> bytes);

// Decodes into RGB8 with `options` applied (orientation, then alpha policy;
// the result's width/height are the displayed ones). Checks the stored
// width * height <= limits.max_pixels before allocating. Never crashes on
// arbitrary input.
StatusOr<RgbImage> DecodeImage(std::span<const std::uint8_t> bytes, const DecodeLimits& limits = {},
                               const DecodeOptions& options = {});

}  // namespace epd
