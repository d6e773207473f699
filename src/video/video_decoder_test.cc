// Tests of epd::ProbeVideo / epd::DecodeVideo on files Debian's ffmpeg makes
// at build time (make_video_fixtures.py, in EPD_VIDEO_FIXTURES). Expected
// frame counts, indices and sizes are worked by hand from qwen-vl-utils'
// formulas in the comments; pixels are checked against the image path.
#include "epd/video/video_decoder.h"

#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <iterator>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "video_orientation.h"

namespace epd {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes Fixture(const std::string& name) {
  std::ifstream in(std::string(EPD_VIDEO_FIXTURES) + "/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<double> Times(std::initializer_list<int> idx, double fps) {
  std::vector<double> t;
  for (int i : idx) t.push_back(i / fps);
  return t;
}

// `tol`: the container's time base (Matroska stores milliseconds).
void ExpectTimestamps(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-9) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "frame " << i;
}

TEST(ProbeVideoTest, ReadsTheH264Mp4Header) {
  auto info = ProbeVideo(Fixture("h264.mp4"));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_NE(info->container.find("mp4"), std::string::npos) << info->container;
  EXPECT_EQ(info->codec, "h264");
  EXPECT_EQ(info->width, 160);
  EXPECT_EQ(info->height, 120);
  EXPECT_EQ(info->frames, 20);
  EXPECT_DOUBLE_EQ(info->fps, 10.0);
  EXPECT_NEAR(info->duration_s, 2.0, 1e-6);
}

TEST(ProbeVideoTest, ReadsTheVp9WebmHeaderAndEstimatesFrames) {
  // WebM has no frame count: 1 s * 12 fps.
  auto info = ProbeVideo(Fixture("vp9.webm"));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_NE(info->container.find("webm"), std::string::npos) << info->container;
  EXPECT_EQ(info->codec, "vp9");
  EXPECT_EQ(info->width, 160);
  EXPECT_EQ(info->height, 120);
  EXPECT_DOUBLE_EQ(info->fps, 12.0);
  EXPECT_EQ(info->frames, 12);
}

TEST(DecodeVideoTest, SamplesH264Mp4AsQwenVlUtils) {
  // 20 frames at 10 fps: 20 / 10 * 2 = 4 frames; linspace(0, 19, 4) = 0,
  // 6.33, 12.67, 19 -> 0, 6, 13, 19. 120x160: 112x168 = 18816 < 100352;
  // beta = sqrt(100352 / 19200) = 2.286; 120 * 2.286 / 28 = 9.8 -> 280,
  // 160 * 2.286 / 28 = 13.06 -> 392. Grid (2, 20, 28).
  auto v = DecodeVideo(Fixture("h264.mp4"), {}, {});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_EQ(v->frames.size(), 4u);
  for (const RgbImage& f : v->frames) {
    EXPECT_EQ(f.width, 392);
    EXPECT_EQ(f.height, 280);
    EXPECT_EQ(f.pixels.size(), 392u * 280u * 3u);
  }
  EXPECT_EQ(v->grid, (GridTHW{2, 20, 28}));
  ExpectTimestamps(v->timestamps_s, Times({0, 6, 13, 19}, 10));
  EXPECT_EQ(v->source_frames, 20);
  EXPECT_DOUBLE_EQ(v->source_fps, 10.0);
  EXPECT_DOUBLE_EQ(v->sample_fps, 2.0);          // 4 / 20 * 10
  EXPECT_DOUBLE_EQ(v->seconds_per_grid_t, 1.0);  // 2 / 2.0
  // testsrc draws a moving pattern: the sampled frames differ.
  EXPECT_NE(v->frames[0].pixels, v->frames[3].pixels);
}

TEST(DecodeVideoTest, ExactFrameCountPicksLinspaceIndices) {
  // nframes 8: linspace(0, 19, 8) = 19 i / 7 -> 0, 3, 5, 8, 11, 14, 16, 19.
  VideoSampling s;
  s.nframes = 8;
  auto v = DecodeVideo(Fixture("h264.mp4"), s, {});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->grid.t, 4);
  ExpectTimestamps(v->timestamps_s, Times({0, 3, 5, 8, 11, 14, 16, 19}, 10));
  EXPECT_DOUBLE_EQ(v->sample_fps, 4.0);  // 8 / 20 * 10
}

TEST(DecodeVideoTest, MoovAtTheEndDecodesLikeFaststart) {
  auto a = DecodeVideo(Fixture("h264.mp4"), {}, {});
  auto b = DecodeVideo(Fixture("h264_moov_end.mp4"), {}, {});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->frames.size(), b->frames.size());
  for (std::size_t i = 0; i < a->frames.size(); ++i) EXPECT_EQ(a->frames[i].pixels, b->frames[i].pixels);
}

TEST(DecodeVideoTest, SamplesVp9Webm) {
  // 12 frames at 12 fps: 2 -> min 4; linspace(0, 11, 4) = 0, 3.67, 7.33, 11.
  auto v = DecodeVideo(Fixture("vp9.webm"), {}, {});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->source_frames, 12);
  EXPECT_EQ(v->grid, (GridTHW{2, 20, 28}));
  ExpectTimestamps(v->timestamps_s, Times({0, 4, 7, 11}, 12), 0.0005);
  EXPECT_DOUBLE_EQ(v->sample_fps, 4.0);          // 4 / 12 * 12
  EXPECT_DOUBLE_EQ(v->seconds_per_grid_t, 0.5);  // 2 / 4.0
}

TEST(DecodeVideoTest, SamplesMpeg4Avi) {
  // 8 frames at 8 fps -> 4; linspace(0, 7, 4) = 0, 2.33, 4.67, 7. 64x96:
  // beta = sqrt(100352 / 6144) = 4.041; 64 * 4.041 / 28 = 9.2 -> 280,
  // 96 * 4.041 / 28 = 13.9 -> 392.
  auto v = DecodeVideo(Fixture("mpeg4.avi"), {}, {});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->source_frames, 8);
  EXPECT_EQ(v->grid, (GridTHW{2, 20, 28}));
  ExpectTimestamps(v->timestamps_s, Times({0, 2, 5, 7}, 8));
}

TEST(DecodeVideoTest, LosslessFrameEqualsTheImagePathPixelForPixel) {
  // FFV1 RGB is lossless, so sampled frame 2 (source frame 13) is exactly
  // ffmpeg's PNG of frame 13 after the image path's resize (112x168 ->
  // 280x392, as SamplesMpeg4Avi's arithmetic with beta = sqrt(100352 /
  // 18816) = 2.309).
  const Bytes png = Fixture("lossless_frame13.png");
  auto image = DecodeImage(png);
  ASSERT_TRUE(image.ok()) << image.status().ToString();
  ASSERT_EQ(image->width, 168);
  auto want = ResizeRgb(*image, 392, 280, Resample::kBicubic);
  ASSERT_TRUE(want.ok());
  auto v = DecodeVideo(Fixture("lossless.mkv"), {}, {});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_EQ(v->frames.size(), 4u);
  EXPECT_EQ(v->frames[2].pixels, want->pixels);
  // And with no resize at all (resized 112x168 is already a multiple of 28).
  VideoSampling same;
  same.resized_height = 112;
  same.resized_width = 168;
  auto raw = DecodeVideo(Fixture("lossless.mkv"), same, {});
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  EXPECT_EQ(raw->frames[2].pixels, image->pixels);
  EXPECT_EQ(raw->grid, (GridTHW{2, 8, 12}));
}

TEST(DecodeVideoTest, Patch16CheckpointUsesFactor32) {
  // Qwen3-VL: 120x160 with min 131072: 128x160 = 20480 < 131072; beta =
  // sqrt(131072 / 19200) = 2.613; 120 * 2.613 / 32 = 9.8 -> 320, 160 * 2.613
  // / 32 = 13.06 -> 448. Grid (2, 20, 28) in patches of 16.
  PreprocessConfig cfg;
  cfg.patch_size = 16;
  auto v = DecodeVideo(Fixture("h264.mp4"), VideoSampling::ForPatchSize(16), cfg);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->frames[0].height, 320);
  EXPECT_EQ(v->frames[0].width, 448);
  EXPECT_EQ(v->grid, (GridTHW{2, 20, 28}));
}

// --- rotation: the display matrix, as ffmpeg's autorotate applies it -------

// A frame as ffmpeg's autorotate shows it (make_video_fixtures.py):
// "<name>_frame5.png".
RgbImage FfmpegFrame(const std::string& png) {
  auto image = DecodeImage(Fixture(png));
  EXPECT_TRUE(image.ok()) << png << ": " << image.status().ToString();
  return image.ok() ? *image : RgbImage{};
}

// Samples `file` at its shown size, unresized (168x112 and 112x168 are
// multiples of 28): frames 0, 2, 5, 7 of the 8.
StatusOr<SampledVideo> DecodeUnresized(const std::string& file, bool portrait, bool rotation = true) {
  VideoSampling s;
  s.resized_height = portrait ? 168 : 112;
  s.resized_width = portrait ? 112 : 168;
  s.apply_rotation = rotation;
  return DecodeVideo(Fixture(file), s, {});
}

struct RotationCase {
  const char* name;
  const char* file;
  bool portrait;
  VideoOrientation header;  // what ProbeVideo reads from the container
  const char* frame0_png;   // ffmpeg's frame 0, when there is one
};

class RotationTest : public ::testing::TestWithParam<RotationCase> {};

TEST_P(RotationTest, FramesAreFfmpegsAutorotatedPixelsExactly) {
  const RotationCase& c = GetParam();
  auto v = DecodeUnresized(c.file, c.portrait);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_EQ(v->frames.size(), 4u);
  // Sampled frame 2 is source frame 5. The SEI case's frame 5 is compared
  // with the container matrix's (ffmpeg turns only its SEI frame, 0).
  const bool sei = c.frame0_png != nullptr;
  const RgbImage want = FfmpegFrame(sei ? "rgb_rot90_frame5.png" : std::string(c.name) + "_frame5.png");
  ASSERT_EQ(want.width, c.portrait ? 112 : 168);
  EXPECT_EQ(v->frames[2].width, want.width);
  EXPECT_EQ(v->frames[2].height, want.height);
  EXPECT_EQ(v->frames[2].pixels, want.pixels);  // lossless RGB: exact
  if (sei) {
    EXPECT_EQ(v->frames[0].pixels, FfmpegFrame(c.frame0_png).pixels);
  }
  auto info = ProbeVideo(Fixture(c.file));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->orientation, c.header);
}

TEST_P(RotationTest, RotationOffDecodesTheFramesAsStored) {
  const RotationCase& c = GetParam();
  auto off = DecodeUnresized(c.file, false, /*rotation=*/false);
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(off->frames[2].pixels, FfmpegFrame("rgb_frame5.png").pixels);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, RotationTest,
    ::testing::Values(RotationCase{"rgb", "rgb.mp4", false, {}, nullptr},
                      RotationCase{"rgb_rot90", "rgb_rot90.mp4", true, {90, false, true}, nullptr},
                      RotationCase{"rgb_rot180", "rgb_rot180.mp4", false, {180, false, true}, nullptr},
                      RotationCase{"rgb_rot270", "rgb_rot270.mp4", true, {270, false, true}, nullptr},
                      RotationCase{"rgb_hflip", "rgb_hflip.mp4", false, {0, true, true}, nullptr},
                      // The SEI is in the bitstream: the header has no matrix.
                      RotationCase{"rgb_sei90", "rgb_sei90.mkv", true, {}, "rgb_sei90_frame0.png"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(RotationTest, AQuarterTurnMakesTheHeaderGridAndTheSampledGridPortrait) {
  // 112x168 stored, shown 168x112 (HxW): min_pixels 100352 > 18816, beta =
  // sqrt(100352 / 18816) = 2.309; 168 * 2.309 / 28 = 13.9 -> 392, 112 *
  // 2.309 / 28 = 9.2 -> 280. Grid (2, 28, 20); landscape (2, 20, 28).
  auto info = ProbeVideo(Fixture("rgb_rot90.mp4"));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->width, 168);
  EXPECT_EQ(info->display_width(), 112);
  EXPECT_EQ(info->display_height(), 168);
  auto header = VideoHeaderGrid(*info, {}, {});
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(*header, (GridTHW{2, 28, 20}));
  auto v = DecodeVideo(Fixture("rgb_rot90.mp4"), {}, {});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->grid, *header);
  EXPECT_EQ(v->frames[0].height, 392);
  EXPECT_EQ(v->frames[0].width, 280);
  VideoSampling off;
  off.apply_rotation = false;
  auto stored = VideoHeaderGrid(*info, off, {});
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(*stored, (GridTHW{2, 20, 28}));
  // The SEI-only file is portrait once decoded (its header cannot say).
  auto sei = DecodeVideo(Fixture("rgb_sei90.mkv"), {}, {});
  ASSERT_TRUE(sei.ok()) << sei.status().ToString();
  EXPECT_EQ(sei->grid, (GridTHW{2, 28, 20}));
}

TEST(RotationTest, AnAngleThatIsNotAQuarterTurnIsRefusedNamingItUnlessRotationIsOff) {
  auto v = DecodeVideo(Fixture("rgb_rot45.mp4"), {}, {});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("45 degrees"), std::string::npos) << v.status().message();
  auto off = DecodeUnresized("rgb_rot45.mp4", false, /*rotation=*/false);
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(off->frames[2].pixels, FfmpegFrame("rgb_frame5.png").pixels);
  auto info = ProbeVideo(Fixture("rgb_rot45.mp4"));
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->orientation.quarter_turn);
  EXPECT_EQ(info->orientation.ccw_degrees, 45);
}

TEST(OrientFrameTest, TurnsAndFlipsATinyFrameByHand) {
  // 3x2 (WxH): pixel (x, y) holds (x, y, 7).
  RgbImage f;
  f.width = 3;
  f.height = 2;
  for (int y = 0; y < 2; ++y) {
    for (int x = 0; x < 3; ++x) f.pixels.insert(f.pixels.end(), {std::uint8_t(x), std::uint8_t(y), 7});
  }
  auto at = [](const RgbImage& img, int x, int y) {
    const std::size_t i = (static_cast<std::size_t>(y) * img.width + x) * 3;
    return std::pair<int, int>{img.pixels[i], img.pixels[i + 1]};
  };
  // 90 degrees counterclockwise: the right column becomes the top row.
  const RgbImage ccw = internal::OrientFrame(f, {90, false, true});
  ASSERT_EQ(ccw.width, 2);
  ASSERT_EQ(ccw.height, 3);
  EXPECT_EQ(at(ccw, 0, 0), (std::pair<int, int>{2, 0}));
  EXPECT_EQ(at(ccw, 1, 0), (std::pair<int, int>{2, 1}));
  EXPECT_EQ(at(ccw, 0, 2), (std::pair<int, int>{0, 0}));
  EXPECT_EQ(at(ccw, 1, 2), (std::pair<int, int>{0, 1}));
  // A horizontal flip: columns reversed, rows kept.
  const RgbImage flip = internal::OrientFrame(f, {0, true, true});
  ASSERT_EQ(flip.width, 3);
  EXPECT_EQ(at(flip, 0, 0), (std::pair<int, int>{2, 0}));
  EXPECT_EQ(at(flip, 2, 1), (std::pair<int, int>{0, 1}));
  // The identity is the frame itself.
  EXPECT_EQ(internal::OrientFrame(f, {}).pixels, f.pixels);
}

// --- bad input: each a clean kInvalidArgument naming the problem ------------

struct BadCase {
  const char* file;
  const char* says;  // substring of the message
};

class BadVideoTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadVideoTest, IsInvalidArgumentNamingTheProblem) {
  const Bytes bytes = Fixture(GetParam().file);
  auto v = DecodeVideo(bytes, {}, {});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << v.status().ToString();
  EXPECT_NE(v.status().message().find(GetParam().says), std::string::npos) << v.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, BadVideoTest,
    ::testing::Values(BadCase{"truncated.mp4", "truncated"}, BadCase{"truncated_moov.mp4", "truncated"},
                      BadCase{"audio.wav", "no video stream"}, BadCase{"zero_frames.y4m", "no frames"},
                      BadCase{"huge.y4m", "10000x10000"}, BadCase{"invalid_size.y4m", "100000x100000"},
                      BadCase{"huge_stsd.mp4", "65535x65535"}, BadCase{"ten_hours.mp4", "36000 s"},
                      BadCase{"unknown_codec.mp4", "zzzz"}, BadCase{"garbage.bin", "not a readable video container"}),
    [](const auto& info) {
      std::string n = info.param.file;
      for (char& c : n) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return n;
    });

// Issue 27, fault 9: the Y4M demuxer's error code for a size it refuses is
// off by its frame magic's length and read "Device or resource busy".
TEST(ProbeVideoTest, AY4mOpenErrorSaysWhatFfmpegRefusedAndNothingStray) {
  auto v = ProbeVideo(Fixture("invalid_size.y4m"));
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().message(),
            "not a readable video container: corrupt, truncated or an unknown format (FFmpeg: Picture size "
            "100000x100000 is invalid)");
  // Without a logged reason, the code's own text (garbage: no demuxer fits).
  auto garbage = ProbeVideo(Fixture("garbage.bin"));
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("Invalid data found when processing input"), std::string::npos)
      << garbage.status().message();
}

TEST(ProbeVideoTest, RefusesLyingHeadersBeforeDecoding) {
  auto huge = ProbeVideo(Fixture("huge.y4m"));
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("max_source_pixels"), std::string::npos) << huge.status().message();
  auto longer = ProbeVideo(Fixture("ten_hours.mp4"));
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.status().message().find("max_duration_s"), std::string::npos) << longer.status().message();
  auto unknown = ProbeVideo(Fixture("unknown_codec.mp4"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unsupported video codec"), std::string::npos);
}

TEST(DecodeVideoTest, EmptyInputIsInvalidArgument) {
  auto v = DecodeVideo({}, {}, {});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("empty"), std::string::npos);
}

TEST(DecodeVideoTest, LimitsAreEnforcedAndNamed) {
  const Bytes mp4 = Fixture("h264.mp4");
  VideoLimits frames;
  frames.max_source_frames = 10;  // the header claims 20
  auto a = DecodeVideo(mp4, {}, {}, frames);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("max_source_frames"), std::string::npos) << a.status().message();

  VideoLimits bytes;
  bytes.max_decoded_bytes = 1'000'000;  // 4 * 280 * 392 * 3 = 1317120
  auto b = DecodeVideo(mp4, {}, {}, bytes);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("max_decoded_bytes"), std::string::npos) << b.status().message();
  bytes.max_decoded_bytes = 1'317'120;  // exactly enough
  EXPECT_TRUE(DecodeVideo(mp4, {}, {}, bytes).ok());

  VideoLimits duration;
  duration.max_duration_s = 1.5;  // the video is 2 s
  auto c = DecodeVideo(mp4, {}, {}, duration);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("max_duration_s"), std::string::npos) << c.status().message();

  VideoLimits pixels;
  pixels.max_source_pixels = 160 * 120 - 1;
  auto d = DecodeVideo(mp4, {}, {}, pixels);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("160x120"), std::string::npos) << d.status().message();
}

// `r` failed with kInvalidArgument, its message holding each of `parts`.
template <typename T>
void ExpectRefused(const StatusOr<T>& r, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  for (const char* p : parts) EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().message();
}

// Issue 27 fault 1: the decode work one video may cost. h264.mp4's header
// says 20 frames of 160x120 (384,000 pixels); sampling reaches its last frame
// (indices 0, 6, 13, 19), so all 20 are decoded.
TEST(DecodeVideoTest, DecodeWorkIsRefusedOnTheHeaderWhenItGivesTheFrameCount) {
  const Bytes mp4 = Fixture("h264.mp4");
  VideoLimits limits;
  limits.max_decode_pixels = std::int64_t{20} * 160 * 120 - 1;
  ExpectRefused(ProbeVideo(mp4, limits), {"max_decode_pixels", "20 frames of 160x120"});  // no frame decoded
  ExpectRefused(DecodeVideo(mp4, {}, {}, limits), {"max_decode_pixels"});
  limits.max_decode_pixels = std::int64_t{20} * 160 * 120;  // exactly enough
  EXPECT_TRUE(DecodeVideo(mp4, {}, {}, limits).ok());
  limits.max_decode_frames = 19;
  ExpectRefused(ProbeVideo(mp4, limits), {"max_decode_frames"});
}

// vp9.webm's header has no frame count: the bound is checked once the demux
// pass has counted its 12 packets (indices 0, 4, 7, 11 of 12 frames: 12
// decoded), still before any frame is decoded.
TEST(DecodeVideoTest, DecodeWorkIsRefusedAfterTheDemuxPassWhenTheHeaderHasNoCount) {
  const Bytes webm = Fixture("vp9.webm");
  VideoLimits limits;
  limits.max_decode_pixels = 12 * 160 * 120 - 1;
  EXPECT_TRUE(ProbeVideo(webm, limits).ok());  // nothing to check it against yet
  ExpectRefused(DecodeVideo(webm, {}, {}, limits), {"max_decode_pixels", "12 frames of 160x120"});
  limits.max_decode_pixels = std::int64_t{12} * 160 * 120;
  EXPECT_TRUE(DecodeVideo(webm, {}, {}, limits).ok());
}

TEST(DecodeVideoTest, DecodeTimeIsBounded) {
  VideoLimits limits;
  limits.max_decode_seconds = 1e-9;  // over before the first frame
  ExpectRefused(DecodeVideo(Fixture("h264.mp4"), {}, {}, limits), {"max_decode_seconds"});
}

TEST(DecodeVideoTest, AStoppedDecodeIsCancelled) {
  std::stop_source stop;
  stop.request_stop();
  auto v = DecodeVideo(Fixture("h264.mp4"), {}, {}, {}, stop.get_token());
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kCancelled) << v.status().ToString();
  // The same call without a stop decodes.
  EXPECT_TRUE(DecodeVideo(Fixture("h264.mp4"), {}, {}, {}, std::stop_source().get_token()).ok());
}

TEST(DecodeVideoTest, EveryPrefixIsDecodedOrRefusedCleanly) {
  // Never a crash or another code, whatever the cut.
  const Bytes mp4 = Fixture("h264.mp4");
  for (std::size_t n = 0; n < mp4.size(); n += 211) {
    auto v = DecodeVideo(std::span<const std::uint8_t>(mp4.data(), n), {}, {});
    if (!v.ok()) {
      EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << n << ": " << v.status().ToString();
    }
  }
}

TEST(DecodeVideoTest, CorruptedPayloadIsDecodedOrRefusedCleanly) {
  // Flip bytes across the file (headers and frames), deterministically.
  const Bytes webm = Fixture("vp9.webm");
  for (std::size_t pos = 0; pos < webm.size(); pos += 173) {
    Bytes bad = webm;
    bad[pos] ^= 0xA5;
    if (pos + 7 < bad.size()) bad[pos + 7] ^= 0x3C;
    auto v = DecodeVideo(bad, {}, {});
    if (!v.ok()) {
      EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << pos << ": " << v.status().ToString();
    }
  }
}

}  // namespace
}  // namespace epd
