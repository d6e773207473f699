// BMP: a small reader of our own.
//
// Why not a library: Debian has no maintained standalone BMP decoder other
// than stb_image (libstb-dev), and stb_image's BMP path disagrees with Pillow
// where it matters for parity: it keeps the fourth byte of 32-bit BI_RGB
// pixels as alpha (Pillow ignores it: raw mode "BGRX"), and widens 5/6-bit
// channels by bit replication where Pillow computes v * 255 / 31 (or / 63):
// 5-bit 4 becomes 33 there, 32 in Pillow.
// The format is simple enough that following Pillow's BmpImagePlugin (9.4)
// directly is less code than correcting a library's output:
//   - info headers of 12 (OS/2 core), 40, 64, 108 and 124 bytes; others are
//     "unsupported", as in Pillow;
//   - 1, 4, 8 bits: palette (BGR triples for the core header, BGRX quads
//     otherwise; biClrUsed entries, or 1 << bits when 0); an index past the
//     palette maps to grey (i, i, i), as Pillow's palette does;
//   - 16 bits: 5-5-5 (BI_RGB, or bit masks 7c00/3e0/1f) or 5-6-5 (masks
//     f800/7e0/1f), each channel v * 255 / max, truncated (Pillow's BGR;15 and
//     BGR;16 unpackers);
//   - 24 bits BGR; 32 bits BGRX for BI_RGB, and Pillow's five supported
//     BI_BITFIELDS layouts, of which those with an alpha mask (and the
//     all-zero mask, which Pillow reads as BGRA) are mode "RGBA" and go
//     through the alpha policy;
//   - rows bottom-up, or top-down when the height is negative; each row
//     padded to 4 bytes.
// Not supported (a named error): RLE4/RLE8 compression (Pillow 9.4 decodes
// them with a Python decoder whose delta escape reads past its operands; a
// rare format not worth reproducing bug for bug), embedded JPEG/PNG, other
// bit masks, other depths.
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "image_internal.h"

namespace epd::internal {
namespace {

constexpr std::uint32_t kBiRgb = 0, kBiRle8 = 1, kBiRle4 = 2, kBiBitfields = 3;

enum class Layout { kPalette, kBgr15, kBgr16, kBgr, kBgrx, kXbgr, kAbgr, kRgba, kBgra };

struct BmpHeader {
  int width = 0;
  int height = 0;
  bool top_down = false;
  int bits = 0;
  Layout layout = Layout::kBgr;
  bool rgba_mode = false;
  std::size_t palette_at = 0;  // file offset of the palette
  int palette_entry = 4;       // bytes per palette entry (3 for the core header)
  std::uint32_t colors = 0;
  std::size_t pixels_at = 0;  // file offset of the first stored row
  std::size_t stride = 0;     // bytes per stored row
};

// The info header's fields ParseBmpHeader decides from.
struct InfoFields {
  std::int64_t width = 0, height = 0;
  std::uint32_t compression = kBiRgb;
  std::uint32_t colors = 0;
  std::array<std::uint32_t, 4> masks{};
  std::size_t end = 0;  // file offset after the header and any separate bit masks
};

// The 12-byte OS/2 core header, or the 40..124-byte Windows ones.
StatusOr<InfoFields> ReadInfoHeader(ByteSpan b, std::uint32_t header_size, BmpHeader& out) {
  const std::uint8_t* h = &b[18];  // after the header-size field
  InfoFields f;
  f.end = 14 + header_size;
  if (header_size == 12) {
    f.width = ReadLe16(h);
    f.height = ReadLe16(h + 2);
    out.bits = ReadLe16(h + 6);
    out.palette_entry = 3;
    return f;
  }
  f.width = ReadLe32(h);
  const std::uint32_t raw_height = ReadLe32(h + 4);
  out.top_down = h[7] == 0xff;  // Pillow's test for a negative height
  f.height = out.top_down ? (std::int64_t{1} << 32) - raw_height : raw_height;
  out.bits = ReadLe16(h + 10);
  f.compression = ReadLe32(h + 12);
  f.colors = ReadLe32(h + 28);
  if (f.compression == kBiBitfields) {
    if (header_size >= 56) {
      for (std::size_t i = 0; i < 4; ++i) f.masks[i] = ReadLe32(h + 36 + 4 * i);
    } else {
      if (b.size() < f.end + 12) return Corrupt("BMP", "the bit masks are cut off");
      for (std::size_t i = 0; i < 3; ++i) f.masks[i] = ReadLe32(&b[f.end + 4 * i]);
      f.end += 12;
    }
  }
  return f;
}

// The layout of uncompressed (BI_RGB) pixels of `bits` bits.
StatusOr<Layout> PlainLayout(int bits) {
  switch (bits) {
    case 1:
    case 4:
    case 8:
      return Layout::kPalette;
    case 16:
      return Layout::kBgr15;
    case 24:
      return Layout::kBgr;
    case 32:
      return Layout::kBgrx;
    default:
      return InvalidArgument("unsupported BMP pixel depth: " + std::to_string(bits) + " bits");
  }
}

// The layout BI_BITFIELDS masks `m` name, among the ones Pillow supports.
Status BitfieldsLayout(const std::array<std::uint32_t, 4>& m, BmpHeader& out) {
  using M = std::array<std::uint32_t, 4>;
  using Rgb = std::array<std::uint32_t, 3>;
  const Rgb rgb{m[0], m[1], m[2]};
  bool ok = true;
  if (out.bits == 32) {
    if (m == M{0xff0000, 0xff00, 0xff, 0})
      out.layout = Layout::kBgrx;
    else if (m == M{0xff000000, 0xff0000, 0xff00, 0})
      out.layout = Layout::kXbgr;
    else if (m == M{0xff000000, 0xff0000, 0xff00, 0xff})
      out.layout = Layout::kAbgr;
    else if (m == M{0xff, 0xff00, 0xff0000, 0xff000000})
      out.layout = Layout::kRgba;
    else if (m == M{0xff0000, 0xff00, 0xff, 0xff000000} || m == M{0, 0, 0, 0})
      out.layout = Layout::kBgra;
    else
      ok = false;
    out.rgba_mode = out.layout == Layout::kAbgr || out.layout == Layout::kRgba || out.layout == Layout::kBgra;
  } else if (out.bits == 24 && rgb == Rgb{0xff0000, 0xff00, 0xff}) {
    out.layout = Layout::kBgr;
  } else if (out.bits == 16 && rgb == Rgb{0xf800, 0x7e0, 0x1f}) {
    out.layout = Layout::kBgr16;
  } else if (out.bits == 16 && rgb == Rgb{0x7c00, 0x3e0, 0x1f}) {
    out.layout = Layout::kBgr15;
  } else {
    ok = false;
  }
  if (!ok) return InvalidArgument("unsupported BMP bitfields layout for " + std::to_string(out.bits) + " bits");
  return Status::Ok();
}

// out.layout from the depth and the compression.
Status ChooseLayout(const InfoFields& f, BmpHeader& out) {
  StatusOr<Layout> plain = PlainLayout(out.bits);
  if (!plain.ok()) return plain.status();
  out.layout = *plain;
  if (f.compression == kBiBitfields) return BitfieldsLayout(f.masks, out);
  if (f.compression == kBiRle8 || f.compression == kBiRle4) {
    return InvalidArgument(std::string("unsupported BMP compression: ") + (f.compression == kBiRle8 ? "RLE8" : "RLE4") +
                           " (convert the image to PNG)");
  }
  if (f.compression != kBiRgb) {
    return InvalidArgument("unsupported BMP compression: type " + std::to_string(f.compression));
  }
  return Status::Ok();
}

StatusOr<BmpHeader> ParseBmpHeader(ByteSpan b) {
  if (b.size() < 18) return Corrupt("BMP", std::to_string(b.size()) + " bytes is too short for a BMP header");
  std::uint32_t offset = ReadLe32(&b[10]);
  const std::uint32_t header_size = ReadLe32(&b[14]);
  if (header_size != 12 && header_size != 40 && header_size != 64 && header_size != 108 && header_size != 124) {
    return InvalidArgument("unsupported BMP header type: " + std::to_string(header_size) +
                           "-byte info header (supported: 12, 40, 64, 108, 124)");
  }
  if (b.size() < 14 + header_size) return Corrupt("BMP", "the info header is cut off");
  BmpHeader out;
  StatusOr<InfoFields> f = ReadInfoHeader(b, header_size, out);
  if (!f.ok()) return f.status();
  if (f->width == 0 || f->height == 0) {
    return InvalidArgument("zero-sized image: the BMP header says " + Dims(f->width, f->height));
  }
  if (f->width > 0x7fffffff || f->height > 0x7fffffff) {
    return Corrupt("BMP", "header size " + Dims(f->width, f->height) + " is out of range");
  }
  out.width = static_cast<int>(f->width);
  out.height = static_cast<int>(f->height);
  out.colors = f->colors != 0 ? f->colors : (out.bits < 32 ? 1u << out.bits : 0u);
  if (offset == 14 + header_size && out.bits <= 8) offset += 4 * out.colors;  // Pillow's quirk, kept
  if (Status s = ChooseLayout(*f, out); !s.ok()) return s;
  std::size_t at = f->end;
  if (out.layout == Layout::kPalette) {
    if (out.colors == 0 || out.colors > 65536) {
      return InvalidArgument("unsupported BMP palette size: " + std::to_string(out.colors) + " colours");
    }
    out.palette_at = at;
    at += std::size_t{out.colors} * out.palette_entry;
  }
  out.pixels_at = offset != 0 ? offset : at;
  out.stride = ((static_cast<std::size_t>(out.width) * out.bits + 31) >> 3) & ~std::size_t{3};
  return out;
}

inline std::uint8_t Scale(unsigned v, unsigned max) { return static_cast<std::uint8_t>(v * 255 / max); }

}  // namespace

StatusOr<ImageInfo> ProbeBmp(ByteSpan bytes) {
  auto h = ParseBmpHeader(bytes);
  if (!h.ok()) return h.status();
  return ImageInfo{ImageFormat::kBmp, h->width, h->height, 1};
}

namespace {

using Palette = std::array<std::array<std::uint8_t, 3>, 256>;

// The palette's colours; indices past it are grey (i, i, i), as in Pillow.
StatusOr<Palette> ReadPalette(ByteSpan bytes, const BmpHeader& h) {
  Palette palette{};
  if (h.palette_at + std::size_t{h.colors} * h.palette_entry > bytes.size()) {
    return Corrupt("BMP", "the palette is cut off");
  }
  for (int i = 0; i < 256; ++i) {
    const auto v = static_cast<std::uint8_t>(i);
    if (static_cast<std::uint32_t>(i) < h.colors) {
      const std::uint8_t* e = &bytes[h.palette_at + std::size_t(i) * h.palette_entry];
      palette[i] = {e[2], e[1], e[0]};  // stored B, G, R
    } else {
      palette[i] = {v, v, v};
    }
  }
  return palette;
}

// One pixel of a 32-bit layout, composited under the alpha policy for RGBA.
void Pixel32(const std::uint8_t* s, const BmpHeader& h, const DecodeOptions& options, std::uint8_t* out) {
  std::uint8_t r, g, b, a = 255;
  switch (h.layout) {
    case Layout::kBgrx:
      b = s[0], g = s[1], r = s[2];
      break;
    case Layout::kXbgr:
      b = s[1], g = s[2], r = s[3];
      break;
    case Layout::kAbgr:
      a = s[0], b = s[1], g = s[2], r = s[3];
      break;
    case Layout::kRgba:
      r = s[0], g = s[1], b = s[2], a = s[3];
      break;
    default:
      b = s[0], g = s[1], r = s[2], a = s[3];
      break;  // kBgra
  }
  if (h.rgba_mode && options.alpha.composite) {
    r = BlendOver(r, a, options.alpha.background[0]);
    g = BlendOver(g, a, options.alpha.background[1]);
    b = BlendOver(b, a, options.alpha.background[2]);
  }
  out[0] = r, out[1] = g, out[2] = b;
}

// One stored row `in` as `w` RGB pixels at `out`.
void DecodeRow(const std::uint8_t* in, std::size_t w, const BmpHeader& h, const Palette& palette,
               const DecodeOptions& options, std::uint8_t* out) {
  for (std::size_t x = 0; x < w; ++x, out += 3) {
    switch (h.layout) {
      case Layout::kPalette: {
        const std::size_t bit = x * h.bits;  // MSB first within a byte
        const unsigned index = (in[bit >> 3] >> (8 - h.bits - (bit & 7))) & ((1u << h.bits) - 1);
        std::memcpy(out, palette[index].data(), 3);
        break;
      }
      case Layout::kBgr15: {
        const unsigned p = ReadLe16(in + 2 * x);
        out[0] = Scale((p >> 10) & 31, 31);
        out[1] = Scale((p >> 5) & 31, 31);
        out[2] = Scale(p & 31, 31);
        break;
      }
      case Layout::kBgr16: {
        const unsigned p = ReadLe16(in + 2 * x);
        out[0] = Scale((p >> 11) & 31, 31);
        out[1] = Scale((p >> 5) & 63, 63);
        out[2] = Scale(p & 31, 31);
        break;
      }
      case Layout::kBgr: {
        const std::uint8_t* s = in + 3 * x;
        out[0] = s[2], out[1] = s[1], out[2] = s[0];
        break;
      }
      default:  // 32-bit layouts
        Pixel32(in + 4 * x, h, options, out);
        break;
    }
  }
}

}  // namespace

StatusOr<RgbImage> DecodeBmp(ByteSpan bytes, const DecodeLimits& limits, const DecodeOptions& options) {
  auto parsed = ParseBmpHeader(bytes);
  if (!parsed.ok()) return parsed.status();
  const BmpHeader& h = *parsed;
  if (Status s = CheckPixelLimit(h.width, h.height, limits); !s.ok()) return s;
  const std::size_t w = static_cast<std::size_t>(h.width);
  const std::size_t rows = static_cast<std::size_t>(h.height);
  // Sizes below are < 2^31 * 4 * 2^31: no overflow in 64 bits.
  if (h.pixels_at > bytes.size() || h.stride * rows > bytes.size() - h.pixels_at) {
    return Corrupt("BMP", "pixel data needs " + std::to_string(h.stride * rows) + " bytes at offset " +
                              std::to_string(h.pixels_at) + ", the file has " + std::to_string(bytes.size()));
  }
  Palette palette{};
  if (h.layout == Layout::kPalette) {
    StatusOr<Palette> read = ReadPalette(bytes, h);
    if (!read.ok()) return read.status();
    palette = *read;
  }
  RgbImage img;
  img.width = h.width;
  img.height = h.height;
  img.pixels.resize(w * rows * 3);
  for (std::size_t y = 0; y < rows; ++y) {
    const std::size_t stored = h.top_down ? y : rows - 1 - y;
    DecodeRow(&bytes[h.pixels_at + stored * h.stride], w, h, palette, options, &img.pixels[y * w * 3]);
  }
  return img;
}

}  // namespace epd::internal
