// The fused resample-normalise-patchify path (PreprocessInto, PatchWriter,
// the resampler's per-thread scratch): equal to the separate steps, and free
// of allocations once warm.
//
// Allocations are counted by replacing the global operator new (and new[])
// in this test binary: every C++ allocation of the process goes through the
// counter, so "the counter did not move across the call" means the call
// allocated nothing through new. (C allocations by C libraries, e.g.
// libjpeg-turbo's own working memory, are not seen; PreprocessInto calls
// none.)
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <thread>
#include <vector>

#include "epd/media/content_key.h"
#include "epd/media/preprocess.h"
#include "epd/media/video.h"
#include "patchify.h"
#include "test_images.h"

namespace {
std::atomic<long> g_news{0};
}  // namespace

// GCC pairs the malloc here with operator new's own contract and warns that
// free() gets "new" memory; both halves are ours and match.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace epd {
namespace {

// The unfused path, each step separately tested: ResizeRgb, then a float
// image ([3, H, W]), then the permutation (PatchifyTest's naive check).
std::vector<float> Unfused(const RgbImage& img, const PreprocessConfig& cfg) {
  auto size = SmartResize(img.height, img.width, cfg);
  EXPECT_TRUE(size.ok());
  auto resized = ResizeRgb(img, static_cast<int>(size->width), static_cast<int>(size->height), cfg.resample);
  EXPECT_TRUE(resized.ok());
  return internal::Patchify(internal::NormalizeToPlanar(*resized, cfg), resized->height, resized->width, cfg);
}

PreprocessConfig Config(int patch, int merge, int temporal) {
  PreprocessConfig cfg;
  cfg.patch_size = patch;
  cfg.merge_size = merge;
  cfg.temporal_patch_size = temporal;
  cfg.min_pixels = std::int64_t{4} * patch * merge * patch * merge;
  return cfg;
}

TEST(FusedPreprocessTest, EqualsResizeThenNormaliseThenPatchify) {
  // Qwen2-VL (14), Qwen3-VL (16), a side with no fixed-length loop (5) and
  // odd merge and temporal sizes; downscales, upscales and one unchanged axis.
  for (const PreprocessConfig& cfg : {Config(14, 2, 2), Config(16, 2, 2), Config(5, 3, 3), Config(14, 2, 1)}) {
    for (auto [w, h] : {std::pair{333, 251}, std::pair{61, 47}, std::pair{112, 400}}) {
      const RgbImage img = testing::PatternImage(w, h);
      auto pre = Preprocess(img, cfg);
      ASSERT_TRUE(pre.ok()) << pre.status().ToString();
      EXPECT_EQ(pre->patches, Unfused(img, cfg)) << w << "x" << h << " patch " << cfg.patch_size;
    }
  }
}

TEST(FusedPreprocessTest, PreprocessIntoWritesPreprocessRows) {
  const PreprocessConfig cfg;
  const RgbImage img = testing::PatternImage(427, 300);
  auto pre = Preprocess(img, cfg);
  ASSERT_TRUE(pre.ok());
  std::vector<float> rows(pre->patches.size(), -7.0f);
  ASSERT_TRUE(PreprocessInto(img, cfg, rows).ok());
  EXPECT_EQ(rows, pre->patches);
}

TEST(FusedPreprocessTest, PreprocessIntoRefusesAWrongLengthByName) {
  std::vector<float> rows(10);
  Status s = PreprocessInto(testing::PatternImage(56, 56), PreprocessConfig{}, rows);
  ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
  // 56x56: 16 rows of 1176 floats.
  EXPECT_NE(s.message().find("rows has 10 floats"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("16 rows of 1176 = 18816"), std::string::npos) << s.ToString();
}

TEST(FusedPreprocessTest, PreprocessIntoAllocatesNothingOnceWarm) {
  const PreprocessConfig cfg;
  const RgbImage big = testing::PatternImage(1024, 768);
  const RgbImage other = testing::ConstantImage(1024, 768, 9, 99, 199);
  const RgbImage small = testing::PatternImage(300, 200);
  auto grid = GridForImage(big.height, big.width, cfg);
  ASSERT_TRUE(grid.ok());
  std::vector<float> rows(static_cast<std::size_t>(grid->patches() * cfg.patch_dim()));
  ASSERT_TRUE(PreprocessInto(big, cfg, rows).ok());  // warm-up: the scratch grows
  auto small_grid = GridForImage(small.height, small.width, cfg);
  ASSERT_TRUE(small_grid.ok());
  std::vector<float> small_rows(static_cast<std::size_t>(small_grid->patches() * cfg.patch_dim()));

  const long before = g_news.load();
  ASSERT_TRUE(PreprocessInto(other, cfg, rows).ok());
  ASSERT_TRUE(PreprocessInto(big, cfg, rows).ok());
  ASSERT_TRUE(PreprocessInto(small, cfg, small_rows).ok());  // smaller: fits the scratch
  EXPECT_EQ(g_news.load() - before, 0);

  // And the counter does count: Preprocess allocates its result.
  const long counted = g_news.load();
  ASSERT_TRUE(Preprocess(big, cfg).ok());
  EXPECT_GT(g_news.load() - counted, 0);
}

TEST(FusedPreprocessTest, ThreadsHaveTheirOwnScratch) {
  const PreprocessConfig cfg;
  const RgbImage a = testing::PatternImage(640, 427), b = testing::PatternImage(301, 555);
  auto want_a = Preprocess(a, cfg), want_b = Preprocess(b, cfg);
  ASSERT_TRUE(want_a.ok() && want_b.ok());
  std::vector<int> mismatches(2, 0);
  auto loop = [&](int t) {
    const RgbImage& img = t == 0 ? a : b;
    const std::vector<float>& want = t == 0 ? want_a->patches : want_b->patches;
    for (int i = 0; i < 20; ++i) {
      auto got = Preprocess(img, cfg);
      mismatches[t] += !got.ok() || got->patches != want;
    }
  };
  std::thread other(loop, 1);
  loop(0);
  other.join();
  EXPECT_EQ(mismatches[0], 0);
  EXPECT_EQ(mismatches[1], 0);
}

// `jpeg` with an APP1 Exif segment (orientation o) right after SOI.
testing::Bytes WithExif(const testing::Bytes& jpeg, int o) {
  const testing::Bytes exif = testing::ExifWithOrientation(o);
  const std::size_t len = exif.size() + 2;
  const std::uint8_t app1[4] = {0xff, 0xe1, static_cast<std::uint8_t>(len >> 8), static_cast<std::uint8_t>(len & 0xff)};
  testing::Bytes out;
  out.reserve(jpeg.size() + exif.size() + 4);
  out.push_back(jpeg[0]);  // SOI
  out.push_back(jpeg[1]);
  out.insert(out.end(), app1, app1 + 4);
  out.insert(out.end(), exif.begin(), exif.end());
  out.insert(out.end(), jpeg.begin() + 2, jpeg.end());
  return out;
}

// DecodeAndPreprocess's JPEG path (a per-thread buffer) against DecodeImage
// then Preprocess, on every branch: plain, EXIF-rotated and CMYK (which take
// DecodeImage), orientation ignored, corrupt and over the pixel limit.
TEST(FusedPreprocessTest, DecodeAndPreprocessOfJpegEqualsTheTwoSteps) {
  const RgbImage img = testing::PatternImage(301, 197);
  const testing::Bytes plain = testing::EncodeJpegRgb(img, 90);
  testing::Bytes cmyk_px(std::size_t{64} * 48 * 4);
  for (std::size_t i = 0; i < cmyk_px.size(); ++i) cmyk_px[i] = static_cast<std::uint8_t>(i * 7);
  PreprocessConfig no_exif;
  no_exif.decode.apply_exif_orientation = false;
  struct Case {
    testing::Bytes bytes;
    PreprocessConfig cfg;
  };
  for (const Case& c : {Case{plain, {}}, Case{WithExif(plain, 6), {}}, Case{WithExif(plain, 6), no_exif},
                        Case{testing::EncodeJpegCmyk(64, 48, cmyk_px, 90), {}}}) {
    auto decoded = DecodeImage(c.bytes, {}, c.cfg.decode);
    ASSERT_TRUE(decoded.ok());
    auto want = Preprocess(*decoded, c.cfg);
    auto got = DecodeAndPreprocess(c.bytes, c.cfg);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(got->grid, want->grid);
    EXPECT_EQ(got->patches, want->patches);
  }
  const testing::Bytes corrupt = testing::FirstHalf(plain);
  EXPECT_EQ(DecodeAndPreprocess(corrupt, {}).status().ToString(), DecodeImage(corrupt).status().ToString());
  const DecodeLimits tight{.max_pixels = 1000};
  EXPECT_EQ(DecodeAndPreprocess(plain, {}, tight).status().ToString(), DecodeImage(plain, tight).status().ToString());
}

// A video chunk's T distinct frames through the fused writer equal the
// separate normalise and PatchifyFrames (tested on distinct values).
TEST(FusedPreprocessTest, VideoChunkOfDistinctFramesEqualsPatchifyFrames) {
  for (const PreprocessConfig& cfg : {Config(14, 2, 2), Config(16, 2, 3)}) {
    SampledVideo video;
    const int W = 4 * cfg.patch_size * cfg.merge_size, H = 2 * cfg.patch_size * cfg.merge_size;
    for (int k = 0; k < 2 * cfg.temporal_patch_size; ++k) {
      RgbImage frame = testing::PatternImage(W, H);
      for (std::uint8_t& v : frame.pixels) v = static_cast<std::uint8_t>(v + 37 * k);
      video.frames.push_back(std::move(frame));
    }
    auto chunk = PreprocessChunk(video, 1, cfg);
    ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
    std::vector<std::vector<float>> planar;
    planar.reserve(static_cast<std::size_t>(cfg.temporal_patch_size));
    for (int k = 0; k < cfg.temporal_patch_size; ++k) {
      planar.push_back(internal::NormalizeToPlanar(video.frames[cfg.temporal_patch_size + k], cfg));
    }
    std::vector<const std::vector<float>*> ptrs;
    ptrs.reserve(planar.size());
    for (const auto& p : planar) ptrs.push_back(&p);
    EXPECT_EQ(chunk->patches, internal::PatchifyFrames(ptrs, H, W, cfg)) << "patch " << cfg.patch_size;
  }
}

// A smooth 2400 x 1800 photo-like image: its resized size (1148 x 840) is
// under half of it, so jpeg_dct_scaling decodes it at 1/2.
TEST(FusedPreprocessTest, DctScalingIsOffByDefaultKeepsTheGridAndChangesTheKey) {
  RgbImage img{2400, 1800, {}};
  img.pixels.resize(std::size_t{2400} * 1800 * 3);
  for (int y = 0; y < 1800; ++y) {
    for (int x = 0; x < 2400; ++x) {
      std::uint8_t* p = &img.pixels[(static_cast<std::size_t>(y) * 2400 + x) * 3];
      p[0] = static_cast<std::uint8_t>(x / 10);
      p[1] = static_cast<std::uint8_t>(y / 8);
      p[2] = static_cast<std::uint8_t>(128 + 100 * std::sin(x / 37.0 + y / 53.0));
    }
  }
  const testing::Bytes jpeg = testing::EncodeJpegRgb(img, 90);
  PreprocessConfig on;
  on.jpeg_dct_scaling = true;
  EXPECT_FALSE(PreprocessConfig{}.jpeg_dct_scaling);
  auto full = DecodeAndPreprocess(jpeg, {});
  auto scaled = DecodeAndPreprocess(jpeg, on);
  ASSERT_TRUE(full.ok() && scaled.ok());
  EXPECT_EQ(scaled->grid, full->grid);
  EXPECT_EQ(full->grid, (GridTHW{1, 60, 82}));  // 840 x 1148: under half of 1800 x 2400
  ASSERT_EQ(scaled->patches.size(), full->patches.size());
  double sum = 0;
  for (std::size_t i = 0; i < full->patches.size(); ++i) sum += std::fabs(scaled->patches[i] - full->patches[i]);
  const double mean_levels = sum / static_cast<double>(full->patches.size()) * 0.27 * 255;
  EXPECT_GT(mean_levels, 0.0);  // the option does change the decode
  EXPECT_LT(mean_levels, 2.0);  // but it is the same picture
  EXPECT_NE(ComputeContentKey("m", on, jpeg), ComputeContentKey("m", PreprocessConfig{}, jpeg));
}

}  // namespace
}  // namespace epd
