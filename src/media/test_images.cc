#include "test_images.h"

#include <gif_lib.h>
#include <png.h>
#include <turbojpeg.h>
#include <webp/encode.h>
#include <zlib.h>

#include <array>
#include <cstring>
#include <stdexcept>

namespace epd::testing {
namespace {

// CRC-32 (ISO-HDLC, poly 0xEDB88320) written out here so PNG fixtures do not
// depend on the library under test.
std::uint32_t Crc32(const std::uint8_t* p, std::size_t n) {
  std::uint32_t c = 0xffffffffu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

void PutBe32(Bytes& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}

void Chunk(Bytes& out, const char type[4], const Bytes& data) {
  PutBe32(out, static_cast<std::uint32_t>(data.size()));
  const std::size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  PutBe32(out, Crc32(out.data() + start, out.size() - start));
}

Bytes TjCompress(const std::uint8_t* pixels, int width, int height, int pf, int subsamp, int quality) {
  tjhandle tj = tjInitCompress();
  if (tj == nullptr) throw std::runtime_error("tjInitCompress failed");
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int pitch = width * tjPixelSize[pf];
  if (tjCompress2(tj, pixels, width, pitch, height, pf, &jpeg, &size, subsamp, quality, 0) != 0) {
    std::string why = tjGetErrorStr2(tj);
    tjDestroy(tj);
    throw std::runtime_error("tjCompress2 failed: " + why);
  }
  Bytes out(jpeg, jpeg + size);
  tjFree(jpeg);
  tjDestroy(tj);
  return out;
}

}  // namespace

RgbImage PatternImage(int width, int height) {
  RgbImage img{width, height, {}};
  img.pixels.resize(static_cast<std::size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      std::uint8_t* p = &img.pixels[(static_cast<std::size_t>(y) * width + x) * 3];
      p[0] = static_cast<std::uint8_t>((x * 7 + y * 3) % 256);
      p[1] = static_cast<std::uint8_t>((x * 5 + y * 11 + 40) % 256);
      p[2] = static_cast<std::uint8_t>((x * y + 90) % 256);
    }
  }
  return img;
}

RgbImage ConstantImage(int width, int height, std::uint8_t r, std::uint8_t g, std::uint8_t b) {
  RgbImage img{width, height, {}};
  img.pixels.resize(static_cast<std::size_t>(width) * height * 3);
  for (std::size_t i = 0; i < img.pixels.size(); i += 3) {
    img.pixels[i] = r;
    img.pixels[i + 1] = g;
    img.pixels[i + 2] = b;
  }
  return img;
}

Bytes EncodeJpegRgb(const RgbImage& img, int quality, int subsamp) {
  return TjCompress(img.pixels.data(), img.width, img.height, TJPF_RGB, subsamp, quality);
}

Bytes EncodeJpegGray(int width, int height, const Bytes& gray, int quality) {
  return TjCompress(gray.data(), width, height, TJPF_GRAY, TJSAMP_GRAY, quality);
}

Bytes EncodeJpegCmyk(int width, int height, const Bytes& cmyk, int quality) {
  return TjCompress(cmyk.data(), width, height, TJPF_CMYK, TJSAMP_444, quality);
}

Bytes EncodePngRgb(const RgbImage& img) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(img.width);
  image.height = static_cast<png_uint_32>(img.height);
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, img.pixels.data(), 0, nullptr)) {
    throw std::runtime_error(std::string("png size query failed: ") + image.message);
  }
  Bytes out(size);
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, img.pixels.data(), 0, nullptr)) {
    throw std::runtime_error(std::string("png write failed: ") + image.message);
  }
  out.resize(size);
  return out;
}

Bytes BuildPng(std::uint32_t width, std::uint32_t height, int bit_depth, int color_type, const Bytes& raw,
               const Bytes& plte, const Bytes& trns) {
  Bytes out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  Bytes ihdr;
  PutBe32(ihdr, width);
  PutBe32(ihdr, height);
  ihdr.insert(ihdr.end(), {static_cast<std::uint8_t>(bit_depth), static_cast<std::uint8_t>(color_type), 0, 0, 0});
  Chunk(out, "IHDR", ihdr);
  if (!plte.empty()) Chunk(out, "PLTE", plte);
  if (!trns.empty()) Chunk(out, "tRNS", trns);
  // Prefix each row with filter type 0 (None).
  Bytes filtered;
  const std::size_t row = height == 0 ? 0 : raw.size() / height;
  for (std::uint32_t y = 0; y < height; ++y) {
    filtered.push_back(0);
    filtered.insert(filtered.end(), raw.data() + y * row, raw.data() + (y + 1) * row);
  }
  uLongf zsize = compressBound(filtered.size());
  Bytes z(zsize);
  if (compress2(z.data(), &zsize, filtered.data(), filtered.size(), 9) != Z_OK) {
    throw std::runtime_error("zlib compress2 failed");
  }
  z.resize(zsize);
  Chunk(out, "IDAT", z);
  Chunk(out, "IEND", {});
  return out;
}

void SetPngSize(Bytes& png, std::uint32_t width, std::uint32_t height) {
  // Signature (8), length (4), "IHDR" (4), then width and height; CRC after
  // the 13 data bytes covers type + data.
  Bytes wh;
  PutBe32(wh, width);
  PutBe32(wh, height);
  std::memcpy(&png[16], wh.data(), 8);
  const std::uint32_t crc = Crc32(&png[12], 4 + 13);
  Bytes c;
  PutBe32(c, crc);
  std::memcpy(&png[29], c.data(), 4);
}

void SetJpegSize(Bytes& jpeg, std::uint16_t width, std::uint16_t height) {
  // Walk marker segments from after SOI to the first SOFn (c0..c2).
  std::size_t i = 2;
  while (i + 4 <= jpeg.size()) {
    if (jpeg[i] != 0xff) throw std::runtime_error("SetJpegSize: lost marker sync");
    const std::uint8_t marker = jpeg[i + 1];
    const std::size_t len = std::size_t{jpeg[i + 2]} << 8 | jpeg[i + 3];
    if (marker >= 0xc0 && marker <= 0xc2) {
      // SOF: len(2) precision(1) height(2) width(2).
      jpeg[i + 5] = static_cast<std::uint8_t>(height >> 8);
      jpeg[i + 6] = static_cast<std::uint8_t>(height);
      jpeg[i + 7] = static_cast<std::uint8_t>(width >> 8);
      jpeg[i + 8] = static_cast<std::uint8_t>(width);
      return;
    }
    i += 2 + len;
  }
  throw std::runtime_error("SetJpegSize: no SOF marker");
}

Bytes FirstHalf(const Bytes& b) { return Bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(b.size() / 2)); }

void InsertPngChunk(Bytes& png, const char type[4], const Bytes& data) {
  Bytes chunk;
  Chunk(chunk, type, data);
  png.insert(png.begin() + 8 + 25, chunk.begin(), chunk.end());  // after signature + IHDR
}

Bytes ExifWithOrientation(int orientation) {
  // "Exif\0\0", "II", 42, IFD0 at 8; one entry: tag 0x0112, type 3 (SHORT),
  // count 1, value; next IFD 0.
  return Bytes{'E', 'x',  'i',  'f', 0,
               0,   'I',  'I',  42,  0,
               8,   0,    0,    0,   1,
               0,   0x12, 0x01, 3,   0,
               1,   0,    0,    0,   static_cast<std::uint8_t>(orientation),
               0,   0,    0,    0,   0,
               0,   0};
}

Bytes EncodeWebpLosslessRgb(const RgbImage& img) {
  std::uint8_t* out = nullptr;
  const std::size_t n = WebPEncodeLosslessRGB(img.pixels.data(), img.width, img.height, img.width * 3, &out);
  if (n == 0) throw std::runtime_error("WebPEncodeLosslessRGB failed");
  Bytes b(out, out + n);
  WebPFree(out);
  return b;
}

Bytes EncodeWebpLosslessRgba(int width, int height, const Bytes& rgba) {
  std::uint8_t* out = nullptr;
  const std::size_t n = WebPEncodeLosslessRGBA(rgba.data(), width, height, width * 4, &out);
  if (n == 0) throw std::runtime_error("WebPEncodeLosslessRGBA failed");
  Bytes b(out, out + n);
  WebPFree(out);
  return b;
}

namespace {
int GifWrite(GifFileType* gif, const GifByteType* data, int n) {
  auto* out = static_cast<Bytes*>(gif->UserData);
  out->insert(out->end(), data, data + n);
  return n;
}
}  // namespace

Bytes EncodeGif(int screen_w, int screen_h, int left, int top, int width, int height, const Bytes& indices,
                const Bytes& palette, int transparent_index) {
  Bytes out;
  int error = 0;
  GifFileType* gif = EGifOpen(&out, GifWrite, &error);
  if (gif == nullptr) throw std::runtime_error("EGifOpen failed");
  const int colors = static_cast<int>(palette.size() / 3);
  ColorMapObject* map = GifMakeMapObject(colors, reinterpret_cast<const GifColorType*>(palette.data()));
  EGifSetGifVersion(gif, true);
  bool ok = EGifPutScreenDesc(gif, screen_w, screen_h, 8, 0, map) == GIF_OK;
  if (ok && transparent_index >= 0) {
    const GifByteType gce[4] = {1, 0, 0, static_cast<GifByteType>(transparent_index)};
    ok = EGifPutExtension(gif, GRAPHICS_EXT_FUNC_CODE, 4, gce) == GIF_OK;
  }
  ok = ok && EGifPutImageDesc(gif, left, top, width, height, false, nullptr) == GIF_OK;
  Bytes line(indices);
  for (int y = 0; ok && y < height; ++y)
    ok = EGifPutLine(gif, line.data() + static_cast<std::ptrdiff_t>(y) * width, width) == GIF_OK;
  GifFreeMapObject(map);
  if (EGifCloseFile(gif, &error) != GIF_OK || !ok) throw std::runtime_error("giflib encode failed");
  return out;
}

Bytes EncodeBmp24(const RgbImage& img) {
  const std::uint32_t stride = (static_cast<std::uint32_t>(img.width) * 3 + 3) & ~3u;
  const std::uint32_t data = stride * static_cast<std::uint32_t>(img.height);
  Bytes b;
  auto le = [&](std::uint32_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  };
  b.push_back('B');
  b.push_back('M');
  le(14 + 40 + data, 4);
  le(0, 4);
  le(14 + 40, 4);  // pixel data offset
  le(40, 4);
  le(static_cast<std::uint32_t>(img.width), 4);
  le(static_cast<std::uint32_t>(img.height), 4);
  le(1, 2);
  le(24, 2);
  le(0, 4);  // BI_RGB
  le(data, 4);
  le(2835, 4);
  le(2835, 4);
  le(0, 4);
  le(0, 4);
  for (int y = img.height - 1; y >= 0; --y) {  // bottom-up
    for (int x = 0; x < img.width; ++x) {
      const std::uint8_t* p = &img.pixels[(static_cast<std::size_t>(y) * img.width + x) * 3];
      b.insert(b.end(), {p[2], p[1], p[0]});
    }
    for (std::uint32_t pad = static_cast<std::uint32_t>(img.width) * 3; pad < stride; ++pad) b.push_back(0);
  }
  return b;
}

}  // namespace epd::testing
