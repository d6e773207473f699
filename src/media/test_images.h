// src/media/test_images.h (test-only): synthetic images and encoders for the
// media tests. Fixtures are made in the test itself rather than checked in,
// so every expected value is visible next to the assertion that uses it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "epd/media/image.h"

namespace epd::testing {

using Bytes = std::vector<std::uint8_t>;

// width x height RGB8 with pixel (x, y) = (f(x,y), g(x,y), h(x,y)) patterns
// chosen so neighbouring pixels and channels differ.
RgbImage PatternImage(int width, int height);
RgbImage ConstantImage(int width, int height, std::uint8_t r, std::uint8_t g, std::uint8_t b);

// TurboJPEG encoders. `subsamp` is a TJSAMP value (default 4:4:4).
Bytes EncodeJpegRgb(const RgbImage& img, int quality, int subsamp = 0);
Bytes EncodeJpegGray(int width, int height, const Bytes& gray, int quality);
Bytes EncodeJpegCmyk(int width, int height, const Bytes& cmyk, int quality);

// libpng simplified-API encoder (8-bit RGB).
Bytes EncodePngRgb(const RgbImage& img);

// A hand-built PNG (no libpng): one IDAT of zlib(filter byte 0 + row) rows.
// `raw` holds height rows of packed samples for the given bit depth and
// colour type (0 gray, 2 RGB, 3 palette, 4 gray+alpha, 6 RGBA), 16-bit
// samples big-endian. `plte`/`trns` are emitted when non-empty.
Bytes BuildPng(std::uint32_t width, std::uint32_t height, int bit_depth, int color_type, const Bytes& raw,
               const Bytes& plte = {}, const Bytes& trns = {});

// Rewrites the IHDR width/height of a PNG and fixes its CRC.
void SetPngSize(Bytes& png, std::uint32_t width, std::uint32_t height);

// Rewrites the SOF0/SOF2 width/height of a JPEG (first SOF marker).
void SetJpegSize(Bytes& jpeg, std::uint16_t width, std::uint16_t height);

Bytes FirstHalf(const Bytes& b);

// Inserts a chunk (type + data, CRC computed) right after IHDR.
void InsertPngChunk(Bytes& png, const char type[4], const Bytes& data);

// An EXIF block (TIFF, little-endian, with the "Exif\0\0" prefix) whose IFD0
// holds only Orientation = `orientation` (SHORT).
Bytes ExifWithOrientation(int orientation);

// libwebp lossless encoders (exact round trip).
Bytes EncodeWebpLosslessRgb(const RgbImage& img);
Bytes EncodeWebpLosslessRgba(int width, int height, const Bytes& rgba);

// giflib encoder: one frame of palette indices (width * height bytes) at
// (left, top) on a screen_w x screen_h logical screen; `palette` holds
// 2^k RGB triples; transparent_index < 0 for none.
Bytes EncodeGif(int screen_w, int screen_h, int left, int top, int width, int height, const Bytes& indices,
                const Bytes& palette, int transparent_index = -1);

// A 24-bit BI_RGB BMP (40-byte info header, bottom-up rows).
Bytes EncodeBmp24(const RgbImage& img);

}  // namespace epd::testing
