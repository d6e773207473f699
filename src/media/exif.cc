// EXIF Orientation: where each container keeps it, and the TIFF walk to it.
//
// Only IFD0's tag 0x0112 matters (what Pillow's Image.getexif().get(0x0112)
// returns). Every read is bounds-checked against the block; a malformed
// block yields 1 (no transform) instead of an error, because the pixels are
// still good and the orientation is only a hint. (Pillow would raise on some
// of those blocks; refusing the image would be worse than showing it as
// stored.)
#include <cstring>

#include "image_internal.h"

namespace epd::internal {
namespace {

constexpr std::uint16_t kTagOrientation = 0x0112;
constexpr std::uint16_t kTypeShort = 3;
constexpr std::uint16_t kTypeLong = 4;

}  // namespace

int ExifOrientation(ByteSpan exif) {
  if (exif.size() >= 6 && std::memcmp(exif.data(), "Exif\0\0", 6) == 0) exif = exif.subspan(6);
  if (exif.size() < 8) return 1;
  bool little;
  if (exif[0] == 'I' && exif[1] == 'I') {
    little = true;
  } else if (exif[0] == 'M' && exif[1] == 'M') {
    little = false;
  } else {
    return 1;
  }
  auto u16 = [&](std::size_t at) -> std::uint32_t {
    return little ? (exif[at] | exif[at + 1] << 8) : (exif[at] << 8 | exif[at + 1]);
  };
  auto u32 = [&](std::size_t at) -> std::uint32_t { return little ? ReadLe32(&exif[at]) : ReadBe32(&exif[at]); };
  if (u16(2) != 42) return 1;
  const std::uint64_t ifd = u32(4);
  if (ifd + 2 > exif.size()) return 1;
  const std::uint32_t count = u16(ifd);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint64_t entry = ifd + 2 + 12ull * i;
    if (entry + 12 > exif.size()) return 1;
    if (u16(entry) != kTagOrientation) continue;
    const std::uint32_t type = u16(entry + 2);
    if (u32(entry + 4) < 1) return 1;
    // The value fits in the 4-byte field, left-justified.
    std::uint32_t value = 0;
    if (type == kTypeShort) {
      value = u16(entry + 8);
    } else if (type == kTypeLong) {
      value = u32(entry + 8);
    } else {
      return 1;
    }
    return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
  }
  return 1;
}

int JpegOrientation(ByteSpan jpeg) {
  std::size_t at = 2;  // after SOI
  while (at + 4 <= jpeg.size()) {
    if (jpeg[at] != 0xff) return 1;  // lost sync: let the decoder judge
    const std::uint8_t marker = jpeg[at + 1];
    if (marker == 0xff) {  // fill byte
      ++at;
      continue;
    }
    if (marker == 0xda || marker == 0xd9) return 1;              // SOS or EOI: no EXIF before the scan
    if (marker == 0x01 || (marker >= 0xd0 && marker <= 0xd7)) {  // no length
      at += 2;
      continue;
    }
    const std::size_t len = std::size_t{jpeg[at + 2]} << 8 | jpeg[at + 3];
    if (len < 2 || at + 2 + len > jpeg.size()) return 1;
    const ByteSpan body = jpeg.subspan(at + 4, len - 2);
    if (marker == 0xe1 && body.size() >= 6 && std::memcmp(body.data(), "Exif\0\0", 6) == 0) {
      return ExifOrientation(body);  // the first Exif APP1 decides, as in Pillow
    }
    at += 2 + len;
  }
  return 1;
}

int PngOrientation(ByteSpan png) {
  std::size_t at = 8;  // after the signature
  while (at + 12 <= png.size()) {
    const std::uint64_t len = ReadBe32(&png[at]);
    if (len > png.size() - at - 12) return 1;
    const std::uint8_t* type = &png[at + 4];
    if (std::memcmp(type, "eXIf", 4) == 0) return ExifOrientation(png.subspan(at + 8, len));
    if (std::memcmp(type, "IEND", 4) == 0) return 1;
    at += 12 + len;
  }
  return 1;
}

}  // namespace epd::internal
