// JPEG through libjpeg-turbo's TurboJPEG API: the same library (libjpeg62-
// turbo 2.1.5 in Debian 12) and the same decode settings (accurate integer
// IDCT, fancy upsampling) as Pillow, so YCbCr and grayscale output matches
// Pillow's bit for bit.
//
// 4-channel JPEGs: libjpeg returns CMYK (converting YCCK itself). Pillow 9.4
// reads them with raw mode "CMYK;I" for every 4-channel JPEG ("assume adobe
// conventions", JpegImagePlugin.py), i.e. it inverts each sample, and then
// converts CMYK to RGB with cmyk2rgb (libImaging/Convert.c):
//   nk = 255 - k;  R = nk - MULDIV255(c, nk)  (likewise G from m, B from y),
// MULDIV255(a, b) = (t = a * b + 128, ((t >> 8) + t) >> 8). We do the same,
// so Photoshop/scanner CMYK (Adobe APP14, inverted) comes out right, as in
// Pillow.
#include <turbojpeg.h>

#include <memory>
#include <string>

#include "image_internal.h"

namespace epd::internal {
namespace {

struct TjDeleter {
  void operator()(void* h) const { tjDestroy(h); }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

StatusOr<TjHandle> NewJpegDecoder() {
  TjHandle h(tjInitDecompress());
  if (!h) return Internal(std::string("TurboJPEG: cannot create a decompressor: ") + tjGetErrorStr2(nullptr));
  return h;
}

struct JpegHeader {
  int width = 0;
  int height = 0;
  bool cmyk = false;  // CMYK or YCCK: decoded as 4 channels
};

StatusOr<JpegHeader> ReadHeader(void* tj, ByteSpan bytes) {
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
      return InvalidArgument(
          "too many pixels: the JPEG header declares a side over 65500 pixels, the most libjpeg "
          "decodes (" +
          why + ")");
    }
    return Corrupt("JPEG", why);
  }
  if (width <= 0 || height <= 0) {
    return InvalidArgument("zero-sized image: the JPEG header says " + Dims(width, height));
  }
  return JpegHeader{width, height, colorspace == TJCS_CMYK || colorspace == TJCS_YCCK};
}

inline std::uint8_t MulDiv255(unsigned a, unsigned b) {
  const unsigned t = a * b + 128;
  return static_cast<std::uint8_t>(((t >> 8) + t) >> 8);
}

}  // namespace

StatusOr<ImageInfo> ProbeJpeg(ByteSpan bytes) {
  auto tj = NewJpegDecoder();
  if (!tj.ok()) return tj.status();
  auto header = ReadHeader(tj->get(), bytes);
  if (!header.ok()) return header.status();
  return ImageInfo{ImageFormat::kJpeg, header->width, header->height, JpegOrientation(bytes)};
}

StatusOr<RgbImage> DecodeJpeg(ByteSpan bytes, const DecodeLimits& limits, const DecodeOptions& /*options*/) {
  auto tj = NewJpegDecoder();
  if (!tj.ok()) return tj.status();
  auto header = ReadHeader(tj->get(), bytes);
  if (!header.ok()) return header.status();
  if (Status s = CheckPixelLimit(header->width, header->height, limits); !s.ok()) return s;

  RgbImage img;
  img.width = header->width;
  img.height = header->height;
  const std::size_t npix = static_cast<std::size_t>(img.width) * static_cast<std::size_t>(img.height);
  const int channels = header->cmyk ? 4 : 3;
  img.pixels.resize(npix * channels);
  // STOPONWARNING: libjpeg only *warns* on premature end of data and pads
  // the rest with grey; a half-grey image must not be cached as a real one.
  // LIMITSCANS: caps progressive scans (500), a cheap CPU-exhaustion guard.
  const int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
  if (tjDecompress2(tj->get(), bytes.data(), static_cast<unsigned long>(bytes.size()), img.pixels.data(), img.width,
                    img.width * channels, img.height, header->cmyk ? TJPF_CMYK : TJPF_RGB, flags) != 0) {
    return Corrupt("JPEG", tjGetErrorStr2(tj->get()));
  }
  if (header->cmyk) {
    std::uint8_t* p = img.pixels.data();
    for (std::size_t i = 0; i < npix; ++i) {
      // Inverted ("CMYK;I") samples: c' = 255 - c, so nk = 255 - k' = k.
      const unsigned nk = p[4 * i + 3];
      for (int c = 0; c < 3; ++c) {
        const unsigned ink = 255u - p[4 * i + c];
        p[3 * i + c] = static_cast<std::uint8_t>(nk - MulDiv255(ink, nk));  // in [0, nk]: no clip needed
      }
    }
    img.pixels.resize(npix * 3);
  }
  return img;
}

StatusOr<bool> DecodeJpegRgbInto(ByteSpan bytes, const DecodeLimits& limits, PixelBuffer& out, MinSize min_size,
                                 const void* context) {
  thread_local TjHandle tj;
  if (!tj) {
    auto made = NewJpegDecoder();
    if (!made.ok()) return made.status();
    tj = std::move(*made);
  }
  auto header = ReadHeader(tj.get(), bytes);
  if (!header.ok()) return header.status();
  if (header->cmyk) return false;
  if (Status s = CheckPixelLimit(header->width, header->height, limits); !s.ok()) return s;
  int width = header->width, height = header->height;
  if (min_size != nullptr) {
    const auto [want_w, want_h] = min_size(width, height, context);
    for (int denom : {8, 4, 2}) {  // TJSCALED: the side rounded up
      const int w = (header->width + denom - 1) / denom, h = (header->height + denom - 1) / denom;
      if (want_w > 0 && want_h > 0 && w >= want_w && h >= want_h) {
        width = w;
        height = h;
        break;
      }
    }
  }
  const std::size_t need = static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3;
  if (out.capacity < need) {
    out.data.reset(new std::uint8_t[need]);  // default-initialised: the decoder fills it
    out.capacity = need;
  }
  out.width = width;
  out.height = height;
  out.stored_width = header->width;
  out.stored_height = header->height;
  // The same flags as DecodeJpeg (see there). Asked for a smaller size,
  // TurboJPEG picks the scaling factor that gives it.
  const int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
  if (tjDecompress2(tj.get(), bytes.data(), static_cast<unsigned long>(bytes.size()), out.data.get(), width, width * 3,
                    height, TJPF_RGB, flags) != 0) {
    return Corrupt("JPEG", tjGetErrorStr2(tj.get()));
  }
  return true;
}

}  // namespace epd::internal
