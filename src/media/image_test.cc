#include "epd/image.h"

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cstdlib>
#include <string>

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
  src.pixels.resize(64 * 48 * 3);
  for (int y = 0; y < 48; ++y) {
    for (int x = 0; x < 64; ++x) {
      std::uint8_t* p = &src.pixels[(y * 64 + x) * 3];
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
  Bytes gray(32 * 16);
  for (int i = 0; i < 32 * 16; ++i) gray[i] = static_cast<std::uint8_t>(60 + (i % 32) * 4);
  auto img = DecodeImage(testing::EncodeJpegGray(32, 16, gray, 95));
  ASSERT_TRUE(img.ok()) << img.status().ToString();
  ASSERT_EQ(img->pixels.size(), 32u * 16 * 3);
  for (int i = 0; i < 32 * 16; ++i) {
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
  const Bytes cmyk(16 * 16 * 4, 100);
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
