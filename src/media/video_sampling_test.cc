// Tests of the qwen-vl-utils sampling arithmetic (epd/media/video.h). Every
// expected value is worked by hand in the comment beside it from the
// formulas of vision_process.py (smart_nframes, fetch_video, smart_resize),
// not taken from the code's output.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "epd/media/video.h"
#include "test_images.h"

namespace epd {
namespace {

using Bytes = std::vector<std::uint8_t>;

std::int64_t Count(const VideoSampling& s, std::int64_t total, double fps, std::int64_t t = 2) {
  auto n = SampleFrameCount(s, total, fps, t);
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  return n.ok() ? *n : -1;
}

TEST(SampleFrameCountTest, DefaultsSampleTwoFramesPerSecondRoundedDownToEven) {
  const VideoSampling s;
  // 20 s at 10 fps: 200 / 10 * 2 = 40.
  EXPECT_EQ(Count(s, 200, 10), 40);
  // 7.3 s at 24 fps = 175 frames: 175 / 24 * 2 = 14.58 -> floor to even 14.
  EXPECT_EQ(Count(s, 175, 24), 14);
  // 10 s at 25 fps, fps 1.3: 250 / 25 * 1.3 = 13 -> 12.
  VideoSampling slow;
  slow.fps = 1.3;
  EXPECT_EQ(Count(slow, 250, 25), 12);
}

TEST(SampleFrameCountTest, ShortVideoIsRaisedToMinFrames) {
  const VideoSampling s;
  // 1 s at 30 fps: 30 / 30 * 2 = 2 < FPS_MIN_FRAMES 4 -> 4.
  EXPECT_EQ(Count(s, 30, 30), 4);
  // min_frames 5 -> ceil to even 6.
  VideoSampling more;
  more.min_frames = 5;
  EXPECT_EQ(Count(more, 30, 30), 6);
}

TEST(SampleFrameCountTest, NeverExceedsTheFramesThereAre) {
  const VideoSampling s;
  // 3 frames: max(0.2, 4) = 4, min with 3 = 3 -> floor to even 2.
  EXPECT_EQ(Count(s, 3, 30), 2);
  // 5 frames at 1 fps: 5 / 1 * 2 = 10 -> min with 5 -> 4.
  EXPECT_EQ(Count(s, 5, 1), 4);
}

TEST(SampleFrameCountTest, LongVideoIsCappedAtMaxFrames) {
  const VideoSampling s;
  // 1 h at 30 fps = 108000 frames: 7200 -> FPS_MAX_FRAMES 768.
  EXPECT_EQ(Count(s, 108000, 30), 768);
  VideoSampling few;
  few.max_frames = 9;  // floor to even 8
  EXPECT_EQ(Count(few, 200, 10), 8);
}

TEST(SampleFrameCountTest, ExactNframesIsRoundedHalfToEvenMultiple) {
  VideoSampling s;
  s.nframes = 5;  // 5 / 2 = 2.5 rounds to even 2 -> 4
  EXPECT_EQ(Count(s, 30, 30), 4);
  s.nframes = 7;  // 3.5 -> 4 -> 8
  EXPECT_EQ(Count(s, 30, 30), 8);
  s.nframes = 8;  // fps is ignored: 8 of 200 frames
  EXPECT_EQ(Count(s, 200, 10), 8);
}

TEST(SampleFrameCountTest, TemporalPatchSizeIsTheFrameFactor) {
  const VideoSampling s;
  // T = 4: 175 / 24 * 2 = 14.58 -> floor to a multiple of 4: 12.
  EXPECT_EQ(Count(s, 175, 24, 4), 12);
  // T = 1: 14.58 -> 14.
  EXPECT_EQ(Count(s, 175, 24, 1), 14);
}

TEST(SampleFrameCountTest, RejectsTooFewFramesForOneTemporalPatch) {
  const VideoSampling s;
  // One frame: floor(min(4, 0, 1) / 2) * 2 = 0 < 2.
  auto n = SampleFrameCount(s, 1, 30, 2);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(n.status().message().find("1 frames"), std::string::npos) << n.status().message();
  // nframes beyond the video.
  VideoSampling exact;
  exact.nframes = 40;
  auto m = SampleFrameCount(exact, 30, 30, 2);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("40"), std::string::npos) << m.status().message();
}

TEST(SampleFrameCountTest, RejectsBadInputsNamingThem) {
  const VideoSampling s;
  EXPECT_NE(SampleFrameCount(s, 0, 30, 2).status().message().find("no frames"), std::string::npos);
  EXPECT_NE(SampleFrameCount(s, 30, 0, 2).status().message().find("frame rate"), std::string::npos);
  EXPECT_NE(SampleFrameCount(s, 30, NAN, 2).status().message().find("frame rate"), std::string::npos);
  EXPECT_NE(SampleFrameCount(s, 30, 30, 0).status().message().find("temporal_patch_size"), std::string::npos);
  VideoSampling bad;
  bad.fps = -1;
  EXPECT_NE(SampleFrameCount(bad, 30, 30, 2).status().message().find("fps"), std::string::npos);
}

TEST(VideoSamplingTest, ValidateNamesTheBadField) {
  EXPECT_TRUE(VideoSampling{}.Validate().ok());
  auto msg = [](auto mutate) {
    VideoSampling s;
    mutate(s);
    Status st = s.Validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    return st.message();
  };
  EXPECT_NE(msg([](VideoSampling& s) { s.fps = INFINITY; }).find("fps"), std::string::npos);
  EXPECT_NE(msg([](VideoSampling& s) { s.nframes = 0; }).find("nframes"), std::string::npos);
  EXPECT_NE(msg([](VideoSampling& s) { s.min_frames = 0; }).find("min_frames"), std::string::npos);
  EXPECT_NE(msg([](VideoSampling& s) { s.max_frames = 3; }).find("max_frames"), std::string::npos);
  EXPECT_NE(msg([](VideoSampling& s) { s.min_pixels = 0; }).find("min_pixels"), std::string::npos);
  EXPECT_NE(msg([](VideoSampling& s) { s.max_pixels = 10; }).find("max_pixels"), std::string::npos);
  EXPECT_NE(msg([](VideoSampling& s) { s.total_pixels = 0; }).find("total_pixels"), std::string::npos);
  EXPECT_NE(msg([](VideoSampling& s) { s.resized_height = 100; }).find("resized_height"), std::string::npos);
  EXPECT_NE(msg([](VideoSampling& s) {
              s.resized_height = 0;
              s.resized_width = 5;
            }).find("resized size"),
            std::string::npos);
}

TEST(VideoSamplingTest, ForPatchSizeScalesTheQwenVlUtilsBudgets) {
  // Patch 14: factor 28, 128 * 784, 768 * 784, 128000 * 784 * 0.9: the defaults.
  const VideoSampling p14 = VideoSampling::ForPatchSize(14);
  EXPECT_EQ(p14.min_pixels, 100352);
  EXPECT_EQ(p14.max_pixels, 602112);
  EXPECT_EQ(p14.total_pixels, 90316800);
  const VideoSampling defaults;
  EXPECT_EQ(p14.min_pixels, defaults.min_pixels);
  EXPECT_EQ(p14.max_pixels, defaults.max_pixels);
  EXPECT_EQ(p14.total_pixels, defaults.total_pixels);
  // Patch 16 (Qwen3-VL): factor 32, 128 * 1024, 768 * 1024, 128000 * 1024 * 0.9.
  const VideoSampling p16 = VideoSampling::ForPatchSize(16);
  EXPECT_EQ(p16.min_pixels, 131072);
  EXPECT_EQ(p16.max_pixels, 786432);
  EXPECT_EQ(p16.total_pixels, 117964800);
  EXPECT_DOUBLE_EQ(p16.fps, 2.0);
  EXPECT_EQ(p16.min_frames, 4);
  EXPECT_EQ(p16.max_frames, 768);
}

TEST(SampleFrameIndicesTest, UniformOverTheWholeVideo) {
  // linspace(0, 29, 4) = 0, 9.67, 19.33, 29.
  EXPECT_EQ(SampleFrameIndices(30, 4), (std::vector<std::int64_t>{0, 10, 19, 29}));
  // linspace(0, 174, 14): 174 * i / 13 rounded.
  EXPECT_EQ(SampleFrameIndices(175, 14),
            (std::vector<std::int64_t>{0, 13, 27, 40, 54, 67, 80, 94, 107, 120, 134, 147, 161, 174}));
  // Every frame when n == total.
  EXPECT_EQ(SampleFrameIndices(4, 4), (std::vector<std::int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(SampleFrameIndices(9, 1), (std::vector<std::int64_t>{0}));
  EXPECT_TRUE(SampleFrameIndices(9, 0).empty());
}

TEST(SampleFrameIndicesTest, TiesRoundHalfToEvenAsTorchRound) {
  // linspace(0, 3, 3) = 0, 1.5, 3: 1.5 -> 2.  linspace(0, 5, 3): 2.5 -> 2.
  EXPECT_EQ(SampleFrameIndices(4, 3), (std::vector<std::int64_t>{0, 2, 3}));
  EXPECT_EQ(SampleFrameIndices(6, 3), (std::vector<std::int64_t>{0, 2, 5}));
}

TEST(SampleFrameIndicesTest, LongVideoIndicesAreExact) {
  // 2^20 frames, 768 samples: index i = round(1048575 * i / 767); i = 767 is
  // the last frame, i = 1 is 1367.1 -> 1367.
  const auto idx = SampleFrameIndices(1 << 20, 768);
  ASSERT_EQ(idx.size(), 768u);
  EXPECT_EQ(idx[1], 1367);
  EXPECT_EQ(idx.back(), (1 << 20) - 1);
  for (std::size_t i = 1; i < idx.size(); ++i) EXPECT_LT(idx[i - 1], idx[i]);
}

ResizedSize Size(std::int64_t h, std::int64_t w, std::int64_t n, const VideoSampling& s = {},
                 const PreprocessConfig& cfg = {}) {
  auto r = VideoFrameSize(h, w, n, s, cfg);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ResizedSize{};
}

TEST(VideoFrameSizeTest, SmallFrameIsRaisedToVideoMinPixels) {
  // 64x64: 56x56 = 3136 < 128 * 784 = 100352; beta = sqrt(100352 / 4096) =
  // 4.95; 64 * 4.95 / 28 = 11.3 -> ceil 12 -> 336.
  EXPECT_EQ(Size(64, 64, 4), (ResizedSize{336, 336}));
}

TEST(VideoFrameSizeTest, LargeFrameIsCappedAtVideoMaxPixels) {
  // 1080x1920 portrait (H 1920, W 1080), 40 frames: budget 90316800 / 40 * 2
  // = 4515840 > 602112, so max 602112; beta = sqrt(2073600 / 602112) = 1.856;
  // 1920 / 1.856 / 28 = 36.9 -> 1008, 1080 / 1.856 / 28 = 20.8 -> 560.
  EXPECT_EQ(Size(1920, 1080, 40), (ResizedSize{1008, 560}));
}

TEST(VideoFrameSizeTest, TotalPixelBudgetShrinksFramesOfLongVideos) {
  // 768 frames: budget 90316800 / 768 * 2 = 235200 < 602112; beta =
  // sqrt(2073600 / 235200) = 2.969; 1920 / 2.969 / 28 = 23.1 -> 644,
  // 1080 / 2.969 / 28 = 12.99 -> 336.
  EXPECT_EQ(Size(1920, 1080, 768), (ResizedSize{644, 336}));
}

TEST(VideoFrameSizeTest, BudgetNeverFallsBelowMinPixelsTimes1_05) {
  // total_pixels 1e6 over 100 frames: 20000, below int(100352 * 1.05) =
  // 105369, so max 105369; 480x640: beta = sqrt(307200 / 105369) = 1.7075;
  // 480 / 1.7075 / 28 = 10.04 -> 280, 640 / 1.7075 / 28 = 13.39 -> 364.
  VideoSampling s;
  s.total_pixels = 1'000'000;
  EXPECT_EQ(Size(480, 640, 100, s), (ResizedSize{280, 364}));
}

TEST(VideoFrameSizeTest, FixedSizeIsRoundedBySmartResizeOnly) {
  // resized 100x200 -> round(3.57) * 28 = 112, round(7.14) * 28 = 196,
  // whatever the source size and frame count.
  VideoSampling s;
  s.resized_height = 100;
  s.resized_width = 200;
  EXPECT_EQ(Size(1080, 1920, 768, s), (ResizedSize{112, 196}));
}

TEST(VideoFrameSizeTest, Patch16UsesFactor32) {
  // Qwen3-VL: 64x64 with min 131072: beta = sqrt(131072 / 4096) = 5.657;
  // 64 * 5.657 / 32 = 11.3 -> 12 -> 384.
  PreprocessConfig cfg;
  cfg.patch_size = 16;
  EXPECT_EQ(Size(64, 64, 4, VideoSampling::ForPatchSize(16), cfg), (ResizedSize{384, 384}));
}

TEST(VideoFrameSizeTest, RejectsAbsurdAspectRatio) {
  auto r = VideoFrameSize(10, 2100, 4, {}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("aspect ratio"), std::string::npos);
}

// --- frame lists ---------------------------------------------------------

TEST(SampleFrameListTest, PadsToTemporalPatchAndResizesAll) {
  // Three 64x64 frames: padded to 4 (the last repeated), each 336x336 (see
  // SmallFrameIsRaisedToVideoMinPixels), grid (2, 24, 24).
  std::vector<Bytes> files = {
      testing::EncodePngRgb(testing::ConstantImage(64, 64, 10, 20, 30)),
      testing::EncodePngRgb(testing::ConstantImage(64, 64, 40, 50, 60)),
      testing::EncodePngRgb(testing::ConstantImage(64, 64, 70, 80, 90)),
  };
  std::vector<std::span<const std::uint8_t>> spans(files.begin(), files.end());
  auto v = SampleFrameList(spans, {}, {});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_EQ(v->frames.size(), 4u);
  EXPECT_EQ(v->grid, (GridTHW{2, 24, 24}));
  for (const RgbImage& f : v->frames) {
    EXPECT_EQ(f.width, 336);
    EXPECT_EQ(f.height, 336);
  }
  // A constant image stays constant through the resize.
  EXPECT_EQ(v->frames[1].pixels[0], 40);
  EXPECT_EQ(v->frames[2].pixels[0], 70);
  EXPECT_EQ(v->frames[3].pixels, v->frames[2].pixels);
  EXPECT_EQ(v->timestamps_s, (std::vector<double>{0, 0.5, 1.0, 1.5}));  // i / fps 2
  EXPECT_DOUBLE_EQ(v->sample_fps, 2.0);
  EXPECT_DOUBLE_EQ(v->seconds_per_grid_t, 1.0);  // 2 frames / 2 fps
  EXPECT_EQ(v->source_frames, 3);
}

TEST(SampleFrameListTest, RejectsEmptyListAndNamesTheBadFrame) {
  auto empty = SampleFrameList({}, {}, {});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("empty"), std::string::npos);

  Bytes good = testing::EncodePngRgb(testing::ConstantImage(64, 64, 1, 2, 3));
  Bytes bad = testing::FirstHalf(good);
  std::vector<std::span<const std::uint8_t>> spans = {good, good, bad};
  auto v = SampleFrameList(spans, {}, {});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("frame 2"), std::string::npos) << v.status().message();
}

TEST(SampleFrameListTest, RefusesTotalBytesOverLimitBeforeDecodingTheRest) {
  // 4 frames of 336x336 RGB8 = 1354752 bytes > 1000000.
  Bytes good = testing::EncodePngRgb(testing::ConstantImage(64, 64, 1, 2, 3));
  Bytes bad = testing::FirstHalf(good);  // would fail if it were decoded
  std::vector<std::span<const std::uint8_t>> spans = {good, bad, bad, bad};
  VideoLimits limits;
  limits.max_decoded_bytes = 1'000'000;
  auto v = SampleFrameList(spans, {}, {}, {}, limits);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("max_decoded_bytes"), std::string::npos) << v.status().message();
}

// --- chunks ----------------------------------------------------------------

TEST(PreprocessChunkTest, ChunkOfTwoEqualFramesEqualsPreprocessOfTheImage) {
  const PreprocessConfig cfg;
  // 100x70 (WxH) -> SmartResize 70 -> round(2.5) = 2 -> 56, 100 -> 4 -> 112.
  const RgbImage image = testing::PatternImage(100, 70);
  auto size = SmartResize(image.height, image.width, cfg);
  ASSERT_TRUE(size.ok());
  ASSERT_EQ(*size, (ResizedSize{56, 112}));
  auto resized = ResizeRgb(image, 112, 56, cfg.resample);
  ASSERT_TRUE(resized.ok());

  SampledVideo video;
  video.frames = {*resized, *resized, testing::ConstantImage(112, 56, 0, 0, 0),
                  testing::ConstantImage(112, 56, 0, 0, 0)};
  video.grid = GridTHW{2, 4, 8};
  auto chunk = PreprocessChunk(video, 0, cfg);
  ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
  auto pre = Preprocess(image, cfg);
  ASSERT_TRUE(pre.ok());
  EXPECT_EQ(chunk->grid, pre->grid);
  EXPECT_EQ(chunk->grid, (GridTHW{1, 4, 8}));
  EXPECT_EQ(chunk->patch_dim, pre->patch_dim);
  EXPECT_EQ(chunk->merge_size, pre->merge_size);
  EXPECT_EQ(chunk->patches, pre->patches);  // bit-identical
}

TEST(PreprocessChunkTest, EachFrameFillsItsTemporalSlotOfEveryRow) {
  // Frame 2 constant 255, frame 3 constant 0 (chunk 1). Within a row the
  // order is (channel, frame, y, x): floats [c*2*196 + t*196, +196) are
  // channel c of frame t, so (v / 255 - mean[c]) / std[c].
  const PreprocessConfig cfg;
  SampledVideo video;
  video.frames = {testing::ConstantImage(56, 28, 9, 9, 9), testing::ConstantImage(56, 28, 9, 9, 9),
                  testing::ConstantImage(56, 28, 255, 255, 255), testing::ConstantImage(56, 28, 0, 0, 0)};
  auto chunk = PreprocessChunk(video, 1, cfg);
  ASSERT_TRUE(chunk.ok()) << chunk.status().ToString();
  ASSERT_EQ(chunk->grid, (GridTHW{1, 2, 4}));
  ASSERT_EQ(chunk->patches.size(), 8u * 1176u);
  for (std::size_t row = 0; row < 8; ++row) {
    for (int c = 0; c < 3; ++c) {
      const float white = (1.0f - cfg.mean[c]) / cfg.std[c];
      const float black = (0.0f - cfg.mean[c]) / cfg.std[c];
      const float* r = chunk->patches.data() + row * 1176;
      EXPECT_FLOAT_EQ(r[c * 392 + 0], white);
      EXPECT_FLOAT_EQ(r[c * 392 + 195], white);
      EXPECT_FLOAT_EQ(r[c * 392 + 196], black);
      EXPECT_FLOAT_EQ(r[c * 392 + 391], black);
    }
  }
}

TEST(PreprocessChunkTest, RejectsOutOfRangeChunkAndMismatchedFrames) {
  const PreprocessConfig cfg;
  SampledVideo video;
  video.frames = {testing::ConstantImage(56, 28, 1, 1, 1), testing::ConstantImage(56, 28, 1, 1, 1)};
  EXPECT_NE(PreprocessChunk(video, 1, cfg).status().message().find("out of range"), std::string::npos);
  EXPECT_NE(PreprocessChunk(video, -1, cfg).status().message().find("out of range"), std::string::npos);
  video.frames[1] = testing::ConstantImage(28, 28, 1, 1, 1);
  auto r = PreprocessChunk(video, 0, cfg);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("frame 1"), std::string::npos) << r.status().message();
  video.frames = {testing::ConstantImage(30, 28, 1, 1, 1), testing::ConstantImage(30, 28, 1, 1, 1)};
  EXPECT_NE(PreprocessChunk(video, 0, cfg).status().message().find("factor"), std::string::npos);
  video.frames.pop_back();
  EXPECT_NE(PreprocessChunk(video, 0, cfg).status().message().find("multiple"), std::string::npos);
}

}  // namespace
}  // namespace epd
