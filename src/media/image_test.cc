#include "epd/media/image.h"

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cstdlib>
#include <string>

#include "epd/media/preprocess.h"
#include "test_images.h"

namespace epd {
namespace {

using testing::Bytes;

// Asserts `s` is kInvalidArgument and its message contains `word`.
template <typename T>
void ExpectInvalid(const StatusOr<T>& s, std::string_view word) {
  ASSERT_FALSE(s.ok()) << "expected an error containing '" << word << "'";
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
  EXPECT_NE(s.status().message().find(word), std::string::npos)
      << "message '" << s.status().message() << "' lacks '" << word << "'";
}

TEST(DecodeImageTest, PngRoundTripsExactly) {
  const RgbImage src = testing::PatternImage(37, 23);
  const Bytes png = testing::EncodePngRgb(src);
  auto info = ProbeImage(png);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->format, ImageFormat::kPng);
  EXPECT_EQ(info->width, 37);
  EXPECT_EQ(info->height, 23);
  auto img = DecodeImage(png);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->width, 37);
  EXPECT_EQ(img->height, 23);
  EXPECT_EQ(img->pixels, src.pixels);
}

TEST(DecodeImageTest, JpegRoundTripsWithinTolerance) {
  // A smooth image: JPEG at quality 95, 4:4:4, keeps every sample close.
  RgbImage src{64, 48, {}};
  src.pixels.resize(std::size_t{64} * 48 * 3);
  for (int y = 0; y < 48; ++y) {
    for (int x = 0; x < 64; ++x) {
      std::uint8_t* p = &src.pixels[static_cast<std::size_t>(y * 64 + x) * 3];
      p[0] = static_cast<std::uint8_t>(x * 4);
      p[1] = static_cast<std::uint8_t>(y * 5);
      p[2] = static_cast<std::uint8_t>(128 + (x - y) / 2);
    }
  }
  const Bytes jpeg = testing::EncodeJpegRgb(src, 95, TJSAMP_444);
  auto info = ProbeImage(jpeg);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->format, ImageFormat::kJpeg);
  EXPECT_EQ(info->width, 64);
  EXPECT_EQ(info->height, 48);
  auto img = DecodeImage(jpeg);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  ASSERT_EQ(img->pixels.size(), src.pixels.size());
  int max_err = 0;
  for (std::size_t i = 0; i < src.pixels.size(); ++i) {
    max_err = std::max(max_err, std::abs(int{img->pixels[i]} - int{src.pixels[i]}));
  }
  EXPECT_LE(max_err, 8);
}

TEST(DecodeImageTest, GrayscaleJpegComesOutAsRgb) {
  Bytes gray(std::size_t{32} * 16);
  for (int i = 0; i < 32 * 16; ++i) gray[i] = static_cast<std::uint8_t>(60 + (i % 32) * 4);
  auto img = DecodeImage(testing::EncodeJpegGray(32, 16, gray, 95));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  ASSERT_EQ(img->pixels.size(), 32u * 16 * 3);
  for (std::size_t i = 0; i < std::size_t{32} * 16; ++i) {
    EXPECT_EQ(img->pixels[3 * i], img->pixels[3 * i + 1]);
    EXPECT_EQ(img->pixels[3 * i], img->pixels[3 * i + 2]);
    EXPECT_NEAR(img->pixels[3 * i], gray[i], 6);
  }
}

TEST(DecodeImageTest, CmykJpegIsReadWithAdobePolarityAsPillowDoes) {
  // TurboJPEG stores these samples as given (100) with an Adobe marker.
  // Pillow reads every 4-channel JPEG as inverted ("CMYK;I"): ink
  // 255 - 100 = 155 in each of C, M, Y, K; then cmyk2rgb:
  // nk = 255 - 155 = 100, R = nk - round(155 * 100 / 255) = 100 - 61 = 39.
  const Bytes cmyk(std::size_t{16} * 16 * 4, 100);
  const Bytes jpeg = testing::EncodeJpegCmyk(16, 16, cmyk, 95);
  auto info = ProbeImage(jpeg);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->width, 16);
  auto img = DecodeImage(jpeg);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  ASSERT_EQ(img->pixels.size(), 16u * 16 * 3);
  for (std::uint8_t v : img->pixels) EXPECT_NEAR(v, 39, 1);  // lossy: +-1 around the exact 39
}

TEST(DecodeImageTest, GrayscalePngComesOutAsRgb) {
  const Bytes raw = {0, 50, 100, 150, 200, 255};  // 3x2, 8-bit gray
  auto img = DecodeImage(testing::BuildPng(3, 2, 8, 0, raw));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, (Bytes{0, 0, 0, 50, 50, 50, 100, 100, 100, 150, 150, 150, 200, 200, 200, 255, 255, 255}));
}

TEST(DecodeImageTest, PalettePngIsExpanded) {
  const Bytes plte = {255, 0, 0, 0, 255, 0, 0, 0, 255};  // red, green, blue
  const Bytes raw = {2, 0, 1, 1};                        // 2x2, indices
  auto img = DecodeImage(testing::BuildPng(2, 2, 8, 3, raw, plte));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, (Bytes{0, 0, 255, 255, 0, 0, 0, 255, 0, 0, 255, 0}));
}

TEST(DecodeImageTest, PalettePngWithTransparencyDropsAlpha) {
  const Bytes plte = {10, 20, 30, 40, 50, 60};
  const Bytes trns = {0, 128};  // entry 0 fully transparent, entry 1 half
  auto img = DecodeImage(testing::BuildPng(2, 1, 8, 3, Bytes{0, 1}, plte, trns));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, (Bytes{10, 20, 30, 40, 50, 60}));
}

TEST(DecodeImageTest, RgbaPngIsCompositedOnWhiteByDefault) {
  // vLLM's rgba_to_rgb: paste onto a white canvas with alpha as the mask,
  // out = round((c * a + 255 * (255 - a)) / 255):
  //   a = 0 -> 255; a = 255 -> c; a = 77: R (90 * 77 + 255 * 178) / 255 =
  //   52320 / 255 = 205.18 -> 205, G 51550 / 255 -> 202, B 50780 / 255 -> 199.
  const Bytes raw = {200, 100, 50, 0, 10, 20, 30, 255, 90, 80, 70, 77};  // 3x1 RGBA
  auto img = DecodeImage(testing::BuildPng(3, 1, 8, 6, raw));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, (Bytes{255, 255, 255, 10, 20, 30, 205, 202, 199}));
}

TEST(DecodeImageTest, RgbaBackgroundColourIsUsed) {
  // Background (0, 0, 255), a = 77: R 90 * 77 / 255 = 27.2 -> 27,
  // G 80 * 77 / 255 = 24.2 -> 24, B (70 * 77 + 255 * 178) / 255 = 199.1 -> 199.
  const Bytes raw = {200, 100, 50, 0, 90, 80, 70, 77};
  DecodeOptions options;
  options.alpha.background = {0, 0, 255};
  auto img = DecodeImage(testing::BuildPng(2, 1, 8, 6, raw), {}, options);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, (Bytes{0, 0, 255, 27, 24, 199}));
}

TEST(DecodeImageTest, RgbaPolicyNoneDropsAlphaLikeConvertRgb) {
  const Bytes raw = {200, 100, 50, 0, 10, 20, 30, 255, 90, 80, 70, 77};
  DecodeOptions options;
  options.alpha.composite = false;
  auto img = DecodeImage(testing::BuildPng(3, 1, 8, 6, raw), {}, options);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, (Bytes{200, 100, 50, 10, 20, 30, 90, 80, 70}));
}

TEST(DecodeImageTest, GrayAlphaPngComesOutAsRgb) {
  const Bytes raw = {40, 255, 220, 0};  // 2x1 gray+alpha
  auto img = DecodeImage(testing::BuildPng(2, 1, 8, 4, raw));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, (Bytes{40, 40, 40, 220, 220, 220}));
}

TEST(DecodeImageTest, SixteenBitGrayPngClipsLikePillowsModeI) {
  // Pillow opens 16-bit gray as mode "I"; convert("RGB") clips to 0..255.
  const Bytes raw = {0x00, 0x00, 0x00, 0xc8, 0x00, 0xff, 0x01, 0x00, 0xff, 0xff};  // 0, 200, 255, 256, 65535
  auto img = DecodeImage(testing::BuildPng(5, 1, 16, 0, raw));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, (Bytes{0, 0, 0, 200, 200, 200, 255, 255, 255, 255, 255, 255, 255, 255, 255}));
}

TEST(DecodeImageTest, SixteenBitRgbPngKeepsTheHighByte) {
  // Pillow's "RGB;16B" raw mode: 0x12ff -> 0x12, never rounded up.
  const Bytes raw = {0x12, 0xff, 0x80, 0x80, 0xfe, 0xff};
  auto img = DecodeImage(testing::BuildPng(1, 1, 16, 2, raw));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, (Bytes{0x12, 0x80, 0xfe}));
}

TEST(DecodeImageTest, SixteenBitPngIsTreatedAsSrgb) {
  // Samples v * 257 (0xvvvv): sRGB reduction to 8 bits gives v back exactly,
  // whereas a linear-light reading would brighten the mid-tones.
  const std::uint8_t vals[6] = {0, 17, 64, 128, 200, 255};
  Bytes raw;
  for (std::uint8_t v : vals) raw.insert(raw.end(), {v, v});  // big-endian v*257
  auto img = DecodeImage(testing::BuildPng(2, 1, 16, 2, raw));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, (Bytes{0, 17, 64, 128, 200, 255}));
}

TEST(DecodeImageTest, EmptyInputIsRejected) {
  ExpectInvalid(DecodeImage(Bytes{}), "empty");
  ExpectInvalid(ProbeImage(Bytes{}), "empty");
}

TEST(DecodeImageTest, UnsupportedFormatNamesTheMagicBytes) {
  const Bytes tiff = {'I', 'I', '*', 0, 8, 0, 0, 0, 0, 0};
  auto s = DecodeImage(tiff);
  ExpectInvalid(s, "unsupported image format");
  EXPECT_NE(s.status().message().find("49 49 2a 00"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("TIFF"), std::string::npos);
  EXPECT_NE(s.status().message().find("supported: JPEG"), std::string::npos);
  ExpectInvalid(ProbeImage(Bytes{'h', 'e', 'l', 'l', 'o'}), "unsupported");
}

TEST(DecodeImageTest, CorruptJpegIsRejected) {
  Bytes jpeg = testing::EncodeJpegRgb(testing::PatternImage(32, 32), 90);
  // Keep SOI, destroy everything after it.
  for (std::size_t i = 3; i < jpeg.size(); ++i) jpeg[i] = static_cast<std::uint8_t>(i * 31);
  ExpectInvalid(DecodeImage(jpeg), "corrupt");
}

TEST(DecodeImageTest, CorruptPngIsRejected) {
  Bytes png = testing::EncodePngRgb(testing::PatternImage(32, 32));
  png[png.size() / 2] ^= 0xff;  // inside IDAT: CRC or zlib check fails
  ExpectInvalid(DecodeImage(png), "corrupt");
}

TEST(DecodeImageTest, TruncatedJpegIsRejectedNotHalfDecoded) {
  const Bytes jpeg = testing::EncodeJpegRgb(testing::PatternImage(64, 64), 90);
  ASSERT_TRUE(ProbeImage(testing::FirstHalf(jpeg)).ok());  // the header survives the cut
  ExpectInvalid(DecodeImage(testing::FirstHalf(jpeg)), "truncated");
}

TEST(DecodeImageTest, TruncatedPngIsRejected) {
  const Bytes png = testing::EncodePngRgb(testing::PatternImage(64, 64));
  ExpectInvalid(DecodeImage(testing::FirstHalf(png)), "truncated");
  // Cut inside the IHDR.
  ExpectInvalid(DecodeImage(Bytes(png.begin(), png.begin() + 20)), "truncated");
}

TEST(DecodeImageTest, ZeroSizedPngIsRejected) {
  Bytes png = testing::BuildPng(1, 1, 8, 2, Bytes{1, 2, 3});
  testing::SetPngSize(png, 0, 0);
  ExpectInvalid(ProbeImage(png), "zero-sized");
  ExpectInvalid(DecodeImage(png), "zero-sized");
}

TEST(DecodeImageTest, ZeroSizedJpegIsRejected) {
  Bytes jpeg = testing::EncodeJpegRgb(testing::PatternImage(16, 16), 90);
  testing::SetJpegSize(jpeg, 16, 0);
  ExpectInvalid(DecodeImage(jpeg), "zero-sized");
}

TEST(DecodeImageTest, PngBombHeaderIsRejectedBeforeAllocating) {
  // A valid 1x1 PNG whose IHDR claims 100000 x 100000 = 10^10 pixels.
  Bytes png = testing::BuildPng(1, 1, 8, 2, Bytes{1, 2, 3});
  testing::SetPngSize(png, 100000, 100000);
  auto info = ProbeImage(png);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->width, 100000);
  auto img = DecodeImage(png);
  ExpectInvalid(img, "too many pixels");
  EXPECT_NE(img.status().message().find("100000x100000"), std::string::npos) << img.status().message();
  EXPECT_NE(img.status().message().find("178956970"), std::string::npos) << img.status().message();
}

TEST(DecodeImageTest, JpegBombHeaderIsRejectedBeforeAllocating) {
  Bytes jpeg = testing::EncodeJpegRgb(testing::PatternImage(16, 16), 90);
  testing::SetJpegSize(jpeg, 60000, 60000);  // 3.6e9 pixels
  auto img = DecodeImage(jpeg);
  ExpectInvalid(img, "too many pixels");
  EXPECT_NE(img.status().message().find("60000x60000"), std::string::npos) << img.status().message();
}

TEST(DecodeImageTest, JpegSideOverLibjpegsMaximumIsTooManyPixels) {
  // 65535 is the largest side a SOF can declare; libjpeg stops at 65500.
  Bytes jpeg = testing::EncodeJpegRgb(testing::PatternImage(16, 16), 90);
  testing::SetJpegSize(jpeg, 65535, 16);
  ExpectInvalid(ProbeImage(jpeg), "too many pixels");
  ExpectInvalid(DecodeImage(jpeg), "65500");
}

TEST(DecodeImageTest, RealImageOverATinyLimitIsRejected) {
  const Bytes png = testing::EncodePngRgb(testing::PatternImage(20, 10));
  ExpectInvalid(DecodeImage(png, {.max_pixels = 199}), "limit of 199");
  EXPECT_TRUE(DecodeImage(png, {.max_pixels = 200}).ok());
  const Bytes jpeg = testing::EncodeJpegRgb(testing::PatternImage(20, 10), 90);
  ExpectInvalid(DecodeImage(jpeg, {.max_pixels = 199}), "20x10");
  EXPECT_TRUE(DecodeImage(jpeg, {.max_pixels = 200}).ok());
}

TEST(DecodeImageTest, NonPositiveLimitIsRejected) {
  ExpectInvalid(DecodeImage(testing::EncodePngRgb(testing::PatternImage(2, 2)), {.max_pixels = 0}), "max_pixels");
}

TEST(DecodeImageTest, TrailingBytesAfterTheImageAreIgnored) {
  const RgbImage src = testing::PatternImage(8, 8);
  Bytes png = testing::EncodePngRgb(src);
  png.insert(png.end(), {1, 2, 3, 4});
  auto img = DecodeImage(png);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, src.pixels);
}

}  // namespace
}  // namespace epd

namespace epd {
namespace {

using testing::Bytes;

template <typename T>
void ExpectInvalidNaming(const StatusOr<T>& s, std::string_view word) {
  ASSERT_FALSE(s.ok()) << "expected an error containing '" << word << "'";
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
  EXPECT_NE(s.status().message().find(word), std::string::npos)
      << "message '" << s.status().message() << "' lacks '" << word << "'";
}

// A 3x2 image whose pixels are labelled a..f (R = label, G = 10 * label):
//   a b c
//   d e f
RgbImage Labelled() {
  RgbImage img{3, 2, {}};
  for (int i = 0; i < 6; ++i) img.pixels.insert(img.pixels.end(), {std::uint8_t(i + 1), std::uint8_t(10 * (i + 1)), 7});
  return img;
}

// The labels of `img`, row by row.
std::vector<int> Labels(const RgbImage& img) {
  std::vector<int> out;
  for (std::size_t i = 0; i < img.pixels.size(); i += 3) out.push_back(img.pixels[i]);
  return out;
}

TEST(ExifOrientationTest, EveryOrientationIsDisplayedAsExifTransposeDoes) {
  // a=1 .. f=6. Expected layouts, from the EXIF definitions (and what
  // PIL.ImageOps.exif_transpose returns; the Pillow differential test checks
  // the same on photographs):
  struct Case {
    int orientation, width, height;
    std::vector<int> labels;
  };
  const Case cases[] = {
      {1, 3, 2, {1, 2, 3, 4, 5, 6}},  // as stored
      {2, 3, 2, {3, 2, 1, 6, 5, 4}},  // mirrored
      {3, 3, 2, {6, 5, 4, 3, 2, 1}},  // rotated 180
      {4, 3, 2, {4, 5, 6, 1, 2, 3}},  // flipped
      {5, 2, 3, {1, 4, 2, 5, 3, 6}},  // transposed
      {6, 2, 3, {4, 1, 5, 2, 6, 3}},  // rotated 90 clockwise
      {7, 2, 3, {6, 3, 5, 2, 4, 1}},  // transverse
      {8, 2, 3, {3, 6, 2, 5, 1, 4}},  // rotated 90 counter-clockwise
  };
  for (const Case& c : cases) {
    Bytes png = testing::EncodePngRgb(Labelled());
    const Bytes exif = testing::ExifWithOrientation(c.orientation);
    testing::InsertPngChunk(png, "eXIf", Bytes(exif.begin() + 6, exif.end()));  // eXIf holds no prefix
    auto info = ProbeImage(png);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->orientation, c.orientation);
    EXPECT_EQ(info->DisplayWidth(true), c.width);
    auto img = DecodeImage(png);
    ASSERT_TRUE(img.ok()) << img.status().ToString();
    EXPECT_EQ(img->width, c.width) << "orientation " << c.orientation;
    EXPECT_EQ(img->height, c.height) << "orientation " << c.orientation;
    EXPECT_EQ(Labels(*img), c.labels) << "orientation " << c.orientation;
    auto stored = DecodeImage(png, {}, DecodeOptions{.apply_exif_orientation = false});
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(Labels(*stored), (std::vector<int>{1, 2, 3, 4, 5, 6}));
  }
}

TEST(ExifOrientationTest, HeaderTokenCountOfARotatedPhoneJpegIsTheUprightOnes) {
  // The phone photo: stored 280x140 with Orientation 6, shown 140x280.
  Bytes jpeg = testing::EncodeJpegRgb(testing::PatternImage(280, 140), 90);
  const Bytes exif = testing::ExifWithOrientation(6);
  Bytes app1 = {0xff, 0xe1, 0, static_cast<std::uint8_t>(exif.size() + 2)};
  app1.insert(app1.end(), exif.begin(), exif.end());
  jpeg.insert(jpeg.begin() + 2, app1.begin(), app1.end());
  auto info = ProbeImage(jpeg);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->orientation, 6);
  PreprocessConfig cfg;
  // 140 wide, 280 tall: grid h = 280 / 14 = 20, w = 140 / 14 = 10.
  auto grid = GridForImage(*info, cfg);
  ASSERT_TRUE(grid.ok());
  EXPECT_EQ(*grid, (GridTHW{1, 20, 10}));
  auto pre = DecodeAndPreprocess(jpeg, cfg);
  ASSERT_TRUE(pre.ok()) << pre.status().ToString();
  EXPECT_EQ(pre->grid, *grid);
  cfg.decode.apply_exif_orientation = false;
  EXPECT_EQ(*GridForImage(*info, cfg), (GridTHW{1, 10, 20}));
  EXPECT_EQ(DecodeAndPreprocess(jpeg, cfg)->grid, (GridTHW{1, 10, 20}));
}

TEST(PngParityTest, GammaChunkIsIgnoredAsPillowIgnoresIt) {
  const RgbImage src = testing::PatternImage(9, 5);
  Bytes png = testing::EncodePngRgb(src);
  testing::InsertPngChunk(png, "gAMA", Bytes{0, 1, 0x86, 0xa0});  // gamma 1.0 (100000)
  auto img = DecodeImage(png);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, src.pixels);
}

TEST(WebpTest, LosslessRoundTripsExactly) {
  const RgbImage src = testing::PatternImage(128, 96);
  const Bytes webp = testing::EncodeWebpLosslessRgb(src);
  auto info = ProbeImage(webp);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->format, ImageFormat::kWebp);
  EXPECT_EQ(info->width, 128);
  // The screenshot: 128x96 -> smart_resize 140x84 (96 / 28 = 3.43 -> 3,
  // 128 / 28 = 4.57 -> 5) -> 15 tokens, like the same PNG.
  EXPECT_EQ(GridForImage(*info, PreprocessConfig{})->tokens(2), 15);
  auto img = DecodeImage(webp);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, src.pixels);
}

TEST(WebpTest, AlphaIsCompositedOnTheBackground) {
  // Same arithmetic as the PNG case: a = 77 over white gives 205, 202, 199.
  const Bytes rgba = {200, 100, 50, 0, 90, 80, 70, 77};
  auto img = DecodeImage(testing::EncodeWebpLosslessRgba(2, 1, rgba));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, (Bytes{255, 255, 255, 205, 202, 199}));
  DecodeOptions drop;
  drop.alpha.composite = false;
  auto dropped = DecodeImage(testing::EncodeWebpLosslessRgba(2, 1, rgba), {}, drop);
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(Bytes(dropped->pixels.begin() + 3, dropped->pixels.end()), (Bytes{90, 80, 70}));
}

// Wraps a simple-format WebP's image chunk in an extended (VP8X) file with a
// canvas of w x h and, optionally, an EXIF chunk.
Bytes ExtendedWebp(const Bytes& simple, std::uint32_t w, std::uint32_t h, const Bytes& exif = {}) {
  Bytes body = {'W', 'E', 'B', 'P', 'V', 'P', '8', 'X', 10, 0, 0, 0, std::uint8_t(exif.empty() ? 0 : 0x08), 0, 0, 0};
  for (std::uint32_t v : {w - 1, h - 1}) {
    body.insert(body.end(), {std::uint8_t(v), std::uint8_t(v >> 8), std::uint8_t(v >> 16)});
  }
  body.insert(body.end(), simple.begin() + 12, simple.end());
  if (!exif.empty()) {
    const auto n = static_cast<std::uint32_t>(exif.size());
    body.insert(body.end(), {'E', 'X', 'I', 'F', std::uint8_t(n), std::uint8_t(n >> 8), 0, 0});
    body.insert(body.end(), exif.begin(), exif.end());
    if (n & 1) body.push_back(0);
  }
  const auto size = static_cast<std::uint32_t>(body.size());
  Bytes out = {'R', 'I', 'F', 'F', std::uint8_t(size), std::uint8_t(size >> 8), std::uint8_t(size >> 16), 0};
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

TEST(WebpTest, ExifOrientationInAnExtendedFileIsApplied) {
  const Bytes webp = ExtendedWebp(testing::EncodeWebpLosslessRgb(Labelled()), 3, 2, testing::ExifWithOrientation(8));
  auto img = DecodeImage(webp);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(Labels(*img), (std::vector<int>{3, 6, 2, 5, 1, 4}));
}

TEST(WebpTest, LyingCanvasIsTooManyPixelsBeforeAnyAllocation) {
  const Bytes webp = ExtendedWebp(testing::EncodeWebpLosslessRgb(Labelled()), 100000, 100000);
  auto info = ProbeImage(webp);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->width, 100000);
  ExpectInvalidNaming(DecodeImage(webp), "too many pixels: the image is 100000x100000");
}

TEST(WebpTest, TruncatedAndCorruptAreNamed) {
  const Bytes webp = testing::EncodeWebpLosslessRgb(testing::PatternImage(64, 48));
  ExpectInvalidNaming(DecodeImage(testing::FirstHalf(webp)), "corrupt or truncated WebP data");
  Bytes bad = webp;
  bad[12] = 'X';  // first chunk is no longer VP8L
  ExpectInvalidNaming(DecodeImage(bad), "corrupt or truncated WebP data");
}

TEST(GifTest, FirstFrameIsExpandedThroughItsPalette) {
  const Bytes palette = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120};
  const Bytes indices = {0, 1, 2, 3, 3, 2, 1, 0};  // 4x2
  const Bytes gif = testing::EncodeGif(4, 2, 0, 0, 4, 2, indices, palette);
  auto info = ProbeImage(gif);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->format, ImageFormat::kGif);
  auto img = DecodeImage(gif);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  Bytes want;
  for (std::uint8_t i : indices)
    want.insert(want.end(), palette.begin() + std::ptrdiff_t{3} * i, palette.begin() + std::ptrdiff_t{3} * i + 3);
  EXPECT_EQ(img->pixels, want);
}

TEST(GifTest, AreaOutsideTheFrameIsTheTransparentIndexOrZero) {
  const Bytes palette = {10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120};
  // A 1x1 frame at (1, 0) on a 2x1 screen: pixel 0 is not covered.
  auto plain = DecodeImage(testing::EncodeGif(2, 1, 1, 0, 1, 1, Bytes{3}, palette));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->pixels, (Bytes{10, 20, 30, 100, 110, 120}));  // index 0, then index 3
  auto transparent = DecodeImage(testing::EncodeGif(2, 1, 1, 0, 1, 1, Bytes{3}, palette, 2));
  ASSERT_TRUE(transparent.ok());
  EXPECT_EQ(transparent->pixels, (Bytes{70, 80, 90, 100, 110, 120}));  // index 2's colour: alpha dropped
}

TEST(GifTest, FrameBeyondTheScreenGrowsTheImageAsPillowDoes) {
  const Bytes palette = {0, 0, 0, 255, 255, 255};
  const Bytes gif = testing::EncodeGif(2, 2, 1, 1, 2, 2, Bytes{1, 1, 1, 1}, palette);
  auto info = ProbeImage(gif);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->width, 3);
  EXPECT_EQ(info->height, 3);
  auto img = DecodeImage(gif);
  ASSERT_TRUE(img.ok());
  EXPECT_EQ(img->width, 3);
}

TEST(GifTest, LyingScreenTruncatedAndCorruptAreNamed) {
  const Bytes palette = {0, 0, 0, 255, 255, 255};
  Bytes gif = testing::EncodeGif(8, 8, 0, 0, 8, 8, Bytes(64, 1), palette);
  Bytes lying = gif;
  lying[6] = lying[7] = lying[8] = lying[9] = 0xff;  // 65535x65535 screen
  ExpectInvalidNaming(DecodeImage(lying), "too many pixels: the image is 65535x65535");
  ExpectInvalidNaming(DecodeImage(Bytes(gif.begin(), gif.begin() + 20)), "corrupt or truncated GIF data");
  ExpectInvalidNaming(ProbeImage(Bytes(gif.begin(), gif.begin() + 8)), "corrupt or truncated GIF data");
}

TEST(BmpTest, TwentyFourBitRoundTripsExactly) {
  const RgbImage src = testing::PatternImage(13, 7);  // 39-byte rows: padding exercised
  const Bytes bmp = testing::EncodeBmp24(src);
  auto info = ProbeImage(bmp);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->format, ImageFormat::kBmp);
  auto img = DecodeImage(bmp);
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  EXPECT_EQ(img->pixels, src.pixels);
}

TEST(BmpTest, TruncatedRleAndLyingHeadersAreNamed) {
  const Bytes bmp = testing::EncodeBmp24(testing::PatternImage(13, 7));
  ExpectInvalidNaming(DecodeImage(testing::FirstHalf(bmp)), "corrupt or truncated BMP data");
  Bytes rle = bmp;
  rle[30] = 1;  // biCompression = BI_RLE8
  ExpectInvalidNaming(DecodeImage(rle), "unsupported BMP compression: RLE8");
  Bytes lying = bmp;
  lying[18] = lying[19] = lying[20] = 0xff;  // width 0x00ffffff
  lying[22] = lying[23] = lying[24] = 0xff;  // height 0x00ffffff
  ExpectInvalidNaming(DecodeImage(lying), "too many pixels");
}

TEST(AlphaPolicyTest, ParsesTheCliSpellings) {
  EXPECT_EQ(*ParseAlphaPolicy("white"), AlphaPolicy{});
  EXPECT_FALSE(ParseAlphaPolicy("none")->composite);
  EXPECT_EQ(ParseAlphaPolicy("0,128,255")->background, (std::array<std::uint8_t, 3>{0, 128, 255}));
  EXPECT_EQ(AlphaPolicyName(*ParseAlphaPolicy("0,128,255")), "0,128,255");
  EXPECT_EQ(AlphaPolicyName(*ParseAlphaPolicy("255,255,255")), "white");
  for (const char* bad : {"", "black", "1,2", "1,2,3,4", "1,2,256", "1,,3", "-1,2,3"}) {
    ExpectInvalidNaming(ParseAlphaPolicy(bad), "rgba background");
  }
}

}  // namespace
}  // namespace epd
