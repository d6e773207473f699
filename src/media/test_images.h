// src/media/test_images.h (test-only): synthetic images and encoders for the
// media tests. Fixtures are made in the test itself rather than checked in,
// so every expected value is visible next to the assertion that uses it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "epd/image.h"

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

}  // namespace epd::testing
