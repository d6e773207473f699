// Videos through a real in-process server with the FFmpeg decoder
// (epd::video) and vdec's fixtures (src/video/make_video_fixtures.py): a good
// MP4 comes back with its grid and timing and is a whole-video hit when
// repeated; a frame list works; every kind of bad video is INVALID_ARGUMENT
// naming the problem, and the same server then serves a good request.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "epd/video/video_decoder.h"
#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

std::string Fixture(const std::string& name) {
  std::ifstream f(std::filesystem::path(EPD_VIDEO_FIXTURES) / name, std::ios::binary);
  EXPECT_TRUE(f.good()) << name;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TestServer StartVideoServer() {
  TestServerOptions o;
  o.worker.decode_video = DecodeVideo;
  return StartTestServer(o);
}

v1::EncodeRequest VideoRequest(const std::string& id, const std::string& video) {
  v1::EncodeRequest r;
  r.set_id(id);
  r.add_items()->set_video(video);
  return r;
}

void ExpectStillServing(TestServer& t) {
  const std::string img = Png(56, 56, 99);
  RawCall r = CallEncode(*t.stub, MakeRequest("after-" + std::to_string(t.server->Stats().worker.requests), {img}));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.items.size(), 1u);
  const Embedding want = Expected(img);
  EXPECT_EQ(r.items[0].main(), std::string(reinterpret_cast<const char*>(want.main.data()), want.main.size()));
}

TEST(ServerVideoTest, Mp4ComesBackWithGridAndTimingAndRepeatsAreWholeVideoHits) {
  TestServer t = StartVideoServer();
  const std::string mp4 = Fixture("h264.mp4");
  // 20 frames at 10 fps = 2 s; at 2 fps qwen-vl-utils samples 4 frames
  // (2 s * 2 fps, at least FPS_MIN_FRAMES 4): 2 temporal patches, 1 s each.
  RawCall a = CallEncode(*t.stub, VideoRequest("a", mp4));
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_EQ(a.items.size(), 1u);
  const v1::EncodedItem& m = a.items[0];
  ASSERT_EQ(m.grid_thw_size(), 3);
  EXPECT_EQ(m.grid_thw(0), 2);
  EXPECT_EQ(m.tokens(), m.grid_thw(0) * m.grid_thw(1) * m.grid_thw(2) / 4);
  EXPECT_EQ(m.timestamps_s_size(), 4);
  EXPECT_DOUBLE_EQ(m.sample_fps(), 2.0);
  EXPECT_DOUBLE_EQ(m.seconds_per_grid_t(), 1.0);
  EXPECT_EQ(m.source(), v1::SOURCE_MISS);

  RawCall b = CallEncode(*t.stub, VideoRequest("b", mp4));
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.items[0].source(), v1::SOURCE_L1);
  EXPECT_EQ(b.items[0].main(), m.main());
  EXPECT_EQ(b.items[0].timestamps_s_size(), 4);

  const WorkerStats s = t.server->Stats().worker;
  EXPECT_EQ(s.video_items, 2u);
  EXPECT_EQ(s.video_decodes, 1u);
  EXPECT_EQ(s.chunk_misses, 2u);
  EXPECT_EQ(s.tower_items, 2u);
}

TEST(ServerVideoTest, FrameListIsAVideo) {
  TestServer t = StartVideoServer();
  v1::EncodeRequest r;
  r.set_id("frames");
  v1::EncodeItem* item = r.add_items();
  for (int k = 0; k < 3; ++k) item->mutable_video_frames()->add_frames(Png(56, 56, k + 1));
  // Keep 56x56 frames at 56x56; 3 frames are padded to 4 (2 temporal patches).
  item->mutable_sampling()->set_min_pixels(std::int64_t{28} * 28);
  item->mutable_sampling()->set_max_pixels(std::int64_t{56} * 56);
  RawCall c = CallEncode(*t.stub, r);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  ASSERT_EQ(c.items[0].grid_thw_size(), 3);
  EXPECT_EQ(c.items[0].grid_thw(0), 2);
  EXPECT_EQ(c.items[0].grid_thw(1), 4);
  EXPECT_EQ(c.items[0].timestamps_s_size(), 4);
}

TEST(ServerVideoTest, EachBadVideoIsInvalidArgumentAndTheServerKeepsServing) {
  TestServer t = StartVideoServer();
  for (const char* name : {"truncated.mp4", "truncated_moov.mp4", "audio.wav", "zero_frames.y4m", "huge_stsd.mp4",
                           "ten_hours.mp4", "unknown_codec.mp4", "garbage.bin"}) {
    SCOPED_TRACE(name);
    RawCall r = CallEncode(*t.stub, VideoRequest(std::string("bad-") + name, Fixture(name)));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.status.error_message();
    EXPECT_NE(r.status.error_message().find("item 0"), std::string::npos) << r.status.error_message();
    ExpectStillServing(t);
  }
}

TEST(ServerVideoTest, ItemMixingImageAndVideoIsInvalidArgument) {
  TestServer t = StartVideoServer();
  v1::EncodeRequest r = VideoRequest("mixed", Fixture("h264.mp4"));
  r.mutable_items(0)->set_image(Png(56, 56, 1));
  RawCall c = CallEncode(*t.stub, r);
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(c.status.error_message().find("mixes kinds"), std::string::npos) << c.status.error_message();
  ExpectStillServing(t);
}

// Issue 27, fault 2: 0, 90, 180 and 270 degrees gave byte-identical
// embeddings, served as chunk hits of one another. Each is now its own
// picture: four misses of two chunks each, 90 and 270 portrait.
TEST(ServerVideoTest, RotatedCopiesOfOneVideoAreDistinctVideosAndQuarterTurnsArePortrait) {
  TestServer t = StartVideoServer();
  std::vector<std::string> mains;
  for (const char* name : {"rgb.mp4", "rgb_rot90.mp4", "rgb_rot180.mp4", "rgb_rot270.mp4"}) {
    SCOPED_TRACE(name);
    RawCall c = CallEncode(*t.stub, VideoRequest(name, Fixture(name)));
    ASSERT_TRUE(c.status.ok()) << c.status.error_message();
    ASSERT_EQ(c.items[0].grid_thw_size(), 3);
    const bool portrait =
        std::string(name).find("90") != std::string::npos || std::string(name).find("270") != std::string::npos;
    // 168x112 shown 392 wide and 280 high (20 x 14 patches), or the turn.
    EXPECT_EQ(c.items[0].grid_thw(1), portrait ? 28 : 20);
    EXPECT_EQ(c.items[0].grid_thw(2), portrait ? 20 : 28);
    EXPECT_EQ(c.items[0].source(), v1::SOURCE_MISS);
    mains.push_back(c.items[0].main());
  }
  for (std::size_t i = 0; i < mains.size(); ++i) {
    for (std::size_t j = i + 1; j < mains.size(); ++j) EXPECT_NE(mains[i], mains[j]) << i << " vs " << j;
  }
  const WorkerStats s = t.server->Stats().worker;
  EXPECT_EQ(s.chunk_hits, 0u);
  EXPECT_EQ(s.chunk_misses, 8u);
}

TEST(ServerVideoTest, ARequestWithRotationOffGetsTheStoredFramesServedAsChunkHits) {
  TestServer t = StartVideoServer();
  RawCall stored = CallEncode(*t.stub, VideoRequest("stored", Fixture("rgb.mp4")));
  ASSERT_TRUE(stored.status.ok()) << stored.status.error_message();
  v1::EncodeRequest off = VideoRequest("off", Fixture("rgb_rot90.mp4"));
  off.mutable_items(0)->mutable_sampling()->set_rotation(v1::VIDEO_ROTATION_OFF);
  RawCall c = CallEncode(*t.stub, off);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.items[0].grid_thw(1), 20);  // landscape, as stored
  EXPECT_EQ(c.items[0].main(), stored.items[0].main());
  EXPECT_EQ(t.server->Stats().worker.chunk_hits, 2u);  // the same pixels: both chunks hit
}

TEST(ServerVideoTest, ServerWithoutDecoderRefusesContainersButTakesFrames) {
  TestServer t = StartTestServer();
  RawCall c = CallEncode(*t.stub, VideoRequest("mp4", Fixture("h264.mp4")));
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << c.status.error_message();
  ExpectStillServing(t);
}

}  // namespace
}  // namespace epd::testing
