// The Probe RPC through a real in-process server (FakeTower): every probed
// grid and key equals what an Encode of the same request returns (images of
// every format and EXIF orientation; with epd::video, every video fixture
// src/video/make_video_fixtures.py makes), the tower never runs for a probe,
// and a probe passes the Encode call's checks with the Encode call's messages:
// token, tenant salting, request shape, request size. The C++ client's
// Probe is checked against its own KeyFor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "epd/client/client.h"
#include "epd/media/content_key.h"
#include "test_server.h"
#include "worker_test_util.h"
#ifdef EPD_VIDEO_FIXTURES
#include "epd/video/video_decoder.h"
#endif

namespace epd::testing {
namespace {

TestServer StartProbeServer(TestServerOptions o = {}) {
#ifdef EPD_VIDEO_FIXTURES
  o.worker.decode_video = DecodeVideo;
  o.worker.probe_video = [](std::span<const std::uint8_t> bytes, const VideoSampling& s, const PreprocessConfig& cfg,
                            const VideoLimits& limits) -> StatusOr<GridTHW> {
    StatusOr<VideoInfo> info = ProbeVideo(bytes, limits);
    if (!info.ok()) return info.status();
    return VideoHeaderGrid(*info, s, cfg);
  };
#endif
  return StartTestServer(o);
}

struct ProbeCall {
  grpc::Status status;
  v1::ProbeResponse reply;
};

ProbeCall Probe(TestServer& t, const v1::EncodeRequest& req, const std::string& token = "") {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  ProbeCall out;
  out.status = t.stub->Probe(&ctx, req, &out.reply);
  return out;
}

RawCall EncodeAs(TestServer& t, const v1::EncodeRequest& req, const std::string& token = "") {
  RawCall out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  auto reader = t.stub->Encode(&ctx, req);
  v1::EncodedItem item;
  while (reader->Read(&item)) out.items.push_back(item);
  out.status = reader->Finish();
  return out;
}

std::string ImageWithExif(const std::string& kind, int orientation) {
  const Bytes exif = ExifWithOrientation(orientation);
  if (kind == "png") {
    Bytes png = EncodePngRgb(PatternImage(197, 83));
    InsertPngChunk(png, "eXIf", Bytes(exif.begin() + 6, exif.end()));
    return ToString(png);
  }
  Bytes jpeg = EncodeJpegRgb(PatternImage(280, 140), 90);
  Bytes app1 = {0xff, 0xe1, 0, static_cast<std::uint8_t>(exif.size() + 2)};
  app1.insert(app1.end(), exif.begin(), exif.end());
  jpeg.insert(jpeg.begin() + 2, app1.begin(), app1.end());
  return ToString(jpeg);
}

std::vector<std::string> Images() {
  const RgbImage img = PatternImage(301, 187);
  Bytes indices(static_cast<std::size_t>(90 * 70), 1);
  std::vector<std::string> out = {ToString(EncodeJpegRgb(img, 85, 2)), ToString(EncodePngRgb(img)),
                                  ToString(EncodeWebpLosslessRgb(img)), ToString(EncodeBmp24(img)),
                                  ToString(EncodeGif(80, 60, 20, 10, 90, 70, indices, {0, 0, 0, 255, 255, 255}))};
  for (int o : {3, 6, 8}) {
    out.push_back(ImageWithExif("jpeg", o));
    out.push_back(ImageWithExif("png", o));
  }
  return out;
}

std::vector<std::int64_t> Grid(const v1::ProbedItem& m) { return {m.grid_thw().begin(), m.grid_thw().end()}; }
std::vector<std::int64_t> Grid(const v1::EncodedItem& m) { return {m.grid_thw().begin(), m.grid_thw().end()}; }

// Probe and Encode of `req` agree item by item; returns how many compared.
int ExpectProbeMatchesEncode(TestServer& t, const v1::EncodeRequest& req, const std::string& what) {
  const ProbeCall p = Probe(t, req);
  EXPECT_TRUE(p.status.ok()) << what << ": " << p.status.error_message();
  EXPECT_EQ(p.reply.items_size(), req.items_size()) << what;
  const RawCall e = EncodeAs(t, req);
  int compared = 0;
  for (const v1::EncodedItem& m : e.items) {
    if (m.error_code() != 0) continue;
    const v1::ProbedItem& q = p.reply.items(static_cast<int>(m.index()));
    EXPECT_EQ(q.error_code(), 0) << what << " item " << m.index() << ": " << q.error_message();
    EXPECT_EQ(Grid(q), Grid(m)) << what << " item " << m.index();
    EXPECT_EQ(q.tokens(), m.tokens()) << what << " item " << m.index();
    EXPECT_EQ(q.key(), m.key()) << what << " item " << m.index();
    ++compared;
  }
  return compared;
}

TEST(ProbeTest, EveryImageFormatAndOrientationProbesToTheEncodesGridAndKey) {
  TestServer t = StartProbeServer();
  const std::vector<std::string> images = Images();
  const v1::EncodeRequest req = MakeRequest("images", images);
  const ProbeCall p = Probe(t, req);
  ASSERT_TRUE(p.status.ok()) << p.status.error_message();
  EXPECT_EQ(t.tower_state->items_encoded(), 0) << "a probe must not run the tower";
  for (int i = 0; i < p.reply.items_size(); ++i) {
    const ContentKey key = ComputeContentKey("test-model", PreprocessConfig{}, ToBytes(images[i]));
    EXPECT_EQ(p.reply.items(i).route_key(), std::string(key.bytes.begin(), key.bytes.end())) << "item " << i;
  }
  EXPECT_EQ(ExpectProbeMatchesEncode(t, req, "images"), static_cast<int>(images.size()));
  // Item 7, the phone JPEG (280x140, orientation 6), is shown 140 wide, 280 tall.
  EXPECT_EQ(Grid(p.reply.items(7)), (std::vector<std::int64_t>{1, 20, 10}));
}

#ifdef EPD_VIDEO_FIXTURES
std::string Fixture(const std::string& name) {
  std::ifstream f(std::filesystem::path(EPD_VIDEO_FIXTURES) / name, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ProbeTest, EveryVideoFixtureProbesToTheDecodedGrid) {
  TestServer t = StartProbeServer();
  int compared = 0;
  for (const auto& entry : std::filesystem::directory_iterator(EPD_VIDEO_FIXTURES)) {
    const std::string name = entry.path().filename().string();
    // A display-orientation SEI lives in the bitstream, which the header
    // probe does not read (documented in epd/worker/item_probe.h).
    if (entry.path().extension() == ".png" || name == "rgb_sei90.mkv") continue;
    v1::EncodeRequest req;
    req.add_items()->set_video(Fixture(name));
    compared += ExpectProbeMatchesEncode(t, req, name);
  }
  EXPECT_GE(compared, 10) << "the fixtures hold at least ten decodable videos";
}
#endif

TEST(ProbeTest, RefusedWithoutTokenAsEncodeIs) {
  TestServerOptions o;
  o.server.tenant_tokens = {{"tok-a", "alice", false}};
  TestServer t = StartProbeServer(o);
  const v1::EncodeRequest req = MakeRequest("r", {Png(56, 56, 1)});
  const ProbeCall p = Probe(t, req);
  const RawCall e = EncodeAs(t, req);
  EXPECT_EQ(p.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(p.status.error_message(), e.status.error_message());
  EXPECT_TRUE(Probe(t, req, "tok-a").status.ok());
}

TEST(ProbeTest, TenantSaltingChangesTheKeyExactlyAsAnEncodesKey) {
  TestServerOptions o;
  o.server.tenant_tokens = {{"tok-a", "alice", false}, {"tok-b", "bob", false}};
  o.server.tenant_secret = "probe-test-tenant-secret";
  TestServer t = StartProbeServer(o);
  const std::string x = Png(84, 56, 2);
  const v1::EncodeRequest req = MakeRequest("r", {x});
  const ProbeCall a = Probe(t, req, "tok-a");
  const ProbeCall b = Probe(t, req, "tok-b");
  ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status.error_message() << b.status.error_message();
  const RawCall ea = EncodeAs(t, req, "tok-a");
  const RawCall eb = EncodeAs(t, req, "tok-b");
  ASSERT_EQ(ea.items.size(), 1u);
  ASSERT_EQ(eb.items.size(), 1u);
  EXPECT_EQ(a.reply.items(0).key(), ea.items[0].key());
  EXPECT_EQ(b.reply.items(0).key(), eb.items[0].key());
  EXPECT_NE(a.reply.items(0).key(), b.reply.items(0).key());
  // The route key stays the unsalted key, the same for both tenants.
  const ContentKey plain = ComputeContentKey("test-model", PreprocessConfig{}, ToBytes(x));
  EXPECT_EQ(a.reply.items(0).route_key(), std::string(plain.bytes.begin(), plain.bytes.end()));
  EXPECT_EQ(b.reply.items(0).route_key(), a.reply.items(0).route_key());
  EXPECT_NE(a.reply.items(0).key(), a.reply.items(0).route_key());
}

TEST(ProbeTest, BadRequestsAndItemsGetTheEncodesMessages) {
  TestServerOptions o;
  o.server.max_request_bytes = 4096;
  o.server.max_inflight_request_bytes = 1 << 20;
  TestServer t = StartProbeServer(o);
  for (const v1::EncodeRequest& req :
       {MakeRequest("empty", {}), MakeRequest("big", {std::string(5000, 'x')}), v1::EncodeRequest()}) {
    v1::EncodeRequest r = req;
    if (r.items_size() == 0 && r.id().empty()) r.add_items();  // an item with nothing in it
    const ProbeCall p = Probe(t, r);
    const RawCall e = EncodeAs(t, r);
    EXPECT_FALSE(p.status.ok()) << r.id();
    EXPECT_EQ(p.status.error_code(), e.status.error_code()) << r.id();
    EXPECT_EQ(p.status.error_message(), e.status.error_message()) << r.id();
  }
  const v1::EncodeRequest mixed = MakeRequest("mixed", {Png(56, 56, 3), "not an image"});
  const ProbeCall p = Probe(t, mixed);
  const RawCall e = EncodeAs(t, mixed);
  ASSERT_TRUE(p.status.ok()) << p.status.error_message();
  ASSERT_EQ(p.reply.items_size(), 2);
  EXPECT_EQ(p.reply.items(0).error_code(), 0);
  EXPECT_EQ(p.reply.items(0).tokens(), 4);  // 56x56: a 4x4 patch grid, 2x2 after the merge
  EXPECT_EQ(p.reply.items(1).error_code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  for (const v1::EncodedItem& m : e.items) {
    if (m.index() == 1) {
      EXPECT_EQ(p.reply.items(1).error_message(), m.error_message());
    }
  }
}

TEST(ProbeTest, ClientProbeGivesTheClientsRouteKeyAndNamesBadItems) {
  TestServer t = StartProbeServer();
  StatusOr<std::unique_ptr<EncodeClient>> client = EncodeClient::Connect({.target = t.target});
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const std::vector<ClientItem> items = {{Png(112, 56, 1)}, {"garbage"}, {.caller_key = std::string("k1")}};
  const ProbeResult r = (*client)->Probe(items);
  ASSERT_EQ(r.items.size(), 3u);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status.message().rfind("item 1: ", 0), 0u) << r.status.message();
  EXPECT_TRUE(r.items[0].status.ok()) << r.items[0].status.ToString();
  EXPECT_EQ(r.items[0].grid, (GridTHW{1, 4, 8}));
  EXPECT_EQ(r.items[0].tokens, 8);
  EXPECT_EQ(r.items[0].route_key, *(*client)->KeyFor(items[0]));
  EXPECT_TRUE(r.items[2].status.ok());
  EXPECT_EQ(r.items[2].route_key, *(*client)->KeyFor(items[2]));
  EXPECT_EQ(r.items[2].grid, GridTHW{});
  EXPECT_EQ((*client)->Probe({}).status.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace epd::testing
