// ProbeItems (epd/worker/item_probe.h) against a full decode: over every
// image format, every EXIF orientation, frame-list videos and the decode
// fuzzer's seed corpus (fuzz/corpus, the media tests' files), each probed
// grid must equal the grid DecodeAndPreprocess (or SampleFrameList) produces,
// and each key the one ComputeContentKey gives, namespaced as an encode's.
#include "epd/worker/item_probe.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "epd/media/content_key.h"
#include "epd/media/tenant_key.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

WorkerOptions Options() {
  WorkerOptions o;
  o.model_id = "probe-test-model";
  return o;
}

EncodeItemInput Image(const std::string& bytes) {
  EncodeItemInput in;
  in.media = bytes;
  return in;
}

EncodeItemInput CallerKey(const std::string& key) {
  EncodeItemInput in;
  in.caller_key = key;
  return in;
}

EncodeRequest OneImage(const std::string& bytes) {
  EncodeRequest r{"r", {}};
  r.items.push_back(Image(bytes));
  return r;
}

// A JPEG with an APP1 EXIF block carrying `orientation`.
std::string JpegWithOrientation(int width, int height, int orientation) {
  Bytes jpeg = EncodeJpegRgb(PatternImage(width, height), 90, /*subsamp=*/2);  // TJSAMP_420
  const Bytes exif = ExifWithOrientation(orientation);
  Bytes app1 = {0xff, 0xe1, 0, static_cast<std::uint8_t>(exif.size() + 2)};
  app1.insert(app1.end(), exif.begin(), exif.end());
  jpeg.insert(jpeg.begin() + 2, app1.begin(), app1.end());
  return ToString(jpeg);
}

std::string PngWithOrientation(int width, int height, int orientation) {
  Bytes png = EncodePngRgb(PatternImage(width, height));
  const Bytes exif = ExifWithOrientation(orientation);
  InsertPngChunk(png, "eXIf", Bytes(exif.begin() + 6, exif.end()));
  return ToString(png);
}

// Every format the decoder reads, at sizes whose grids differ when turned.
std::vector<std::pair<std::string, std::string>> Corpus() {
  std::vector<std::pair<std::string, std::string>> c;
  const RgbImage img = PatternImage(301, 187);
  c.emplace_back("jpeg 4:4:4", ToString(EncodeJpegRgb(img, 85)));
  c.emplace_back("jpeg 4:2:0", ToString(EncodeJpegRgb(img, 85, 2)));
  c.emplace_back("png", ToString(EncodePngRgb(img)));
  c.emplace_back("webp", ToString(EncodeWebpLosslessRgb(img)));
  c.emplace_back("bmp", ToString(EncodeBmp24(img)));
  // A GIF whose frame overhangs its logical screen (the screen grows).
  Bytes indices(static_cast<std::size_t>(90 * 70), 1);
  Bytes palette = {0, 0, 0, 255, 255, 255};
  c.emplace_back("gif", ToString(EncodeGif(80, 60, 20, 10, 90, 70, indices, palette)));
  c.emplace_back("large png", Png(1900, 1000, 3));  // over max_pixels: smart_resize scales down
  c.emplace_back("tiny png", Png(20, 30, 4));       // under min_pixels: scaled up
  for (int o = 1; o <= 8; ++o) {
    c.emplace_back("jpeg exif " + std::to_string(o), JpegWithOrientation(280, 140, o));
    c.emplace_back("png exif " + std::to_string(o), PngWithOrientation(197, 83, o));
  }
  return c;
}

void ExpectProbeEqualsDecode(const std::string& name, const std::string& bytes, const WorkerOptions& o) {
  const std::vector<StatusOr<ItemProbe>> p = ProbeItems(o, OneImage(bytes));
  ASSERT_EQ(p.size(), 1u);
  const StatusOr<PreprocessedImage> full = DecodeAndPreprocess(ToBytes(bytes), o.preprocess, o.limits);
  // A file whose pixels do not decode may still have a sound header; one
  // that decodes must probe, to the same grid.
  if (!full.ok()) return;
  ASSERT_TRUE(p[0].ok()) << name << ": " << p[0].status().ToString();
  EXPECT_EQ(p[0]->grid, full->grid) << name << ": probed " << p[0]->grid.ToString() << ", decoded "
                                    << full->grid.ToString();
  EXPECT_EQ(p[0]->tokens, full->tokens()) << name;
  const ContentKey key = ComputeContentKey(o.model_id, o.preprocess, ToBytes(bytes));
  EXPECT_EQ(p[0]->key, key) << name;
  EXPECT_EQ(p[0]->route_key, key) << name;
}

TEST(ItemProbeTest, EveryFormatAndOrientationProbesToTheDecodedGrid) {
  for (const bool apply : {true, false}) {
    WorkerOptions o = Options();
    o.preprocess.decode.apply_exif_orientation = apply;
    for (const auto& [name, bytes] : Corpus()) ExpectProbeEqualsDecode(name, bytes, o);
  }
}

TEST(ItemProbeTest, TurnedPhoneJpegProbesUpright) {
  // Stored 280x140 with Orientation 6 is shown 140 wide, 280 tall: grid
  // (1, 280 / 14, 140 / 14) = (1, 20, 10), 50 tokens after the 2x2 merge.
  const std::vector<StatusOr<ItemProbe>> p = ProbeItems(Options(), OneImage(JpegWithOrientation(280, 140, 6)));
  ASSERT_TRUE(p[0].ok()) << p[0].status().ToString();
  EXPECT_EQ(p[0]->grid, (GridTHW{1, 20, 10}));
  EXPECT_EQ(p[0]->tokens, 50);
}

TEST(ItemProbeTest, DecoderSeedCorpusProbesToTheDecodedGrid) {
  int compared = 0;
  for (const auto& entry : std::filesystem::directory_iterator(EPD_DECODE_CORPUS)) {
    std::ifstream f(entry.path(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string bytes = ss.str();
    if (DecodeAndPreprocess(ToBytes(bytes), PreprocessConfig{}).ok()) ++compared;
    ExpectProbeEqualsDecode(entry.path().filename().string(), bytes, Options());
  }
  EXPECT_GE(compared, 10) << "the seed corpus should hold at least ten decodable images";
}

TEST(ItemProbeTest, FrameListProbesToTheSampledGrid) {
  const WorkerOptions o = Options();
  // Five frames, padded to six (temporal patch 2); the first frame decides
  // the size and is turned by its EXIF orientation.
  std::vector<MediaBytes> frames = {PngWithOrientation(197, 83, 6)};
  for (int i = 0; i < 4; ++i) frames.emplace_back(Png(197, 83, i));
  EncodeRequest r{"r", {}};
  r.items.emplace_back().video = VideoInput{{}, frames, std::nullopt};
  const std::vector<StatusOr<ItemProbe>> p = ProbeItems(o, r);
  ASSERT_TRUE(p[0].ok()) << p[0].status().ToString();
  std::vector<std::span<const std::uint8_t>> spans;
  spans.reserve(frames.size());
  for (const MediaBytes& f : frames) spans.push_back(f.span());
  const StatusOr<SampledVideo> full = SampleFrameList(spans, o.video_sampling, o.preprocess, o.limits);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_EQ(p[0]->grid, full->grid);
  EXPECT_EQ(p[0]->grid.t, 3);
  EXPECT_EQ(p[0]->tokens, full->grid.tokens(2));
}

TEST(ItemProbeTest, TenantNamespaceSaltsTheKeyAndLeavesTheRouteKey) {
  const std::string png = Png(56, 84, 1);
  EncodeRequest r = OneImage(png);
  const auto secret = std::make_shared<const std::string>("0123456789abcdef-probe");
  r.key_namespace = KeyNamespace{secret, "tenant:a", false};
  const std::vector<StatusOr<ItemProbe>> p = ProbeItems(Options(), r);
  ASSERT_TRUE(p[0].ok()) << p[0].status().ToString();
  const ContentKey plain = ComputeContentKey("probe-test-model", PreprocessConfig{}, ToBytes(png));
  const ContentKey salted =
      NamespacedContentKey({reinterpret_cast<const std::uint8_t*>(secret->data()), secret->size()}, "tenant:a", plain);
  EXPECT_EQ(p[0]->key, salted);
  EXPECT_NE(p[0]->key, plain);
  EXPECT_EQ(p[0]->route_key, plain);
  EXPECT_EQ(p[0]->grid, (GridTHW{1, 6, 4}));  // 84 x 56 pixels: 6 x 4 patches
}

TEST(ItemProbeTest, CallerKeyAloneHasAKeyAndNoGrid) {
  EncodeRequest r{"r", {}};
  r.items.push_back(CallerKey("gateway-hash-1"));
  const std::vector<StatusOr<ItemProbe>> p = ProbeItems(Options(), r);
  ASSERT_TRUE(p[0].ok()) << p[0].status().ToString();
  EXPECT_EQ(p[0]->key, *CallerContentKey("probe-test-model", PreprocessConfig{}, "gateway-hash-1"));
  EXPECT_EQ(p[0]->grid, GridTHW{});
  EXPECT_EQ(p[0]->tokens, 0);
}

TEST(ItemProbeTest, BadItemsFailAloneWithTheEncodesMessages) {
  EncodeRequest r{"r", {}};
  r.items.push_back(Image("not an image at all"));
  r.items.push_back(CallerKey(""));
  r.items.push_back(Image(Png(56, 56, 2)));
  const std::string mp4_head(
      "\x00\x00\x00\x18"
      "ftypmp42",
      12);
  r.items.emplace_back().video = VideoInput{mp4_head, {}, std::nullopt};
  const std::vector<StatusOr<ItemProbe>> p = ProbeItems(Options(), r);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p[0].status().message().find("unsupported image format"), std::string::npos) << p[0].status().message();
  EXPECT_EQ(p[1].status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(p[2].ok());
  // No decode_video / probe_video in these options: the encode's refusal.
  EXPECT_EQ(p[3].status().code(), StatusCode::kFailedPrecondition) << p[3].status().ToString();
}

TEST(ItemProbeTest, TooManyPixelsIsRefusedAsTheDecodeRefusesIt) {
  WorkerOptions o = Options();
  o.limits.max_pixels = std::int64_t{100} * 100;
  const std::vector<StatusOr<ItemProbe>> p = ProbeItems(o, OneImage(Png(101, 100, 1)));
  ASSERT_FALSE(p[0].ok());
  EXPECT_NE(p[0].status().message().find("too many pixels"), std::string::npos) << p[0].status().message();
}

}  // namespace
}  // namespace epd::testing
