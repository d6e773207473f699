#include "epd/media/preprocess.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "patchify.h"
#include "test_images.h"

namespace epd {
namespace {

// The Qwen2-VL reference table: input HxW -> resized HxW -> post-merge tokens,
// worked by hand from the smart_resize formula with factor 28, min_pixels
// 3136, max_pixels 1003520.
struct TokenRow {
  std::int64_t h, w, resized_h, resized_w, tokens;
};
constexpr TokenRow kQwen2VlTokenTable[] = {
    {512, 512, 504, 504, 324},     {427, 640, 420, 644, 345}, {1411, 1411, 980, 980, 1225},
    {3000, 4000, 840, 1148, 1230}, {46, 70, 56, 56, 4},  // 70 / 28 = 2.5 rounds half to even: 2
    {10, 1000, 28, 1008, 36},
};

TEST(SmartResizeTest, MatchesQwen2VlTokenTable) {
  const PreprocessConfig cfg;
  for (const TokenRow& r : kQwen2VlTokenTable) {
    SCOPED_TRACE(std::to_string(r.h) + "x" + std::to_string(r.w));
    auto size = SmartResize(r.h, r.w, cfg);
    ASSERT_TRUE(size.ok()) << size.status().ToString();
    EXPECT_EQ(size->height, r.resized_h);
    EXPECT_EQ(size->width, r.resized_w);
    auto grid = GridForImage(r.h, r.w, cfg);
    ASSERT_TRUE(grid.ok());
    EXPECT_EQ(*grid, (GridTHW{1, r.resized_h / 14, r.resized_w / 14}));
    EXPECT_EQ(grid->tokens(2), r.tokens);
    // The table is self-consistent: one token per 28x28 block.
    EXPECT_EQ(r.resized_h * r.resized_w / (std::int64_t{28} * 28), r.tokens);
  }
}

TEST(SmartResizeTest, RejectsAspectRatioAbove200) {
  const PreprocessConfig cfg;
  auto s = SmartResize(10, 2001, cfg);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("aspect ratio"), std::string::npos) << s.status().message();
  EXPECT_FALSE(SmartResize(2001, 10, cfg).ok());
  EXPECT_TRUE(SmartResize(10, 2000, cfg).ok());  // exactly 200:1 is allowed
}

TEST(SmartResizeTest, RejectsZeroAndNegativeSizes) {
  const PreprocessConfig cfg;
  for (auto [h, w] : {std::pair<std::int64_t, std::int64_t>{0, 10}, {10, 0}, {0, 0}, {-5, 10}}) {
    auto s = SmartResize(h, w, cfg);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("zero-sized"), std::string::npos);
  }
}

TEST(SmartResizeTest, ResultsAreMultiplesOfFactorWithinBounds) {
  const PreprocessConfig cfg;
  for (std::int64_t h : {1, 27, 28, 29, 333, 1080, 4096}) {
    for (std::int64_t w : {1, 55, 56, 720, 1920, 4000}) {
      if (std::max(h, w) > 200 * std::min(h, w)) continue;
      auto s = SmartResize(h, w, cfg);
      ASSERT_TRUE(s.ok()) << h << "x" << w;
      EXPECT_EQ(s->height % 28, 0);
      EXPECT_EQ(s->width % 28, 0);
      EXPECT_LE(s->height * s->width, cfg.max_pixels) << h << "x" << w;
      EXPECT_GE(s->height * s->width, cfg.min_pixels) << h << "x" << w;
    }
  }
}

TEST(PreprocessConfigTest, ValidateNamesTheBadField) {
  EXPECT_TRUE(PreprocessConfig{}.Validate().ok());
  auto expect_bad = [](PreprocessConfig c, std::string_view field) {
    Status s = c.Validate();
    ASSERT_FALSE(s.ok()) << field;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  };
  PreprocessConfig c;
  c.patch_size = 0;
  expect_bad(c, "patch_size");
  c = {};
  c.merge_size = -1;
  expect_bad(c, "merge_size");
  c = {};
  c.temporal_patch_size = 0;
  expect_bad(c, "temporal_patch_size");
  c = {};
  c.max_pixels = c.min_pixels - 1;
  expect_bad(c, "max_pixels");
  c = {};
  c.min_pixels = 0;
  expect_bad(c, "min_pixels");
  c = {};
  c.std[1] = 0;
  expect_bad(c, "std[1]");
  c = {};
  c.mean[2] = NAN;
  expect_bad(c, "mean[2]");
  c = {};
  c.resample = static_cast<Resample>(9);
  expect_bad(c, "resample");
  c = {};
  c.patch_size = 0;
  EXPECT_FALSE(SmartResize(100, 100, c).ok());
}

TEST(ResizeTest, ConstantImageStaysConstant) {
  const RgbImage src = testing::ConstantImage(37, 23, 12, 200, 99);
  for (auto [w, h] : {std::pair{100, 80}, std::pair{9, 5}, std::pair{37, 60}}) {
    for (Resample f : {Resample::kBicubic, Resample::kBilinear}) {
      auto out = ResizeRgb(src, w, h, f);
      ASSERT_TRUE(out.ok());
      EXPECT_EQ(out->pixels, testing::ConstantImage(w, h, 12, 200, 99).pixels) << w << "x" << h;
    }
  }
}

TEST(ResizeTest, HorizontalGradientStaysMonotone) {
  // R rises along x; the blur of a monotone ramp must stay monotone (no
  // ringing on a linear ramp, even for the negative-lobed cubic).
  RgbImage src{200, 10, {}};
  src.pixels.resize(std::size_t{200} * 10 * 3);
  for (int y = 0; y < 10; ++y) {
    for (int x = 0; x < 200; ++x) {
      std::uint8_t* p = &src.pixels[static_cast<std::size_t>(y * 200 + x) * 3];
      p[0] = p[1] = p[2] = static_cast<std::uint8_t>(x * 255 / 199);
    }
  }
  for (int w : {56, 333}) {
    auto out = ResizeRgb(src, w, 7, Resample::kBicubic);
    ASSERT_TRUE(out.ok());
    for (int y = 0; y < 7; ++y) {
      for (int x = 1; x < w; ++x) {
        EXPECT_GE(out->pixels[static_cast<std::size_t>(y * w + x) * 3],
                  out->pixels[static_cast<std::size_t>(y * w + x - 1) * 3])
            << "w=" << w << " x=" << x;
      }
    }
    EXPECT_LT(out->pixels[0], 10);
    EXPECT_GT(out->pixels[static_cast<std::size_t>(w - 1) * 3], 245);
  }
}

// PIL's resampling (Pillow libImaging/Resample.c), written out independently
// in double precision: separable, kernel centred at (i + 0.5) * scale, support
// widened by the scale when downscaling, weights normalised; the horizontal
// pass is rounded to uint8 before the vertical one, as PIL does. At the
// borders the weights of the taps inside the image are renormalised to 1.
std::vector<double> PilResample1d(const std::vector<double>& in, int out_n) {
  const int in_n = static_cast<int>(in.size());
  const double scale = static_cast<double>(in_n) / out_n;  // input pixels per output pixel
  const double filterscale = std::max(scale, 1.0);
  const double support = 2.0 * filterscale;
  auto cubic = [](double x) {
    x = std::fabs(x);
    if (x < 1) return (1.5 * x - 2.5) * x * x + 1;
    if (x < 2) return ((-0.5 * x + 2.5) * x - 4) * x + 2;
    return 0.0;
  };
  std::vector<double> out(out_n);
  for (int i = 0; i < out_n; ++i) {
    const double center = (i + 0.5) * scale;
    double sum = 0, wsum = 0;
    for (int j = static_cast<int>(std::floor(center - support)); j <= static_cast<int>(std::ceil(center + support));
         ++j) {
      const double wgt = cubic((j + 0.5 - center) / filterscale);
      if (wgt == 0) continue;
      if (j < 0 || j >= in_n) continue;  // taps outside the image are dropped, the rest renormalised (Pillow)
      sum += wgt * in[j];
      wsum += wgt;
    }
    out[i] = sum / wsum;
  }
  return out;
}

TEST(ResizeTest, BicubicMatchesPilStyleTwoPassReference) {
  const RgbImage src = testing::PatternImage(90, 70);
  for (auto [w, h] : {std::pair{45, 35}, std::pair{31, 50}, std::pair{150, 112}}) {
    auto out = ResizeRgb(src, w, h, Resample::kBicubic);
    ASSERT_TRUE(out.ok());
    for (int c = 0; c < 3; ++c) {
      // Rows first, then columns, all in double.
      std::vector<std::vector<double>> tmp(src.height);
      for (int y = 0; y < src.height; ++y) {
        std::vector<double> row(src.width);
        for (int x = 0; x < src.width; ++x) row[x] = src.pixels[(y * src.width + x) * 3 + c];
        tmp[y] = PilResample1d(row, w);
        // PIL stores the horizontal pass as uint8: round and clamp.
        for (double& v : tmp[y]) v = std::clamp(std::round(v), 0.0, 255.0);
      }
      int worst = 0, off_by_more_than_one = 0;
      for (int x = 0; x < w; ++x) {
        std::vector<double> col(src.height);
        for (int y = 0; y < src.height; ++y) col[y] = tmp[y][x];
        const std::vector<double> ref = PilResample1d(col, h);
        for (int y = 0; y < h; ++y) {
          const int want = static_cast<int>(std::clamp(std::round(ref[y]), 0.0, 255.0));
          const int err = std::abs(want - int{out->pixels[(y * w + x) * 3 + c]});
          worst = std::max(worst, err);
          off_by_more_than_one += err > 1;
        }
      }
      // Fixed-point weights (22 bits, as Pillow's) vs double: an
      // intermediate value may round the other way (1 level, weight <= 1)
      // and the final value too, so 2 at worst, and rarely. PatternImage wraps 255 -> 0, so the intermediate
      // clamping is exercised.
      EXPECT_LE(worst, 2) << w << "x" << h << " channel " << c;
      EXPECT_LE(off_by_more_than_one, w * h / 100) << w << "x" << h << " channel " << c;
    }
  }
}

TEST(ResizeTest, RejectsMalformedImages) {
  RgbImage bad{4, 4, std::vector<std::uint8_t>(10)};
  auto r = ResizeRgb(bad, 2, 2, Resample::kBicubic);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ResizeRgb(testing::ConstantImage(2, 2, 0, 0, 0), 0, 2, Resample::kBicubic).ok());
}

// Naive reference for the Qwen2-VL layout: build the [T, C, H, W] array, view
// it as the 9-d shape, apply numpy-style transpose (0,3,6,4,7,2,1,5,8), and
// read the result in row-major order. Uses only generic index arithmetic, no
// knowledge of what the axes mean.
std::vector<float> NaiveQwenPatchify(const std::vector<float>& planar, int H, int W, int T, int P, int m) {
  const int C = 3;
  std::vector<float> frames;
  for (int t = 0; t < T; ++t) frames.insert(frames.end(), planar.begin(), planar.end());
  const std::vector<std::int64_t> shape = {1, T, C, H / P / m, m, P, W / P / m, m, P};
  std::vector<std::int64_t> stride(9);
  stride[8] = 1;
  for (int k = 7; k >= 0; --k) stride[k] = stride[k + 1] * shape[k + 1];
  const int perm[9] = {0, 3, 6, 4, 7, 2, 1, 5, 8};
  std::vector<std::int64_t> out_shape(9);
  for (int k = 0; k < 9; ++k) out_shape[k] = shape[perm[k]];
  std::vector<float> out(frames.size());
  std::vector<std::int64_t> idx(9, 0);  // multi-index into the output
  for (std::size_t flat = 0; flat < out.size(); ++flat) {
    std::int64_t src = 0;
    for (int k = 0; k < 9; ++k) src += idx[k] * stride[perm[k]];
    out[flat] = frames[src];
    for (int k = 8; k >= 0; --k) {  // increment the odometer
      if (++idx[k] < out_shape[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

TEST(PatchifyTest, MatchesNaiveTransposeOnDistinctValues) {
  const PreprocessConfig cfg;
  for (auto [H, W] : {std::pair{56, 56}, std::pair{56, 112}, std::pair{84, 28}}) {
    std::vector<float> planar(std::size_t{3} * H * W);
    std::iota(planar.begin(), planar.end(), 0.0f);  // every value distinct (< 2^24: exact)
    const std::vector<float> got = internal::Patchify(planar, H, W, cfg);
    EXPECT_EQ(got, NaiveQwenPatchify(planar, H, W, 2, 14, 2)) << H << "x" << W;
    EXPECT_EQ(got.size(), static_cast<std::size_t>(H / 14 * W / 14 * 1176));
  }
}

TEST(PatchifyTest, FirstRowIsTheTopLeftPatch) {
  // Spot check of the layout by meaning: row 0 = patch (0,0); row 1 = patch
  // (0,1) (next in the same 2x2 merge block); row 2 = patch (1,0).
  const PreprocessConfig cfg;
  const int H = 56, W = 56;
  std::vector<float> planar(std::size_t{3} * H * W);
  std::iota(planar.begin(), planar.end(), 0.0f);
  const std::vector<float> got = internal::Patchify(planar, H, W, cfg);
  auto at = [&](int c, int y, int x) { return planar[(c * H + y) * W + x]; };
  EXPECT_EQ(got[0], at(0, 0, 0));
  EXPECT_EQ(got[13], at(0, 0, 13));
  EXPECT_EQ(got[14], at(0, 1, 0));
  EXPECT_EQ(got[196], at(0, 0, 0));                     // frame 1 repeats frame 0
  EXPECT_EQ(got[392], at(1, 0, 0));                     // then channel G
  EXPECT_EQ(got[1176], at(0, 0, 14));                   // row 1: patch (0, 1)
  EXPECT_EQ(got[std::size_t{2} * 1176], at(0, 14, 0));  // row 2: patch (1, 0)
  EXPECT_EQ(got[std::size_t{4} * 1176], at(0, 0, 28));  // row 4: the next merge block
}

TEST(PreprocessTest, NormalisesAndPatchifiesLikeTheReference) {
  const PreprocessConfig cfg;
  for (auto [H, W] : {std::pair{56, 56}, std::pair{56, 84}}) {
    // Sizes already on the grid: no resampling, so values are exact.
    const RgbImage img = testing::PatternImage(W, H);
    auto pre = Preprocess(img, cfg);
    ASSERT_TRUE(pre.ok()) << pre.status().ToString();
    EXPECT_EQ(pre->grid, (GridTHW{1, H / 14, W / 14}));
    EXPECT_EQ(pre->patch_dim, 1176);
    EXPECT_EQ(pre->tokens(), H / 28 * (W / 28));
    std::vector<float> planar(std::size_t{3} * H * W);
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < H * W; ++i) {
        const float x = static_cast<float>(img.pixels[3 * i + c] / 255.0);
        planar[c * H * W + i] = (x - cfg.mean[c]) / cfg.std[c];
      }
    }
    EXPECT_EQ(pre->patches, NaiveQwenPatchify(planar, H, W, 2, 14, 2));
  }
}

TEST(PreprocessTest, NormalisedExtremesMatchClipConstants) {
  const PreprocessConfig cfg;
  auto black = Preprocess(testing::ConstantImage(56, 56, 0, 0, 0), cfg);
  auto white = Preprocess(testing::ConstantImage(56, 56, 255, 255, 255), cfg);
  ASSERT_TRUE(black.ok() && white.ok());
  // (0 - 0.48145466) / 0.26862954 and (1 - 0.48145466) / 0.26862954.
  EXPECT_NEAR(black->patches[0], -1.7922625, 1e-6);
  EXPECT_NEAR(white->patches[0], 1.9303361, 1e-6);
  // Blue plane starts at 2 * 2 * 14 * 14 in each row.
  EXPECT_NEAR(black->patches[784], -0.40821073 / 0.27577711, 1e-6);
}

TEST(PreprocessTest, OutputSizeAgreesWithGridForImage) {
  const PreprocessConfig cfg;
  for (auto [H, W] : {std::pair{100, 37}, std::pair{427, 640}, std::pair{5, 300}}) {
    auto pre = Preprocess(testing::PatternImage(W, H), cfg);
    ASSERT_TRUE(pre.ok()) << pre.status().ToString();
    auto grid = GridForImage(H, W, cfg);
    ASSERT_TRUE(grid.ok());
    EXPECT_EQ(pre->grid, *grid);
    EXPECT_EQ(pre->patches.size(), static_cast<std::size_t>(grid->patches() * 1176));
  }
}

TEST(PreprocessTest, RejectsMalformedImageAndBadConfig) {
  RgbImage bad{10, 10, std::vector<std::uint8_t>(5)};
  auto r = Preprocess(bad, PreprocessConfig{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  PreprocessConfig cfg;
  cfg.merge_size = 0;
  EXPECT_FALSE(Preprocess(testing::ConstantImage(4, 4, 1, 2, 3), cfg).ok());
  auto thin = Preprocess(testing::ConstantImage(1000, 2, 1, 2, 3), PreprocessConfig{});
  ASSERT_FALSE(thin.ok());
  EXPECT_NE(thin.status().message().find("aspect ratio"), std::string::npos);
}

TEST(PreprocessTest, DecodeAndPreprocessEqualsTheTwoSteps) {
  const PreprocessConfig cfg;
  const testing::Bytes png = testing::EncodePngRgb(testing::PatternImage(90, 61));
  auto both = DecodeAndPreprocess(png, cfg);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  auto img = DecodeImage(png);
  ASSERT_TRUE(img.ok());
  auto two = Preprocess(*img, cfg);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(both->grid, two->grid);
  EXPECT_EQ(both->patches, two->patches);
  // Errors pass through.
  auto bad = DecodeAndPreprocess(testing::Bytes{'G', 'I', 'F', '8'}, cfg);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  auto bomb = DecodeAndPreprocess(png, cfg, {.max_pixels = 100});
  ASSERT_FALSE(bomb.ok());
  EXPECT_NE(bomb.status().message().find("too many pixels"), std::string::npos);
}

}  // namespace
}  // namespace epd
