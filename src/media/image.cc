// Decoding JPEG and PNG into RGB8.
//
// Order of checks, on every path: magic bytes -> header (dimensions) ->
// zero size -> pixel limit -> allocate -> decode. Nothing proportional to the
// claimed image size is allocated before the limit check, which is what makes
// a tiny file with a huge header harmless.
//
// Both libraries report failures through setjmp/longjmp inside their own C
// frames (TurboJPEG and libpng's simplified API each catch their own), so no
// longjmp crosses a C++ frame here.
#include "epd/image.h"

#include <png.h>
#include <turbojpeg.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

namespace epd {
namespace {

constexpr std::array<std::uint8_t, 8> kPngSignature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
// Signature, IHDR length and type, 13 bytes of IHDR data, CRC.
constexpr std::size_t kPngHeaderBytes = 8 + 8 + 13 + 4;

bool StartsWith(std::span<const std::uint8_t> bytes, std::string_view prefix) {
  return bytes.size() >= prefix.size() && std::memcmp(bytes.data(), prefix.data(), prefix.size()) == 0;
}

std::string HexPrefix(std::span<const std::uint8_t> bytes, std::size_t n) {
  std::string out;
  char buf[4];
  for (std::size_t i = 0; i < bytes.size() && i < n; ++i) {
    std::snprintf(buf, sizeof(buf), i == 0 ? "%02x" : " %02x", bytes[i]);
    out += buf;
  }
  return out;
}

// A human name for common formats we do not decode, to make the error useful.
std::string_view GuessOtherFormat(std::span<const std::uint8_t> b) {
  if (StartsWith(b, "GIF87a") || StartsWith(b, "GIF89a")) return "GIF";
  if (StartsWith(b, "RIFF") && b.size() >= 12 && std::memcmp(b.data() + 8, "WEBP", 4) == 0) return "WebP";
  if (StartsWith(b, "BM")) return "BMP";
  if (StartsWith(b, std::string_view("II*\0", 4)) || StartsWith(b, std::string_view("MM\0*", 4))) return "TIFF";
  if (b.size() >= 12 && std::memcmp(b.data() + 4, "ftyp", 4) == 0) return "HEIF/AVIF/MP4";
  return "";
}

Status UnsupportedFormat(std::span<const std::uint8_t> bytes) {
  std::string msg = "unsupported image format: first bytes [" + HexPrefix(bytes, 8) + "]";
  if (auto name = GuessOtherFormat(bytes); !name.empty()) {
    msg += " look like ";
    msg += name;
  }
  msg += "; only JPEG (ff d8 ff) and PNG (89 50 4e 47) are supported";
  return InvalidArgument(std::move(msg));
}

std::string Dims(std::int64_t w, std::int64_t h) { return std::to_string(w) + "x" + std::to_string(h); }

// ---- JPEG (TurboJPEG) ------------------------------------------------------

struct TjDeleter {
  void operator()(void* h) const { tjDestroy(h); }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

StatusOr<TjHandle> NewJpegDecoder() {
  TjHandle h(tjInitDecompress());
  if (!h) return Internal(std::string("TurboJPEG: cannot create a decompressor: ") + tjGetErrorStr2(nullptr));
  return h;
}

StatusOr<ImageInfo> ProbeJpeg(void* tj, std::span<const std::uint8_t> bytes) {
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), &width, &height, &subsamp,
                          &colorspace) != 0) {
    std::string why = tjGetErrorStr2(tj);
    // libjpeg reports a 0 dimension in SOF as "Empty JPEG image".
    if (why.find("Empty JPEG image") != std::string::npos) {
      return InvalidArgument("zero-sized image: the JPEG header has a zero dimension (" + why + ")");
    }
    // libjpeg refuses a side over JPEG_MAX_DIMENSION (65500) before it says
    // how large: such a header is a bomb like any other, not corrupt data.
    if (why.find("Maximum supported image dimension") != std::string::npos) {
      return InvalidArgument("too many pixels: the JPEG header declares a side over 65500 pixels, the most libjpeg "
                             "decodes (" + why + ")");
    }
    return InvalidArgument("corrupt or truncated JPEG data: " + why);
  }
  if (width <= 0 || height <= 0) {
    return InvalidArgument("zero-sized image: the JPEG header says " + Dims(width, height));
  }
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    return InvalidArgument(std::string("unsupported JPEG colour space: ") +
                           (colorspace == TJCS_CMYK ? "CMYK" : "YCCK (CMYK stored as YCC)") +
                           "; convert the image to RGB or grayscale");
  }
  return ImageInfo{ImageFormat::kJpeg, width, height};
}

StatusOr<RgbImage> DecodeJpeg(std::span<const std::uint8_t> bytes, const DecodeLimits& limits) {
  auto tj = NewJpegDecoder();
  if (!tj.ok()) return tj.status();
  auto info = ProbeJpeg(tj->get(), bytes);
  if (!info.ok()) return info.status();
  if (Status s = CheckPixelLimit(info->width, info->height, limits); !s.ok()) return s;

  RgbImage img;
  img.width = info->width;
  img.height = info->height;
  img.pixels.resize(static_cast<std::size_t>(img.width) * img.height * 3);
  // STOPONWARNING: libjpeg only *warns* on premature end of data and pads
  // the rest with grey; a half-grey image must not be cached as a real one.
  // LIMITSCANS: caps progressive scans (500), a cheap CPU-exhaustion guard.
  const int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
  if (tjDecompress2(tj->get(), bytes.data(), static_cast<unsigned long>(bytes.size()), img.pixels.data(), img.width,
                    img.width * 3, img.height, TJPF_RGB, flags) != 0) {
    return InvalidArgument(std::string("corrupt or truncated JPEG data: ") + tjGetErrorStr2(tj->get()));
  }
  return img;
}

// ---- PNG (libpng simplified API) -------------------------------------------

std::uint32_t ReadBe32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 | p[3];
}

// Reads IHDR by hand: libpng folds "width is zero" into a generic "Invalid
// IHDR data", and we want the zero size named.
StatusOr<ImageInfo> ParsePngHeader(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < kPngSignature.size() ||
      std::memcmp(bytes.data(), kPngSignature.data(), kPngSignature.size()) != 0) {
    return InvalidArgument("corrupt or truncated PNG data: bad 8-byte signature [" + HexPrefix(bytes, 8) + "]");
  }
  if (bytes.size() < kPngHeaderBytes) {
    return InvalidArgument("corrupt or truncated PNG data: " + std::to_string(bytes.size()) +
                           " bytes, the IHDR header alone needs " + std::to_string(kPngHeaderBytes));
  }
  const std::uint8_t* ihdr = bytes.data() + 8;
  if (ReadBe32(ihdr) != 13 || std::memcmp(ihdr + 4, "IHDR", 4) != 0) {
    return InvalidArgument("corrupt or truncated PNG data: the first chunk is not a 13-byte IHDR");
  }
  const std::uint32_t width = ReadBe32(ihdr + 8);
  const std::uint32_t height = ReadBe32(ihdr + 12);
  if (width == 0 || height == 0) {
    return InvalidArgument("zero-sized image: the PNG header says " + Dims(width, height));
  }
  constexpr std::uint32_t kMax = std::numeric_limits<std::int32_t>::max();  // PNG spec limit
  if (width > kMax || height > kMax) {
    return InvalidArgument("corrupt or truncated PNG data: header size " + Dims(width, height) +
                           " exceeds the PNG limit of 2^31-1");
  }
  return ImageInfo{ImageFormat::kPng, static_cast<int>(width), static_cast<int>(height)};
}

// Owns a png_image between begin_read and finish/free.
class PngReader {
 public:
  PngReader() {
    std::memset(&image_, 0, sizeof(image_));
    image_.version = PNG_IMAGE_VERSION;
  }
  ~PngReader() { png_image_free(&image_); }  // no-op once finish_read ran
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;

  Status Begin(std::span<const std::uint8_t> bytes) {
    if (!png_image_begin_read_from_memory(&image_, bytes.data(), bytes.size())) return Failed();
    return Status::Ok();
  }
  png_image& image() { return image_; }
  Status Failed() const { return InvalidArgument(std::string("corrupt or truncated PNG data: ") + image_.message); }

 private:
  png_image image_;
};

StatusOr<ImageInfo> ProbePng(std::span<const std::uint8_t> bytes) {
  auto info = ParsePngHeader(bytes);
  if (!info.ok()) return info;
  PngReader reader;  // validates IHDR fields and chunk CRCs up to the first IDAT
  if (Status s = reader.Begin(bytes); !s.ok()) return s;
  return info;
}

StatusOr<RgbImage> DecodePng(std::span<const std::uint8_t> bytes, const DecodeLimits& limits) {
  auto info = ParsePngHeader(bytes);
  if (!info.ok()) return info.status();
  if (Status s = CheckPixelLimit(info->width, info->height, limits); !s.ok()) return s;

  PngReader reader;
  if (Status s = reader.Begin(bytes); !s.ok()) return s;
  png_image& image = reader.image();
  if (image.width != static_cast<png_uint_32>(info->width) || image.height != static_cast<png_uint_32>(info->height)) {
    return InvalidArgument("corrupt or truncated PNG data: inconsistent IHDR");
  }
  // Alpha is read, then dropped below, because asking libpng for RGB would
  // composite onto a background, which PIL's convert("RGB") does not do.
  const bool has_alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  image.format = has_alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB;
  // Without this, 16-bit data lacking gAMA is taken as linear and gamma-
  // encoded on the way to 8 bits; PIL takes it as sRGB.
  image.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;

  const std::size_t channels = has_alpha ? 4 : 3;
  const std::size_t npix = static_cast<std::size_t>(info->width) * static_cast<std::size_t>(info->height);
  std::vector<std::uint8_t> buf(npix * channels);
  if (!png_image_finish_read(&image, /*background=*/nullptr, buf.data(), /*row_stride=*/0,
                             /*colormap=*/nullptr) ||
      (image.warning_or_error & PNG_IMAGE_ERROR) != 0) {
    return reader.Failed();
  }

  RgbImage img;
  img.width = info->width;
  img.height = info->height;
  if (!has_alpha) {
    img.pixels = std::move(buf);
  } else {
    img.pixels.resize(npix * 3);
    for (std::size_t i = 0; i < npix; ++i) std::memcpy(&img.pixels[3 * i], &buf[4 * i], 3);
  }
  return img;
}

enum class Sniffed { kJpeg, kPng, kOther };

Sniffed Sniff(std::span<const std::uint8_t> bytes) {
  // JPEG: SOI (ff d8) followed by a marker's ff. PNG: "\x89PNG"; the rest of
  // the signature is checked by ParsePngHeader, so a mangled signature gets a
  // PNG-specific message.
  if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff) return Sniffed::kJpeg;
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), kPngSignature.data(), 4) == 0) return Sniffed::kPng;
  return Sniffed::kOther;
}

}  // namespace

std::string_view ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "jpeg";
    case ImageFormat::kPng:
      return "png";
  }
  return "unknown";
}

Status CheckPixelLimit(int width, int height, const DecodeLimits& limits) {
  const std::int64_t pixels = std::int64_t{width} * height;
  if (pixels > limits.max_pixels) {
    return InvalidArgument("too many pixels: the image is " + Dims(width, height) + " = " + std::to_string(pixels) +
                           " pixels, over the decode limit of " + std::to_string(limits.max_pixels) + " pixels");
  }
  return Status::Ok();
}

StatusOr<ImageInfo> ProbeImage(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return InvalidArgument("empty input: no image bytes");
  switch (Sniff(bytes)) {
    case Sniffed::kJpeg: {
      auto tj = NewJpegDecoder();
      if (!tj.ok()) return tj.status();
      return ProbeJpeg(tj->get(), bytes);
    }
    case Sniffed::kPng:
      return ProbePng(bytes);
    case Sniffed::kOther:
      break;
  }
  return UnsupportedFormat(bytes);
}

StatusOr<RgbImage> DecodeImage(std::span<const std::uint8_t> bytes, const DecodeLimits& limits) {
  if (limits.max_pixels <= 0) {
    return InvalidArgument("DecodeLimits.max_pixels must be positive, got " + std::to_string(limits.max_pixels));
  }
  if (bytes.empty()) return InvalidArgument("empty input: no image bytes");
  switch (Sniff(bytes)) {
    case Sniffed::kJpeg:
      return DecodeJpeg(bytes, limits);
    case Sniffed::kPng:
      return DecodePng(bytes, limits);
    case Sniffed::kOther:
      break;
  }
  return UnsupportedFormat(bytes);
}

}  // namespace epd
