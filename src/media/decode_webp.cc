// WebP through libwebp (decoder) and libwebpdemux (container, animation,
// EXIF chunk).
//
// Pillow 9.4 opens every WebP with libwebp's WebPAnimDecoder and keeps the
// first frame; its mode is "RGBA" when the container's ALPHA flag is set
// (WebPDemuxGetI(WEBP_FF_FORMAT_FLAGS) & ALPHA_FLAG) and "RGB" otherwise. For
// frame 1 WebPAnimDecoder zero-fills an RGBA canvas (transparent black) and
// decodes the frame into it at its offset without blending; we do exactly
// that, without the decoder's second canvas, so a still image and an
// animation's first frame both come out as Pillow's.
//
// The canvas size is read from the first chunk by hand (VP8X, VP8L or VP8)
// and checked against the limit before libwebp sees the data, so a VP8X
// header claiming 100000x100000 is "too many pixels", not a generic error.
#include <webp/decode.h>
#include <webp/demux.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "image_internal.h"

namespace epd::internal {
namespace {

struct WebpHeader {
  std::uint32_t width = 0;
  std::uint32_t height = 0;
  bool extended = false;  // VP8X: may carry EXIF, animation, ALPHA flag
};

std::uint32_t ReadLe24(const std::uint8_t* p) { return p[0] | p[1] << 8 | std::uint32_t{p[2]} << 16; }

StatusOr<WebpHeader> ParseWebpHeader(ByteSpan b) {
  // RIFF header (12) + first chunk header (8) + the fields we read.
  if (b.size() < 30) return Corrupt("WebP", std::to_string(b.size()) + " bytes is too short for a WebP header");
  const std::uint8_t* chunk = b.data() + 12;
  const std::uint8_t* payload = chunk + 8;
  WebpHeader h;
  if (std::memcmp(chunk, "VP8X", 4) == 0) {
    h.extended = true;
    h.width = ReadLe24(payload + 4) + 1;
    h.height = ReadLe24(payload + 7) + 1;
  } else if (std::memcmp(chunk, "VP8L", 4) == 0) {
    if (payload[0] != 0x2f) return Corrupt("WebP", "bad VP8L signature");
    const std::uint32_t bits = ReadLe32(payload + 1);
    h.width = (bits & 0x3fff) + 1;
    h.height = ((bits >> 14) & 0x3fff) + 1;
  } else if (std::memcmp(chunk, "VP8 ", 4) == 0) {
    if (payload[3] != 0x9d || payload[4] != 0x01 || payload[5] != 0x2a) {
      return Corrupt("WebP", "bad VP8 start code");
    }
    h.width = ReadLe16(payload + 6) & 0x3fff;
    h.height = ReadLe16(payload + 8) & 0x3fff;
    if (h.width == 0 || h.height == 0) {
      return InvalidArgument("zero-sized image: the WebP VP8 header says " + Dims(h.width, h.height));
    }
  } else {
    return Corrupt("WebP", "the first chunk is not VP8X, VP8L or VP8");
  }
  return h;
}

// The EXIF chunk's orientation, walking the RIFF chunks of an extended file.
int WebpOrientation(ByteSpan b) {
  std::size_t at = 12;
  while (at + 8 <= b.size()) {
    const std::uint64_t len = ReadLe32(&b[at + 4]);
    if (len > b.size() - at - 8) return 1;
    if (std::memcmp(&b[at], "EXIF", 4) == 0) return ExifOrientation(b.subspan(at + 8, len));
    at += 8 + len + (len & 1);  // chunks are padded to even sizes
  }
  return 1;
}

const char* Vp8StatusName(VP8StatusCode code) {
  switch (code) {
    case VP8_STATUS_OK:
      return "ok";
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "user abort";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "not enough data (truncated)";
  }
  return "unknown status";
}

struct DemuxDeleter {
  void operator()(WebPDemuxer* d) const { WebPDemuxDelete(d); }
};

}  // namespace

StatusOr<ImageInfo> ProbeWebp(ByteSpan bytes) {
  auto h = ParseWebpHeader(bytes);
  if (!h.ok()) return h.status();
  return ImageInfo{ImageFormat::kWebp, static_cast<int>(h->width), static_cast<int>(h->height),
                   h->extended ? WebpOrientation(bytes) : 1};
}

StatusOr<RgbImage> DecodeWebp(ByteSpan bytes, const DecodeLimits& limits, const DecodeOptions& options) {
  auto h = ParseWebpHeader(bytes);
  if (!h.ok()) return h.status();
  if (Status s = CheckPixelLimit(h->width, h->height, limits); !s.ok()) return s;

  const WebPData data{bytes.data(), bytes.size()};
  std::unique_ptr<WebPDemuxer, DemuxDeleter> demux(WebPDemux(&data));
  if (!demux) return Corrupt("WebP", "the RIFF container is invalid or incomplete");
  const std::uint32_t width = WebPDemuxGetI(demux.get(), WEBP_FF_CANVAS_WIDTH);
  const std::uint32_t height = WebPDemuxGetI(demux.get(), WEBP_FF_CANVAS_HEIGHT);
  if (width != h->width || height != h->height) {
    return Corrupt("WebP",
                   "canvas " + Dims(width, height) + " disagrees with the header's " + Dims(h->width, h->height));
  }
  const bool rgba_mode = (WebPDemuxGetI(demux.get(), WEBP_FF_FORMAT_FLAGS) & ALPHA_FLAG) != 0;

  WebPIterator frame;
  if (!WebPDemuxGetFrame(demux.get(), 1, &frame)) return Corrupt("WebP", "no frame");
  const std::uint8_t* frame_bytes = frame.fragment.bytes;
  const std::size_t frame_size = frame.fragment.size;
  const int x0 = frame.x_offset, y0 = frame.y_offset, fw = frame.width, fh = frame.height;
  WebPDemuxReleaseIterator(&frame);
  if (x0 < 0 || y0 < 0 || fw <= 0 || fh <= 0 || static_cast<std::uint64_t>(x0) + fw > width ||
      static_cast<std::uint64_t>(y0) + fh > height) {
    return Corrupt("WebP", "the first frame lies outside the canvas");
  }

  const std::size_t npix = std::size_t{width} * height;
  std::vector<std::uint8_t> canvas(npix * 4, 0);  // transparent black, as WebPAnimDecoder
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) return Internal("libwebp: WebPInitDecoderConfig failed (version mismatch)");
  config.output.colorspace = MODE_RGBA;
  config.output.is_external_memory = 1;
  const std::size_t stride = std::size_t{width} * 4;
  config.output.u.RGBA.rgba = canvas.data() + std::size_t(y0) * stride + std::size_t(x0) * 4;
  config.output.u.RGBA.stride = static_cast<int>(stride);
  config.output.u.RGBA.size = stride * (fh - 1) + std::size_t(fw) * 4;
  const VP8StatusCode status = WebPDecode(frame_bytes, frame_size, &config);
  WebPFreeDecBuffer(&config.output);  // no-op for external memory
  if (status != VP8_STATUS_OK) return Corrupt("WebP", Vp8StatusName(status));

  RgbaToRgbInPlace(canvas.data(), npix, rgba_mode, options.alpha);
  canvas.resize(npix * 3);
  return RgbImage{static_cast<int>(width), static_cast<int>(height), std::move(canvas)};
}

}  // namespace epd::internal
