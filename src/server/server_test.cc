// EncodeServer and EncodeClient against a real in-process server over
// FakeTower: streaming, caching, routing, deadlines, shutdown and metrics.
// Expected embeddings come from FakeTower::Reference over an independent
// decode of the same bytes; expected keys from ComputeContentKey.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <future>
#include <optional>
#include <set>
#include <thread>

#include "client_convert.h"
#include "epd/client/client.h"
#include "epd/media/content_key.h"
#include "proto_convert.h"
#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

using std::chrono::milliseconds;

ContentKey KeyOf(const std::string& image) {
  return ComputeContentKey("test-model", PreprocessConfig{}, ToBytes(image));
}

ClientItem Img(std::string image, std::optional<std::string> caller_key = std::nullopt, std::int64_t tokens = 0) {
  ClientItem c;
  c.image = std::move(image);
  c.caller_key = std::move(caller_key);
  c.expected_tokens = tokens;
  return c;
}

std::string KeyBytes(const std::string& image) {
  const ContentKey k = KeyOf(image);
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}

void ExpectItemIs(const v1::EncodedItem& got, const std::string& image) {
  const Embedding want = Expected(image);
  EXPECT_EQ(got.error_code(), 0) << got.error_message();
  EXPECT_EQ(got.key(), KeyBytes(image));
  EXPECT_EQ(got.tokens(), want.tokens);
  EXPECT_EQ(got.hidden(), want.hidden);
  EXPECT_EQ(got.deepstack_layers(), want.deepstack_layers);
  EXPECT_EQ(got.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(std::vector<std::int64_t>(got.grid_thw().begin(), got.grid_thw().end()),
            (std::vector<std::int64_t>{want.grid.t, want.grid.h, want.grid.w}));
  EXPECT_EQ(got.main(), std::string(reinterpret_cast<const char*>(want.main.data()), want.main.size()));
  EXPECT_EQ(got.deepstack(), std::string(reinterpret_cast<const char*>(want.deepstack.data()), want.deepstack.size()));
}

TEST(EncodeServerTest, StreamsEveryItemWithTheTowersEmbedding) {
  TestServer t = StartTestServer();
  const std::vector<std::string> images = {Png(56, 56, 1), Png(84, 56, 2), Png(56, 112, 3)};
  RawCall call = CallEncode(*t.stub, MakeRequest("r1", images));
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  ASSERT_EQ(call.items.size(), 3u);
  std::set<std::int64_t> seen;
  for (const v1::EncodedItem& item : call.items) {
    ASSERT_GE(item.index(), 0);
    ASSERT_LT(item.index(), 3);
    EXPECT_TRUE(seen.insert(item.index()).second) << "index " << item.index() << " sent twice";
    ExpectItemIs(item, images[item.index()]);
    EXPECT_EQ(item.source(), v1::SOURCE_MISS);
    EXPECT_EQ(item.server_id(), t.server->server_id());
  }
}

TEST(EncodeServerTest, RepeatedImageIsServedFromL1WithoutTheTower) {
  TestServer t = StartTestServer();
  const std::string img = Png(56, 56, 7);
  ASSERT_TRUE(CallEncode(*t.stub, MakeRequest("a", {img})).status.ok());
  RawCall second = CallEncode(*t.stub, MakeRequest("b", {img}));
  ASSERT_TRUE(second.status.ok());
  ASSERT_EQ(second.items.size(), 1u);
  EXPECT_EQ(second.items[0].source(), v1::SOURCE_L1);
  EXPECT_EQ(second.items[0].tower_ms(), 0.0);
  ExpectItemIs(second.items[0], img);
  EXPECT_EQ(t.tower_state->items_encoded(), 1);
}

TEST(EncodeServerTest, DuplicateImagesInOneRequestRunTheTowerOnce) {
  TestServer t = StartTestServer();
  const std::string img = Png(56, 56, 8);
  RawCall call = CallEncode(*t.stub, MakeRequest("dup-in-request", {img, img}));
  ASSERT_TRUE(call.status.ok());
  ASSERT_EQ(call.items.size(), 2u);
  std::multiset<int> sources;
  for (const auto& item : call.items) {
    ExpectItemIs(item, img);
    sources.insert(item.source());
  }
  EXPECT_EQ(sources, (std::multiset<int>{v1::SOURCE_MISS, v1::SOURCE_JOINED}));
  EXPECT_EQ(t.tower_state->items_encoded(), 1);
}

std::vector<std::int64_t> GridOf(const v1::EncodedItem& m) { return {m.grid_thw().begin(), m.grid_thw().end()}; }

TEST(EncodeServerTest, EveryItemCarriesItsGridOnTheWireForMissesAndHits) {
  TestServer t = StartTestServer();
  // By hand: 84 wide x 56 high -> (1, 56/14, 84/14) = (1, 4, 6), 6 tokens;
  // 56 wide x 112 high -> (1, 8, 4), 8 tokens. Both are multiples of 28, so
  // smart_resize keeps them.
  const std::string wide = Png(84, 56, 30), tall = Png(56, 112, 31);
  RawCall first = CallEncode(*t.stub, MakeRequest("g1", {wide, tall}));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  RawCall again = CallEncode(*t.stub, MakeRequest("g2", {tall, wide}));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  ASSERT_EQ(first.items.size(), 2u);
  ASSERT_EQ(again.items.size(), 2u);
  const std::vector<std::int64_t> wide_grid = {1, 4, 6}, tall_grid = {1, 8, 4};
  for (const v1::EncodedItem& m : first.items) {
    EXPECT_EQ(m.source(), v1::SOURCE_MISS);
    EXPECT_EQ(GridOf(m), m.index() == 0 ? wide_grid : tall_grid);
  }
  for (const v1::EncodedItem& m : again.items) {
    EXPECT_EQ(m.source(), v1::SOURCE_L1);
    EXPECT_EQ(GridOf(m), m.index() == 0 ? tall_grid : wide_grid);
  }
  // The C++ client reads it into the embedding.
  auto client = EncodeClient::Connect({.target = t.target});
  ASSERT_TRUE(client.ok());
  EncodeResult r = (*client)->Encode({Img(tall), Img(wide)});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.items[0].embedding->grid, (GridTHW{1, 8, 4}));
  EXPECT_EQ(r.items[1].embedding->grid, (GridTHW{1, 4, 6}));
}

TEST(ProtoConvertTest, ClientKeepsAGridWithTGreaterThanOneAndRejectsAMalformedOne) {
  // A 2-temporal-patch clip: (2, 2, 2) is 8 patches, 2 tokens after the 2x2 merge.
  auto e = std::make_shared<Embedding>();
  e->tokens = 2;
  e->hidden = 1;
  e->dtype = DType::kFloat32;
  e->grid = {2, 2, 2};
  e->main.resize(8);
  ItemResult item;
  item.embedding = e;
  v1::EncodedItem m;
  internal::ToProto(item, "s", &m);
  EXPECT_EQ(GridOf(m), (std::vector<std::int64_t>{2, 2, 2}));
  ClientItemResult back = internal::FromProto(m);
  ASSERT_TRUE(back.status.ok()) << back.status.ToString();
  EXPECT_EQ(back.embedding->grid, (GridTHW{2, 2, 2}));

  v1::EncodedItem old_server = m;  // an older server sends no grid: unknown, not an error
  old_server.clear_grid_thw();
  back = internal::FromProto(old_server);
  ASSERT_TRUE(back.status.ok()) << back.status.ToString();
  EXPECT_FALSE(back.embedding->grid.known());

  for (const std::vector<std::int64_t>& bad : {std::vector<std::int64_t>{2, 2}, {2, 0, 2}, {1, 2, 2, 1}}) {
    v1::EncodedItem m2 = m;
    m2.clear_grid_thw();
    for (std::int64_t v : bad) m2.add_grid_thw(v);
    ClientItemResult r2 = internal::FromProto(m2);
    EXPECT_EQ(r2.status.code(), StatusCode::kInternal);
    EXPECT_NE(r2.status.message().find("grid_thw"), std::string::npos) << r2.status.message();
  }
}

TEST(EncodeServerTest, EmptyRequestIdIsReplacedByTheServer) {
  TestServer t = StartTestServer();
  RawCall call = CallEncode(*t.stub, MakeRequest("", {Png(56, 56, 9)}));
  EXPECT_TRUE(call.status.ok()) << call.status.error_message();
  EXPECT_EQ(call.items.size(), 1u);
}

TEST(EncodeServerTest, HealthReportsWhatKeyDerivationNeeds) {
  TestServerOptions o;
  o.server.server_id = "enc-7";
  TestServer t = StartTestServer(o);
  auto client = EncodeClient::Connect({.target = t.target});
  ASSERT_TRUE(client.ok());
  StatusOr<ServerInfo> info = (*client)->Health();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_TRUE(info->serving);
  EXPECT_EQ(info->server_id, "enc-7");
  EXPECT_EQ(info->model_id, "test-model");
  const PreprocessConfig d;
  EXPECT_EQ(info->preprocess.patch_size, 14);
  EXPECT_EQ(info->preprocess.max_pixels, 1003520);
  EXPECT_EQ(info->preprocess.mean, d.mean);
  EXPECT_EQ(info->preprocess.std, d.std);
  EXPECT_EQ(info->key_mode, KeyMode::kSha256);
  EXPECT_EQ(info->hidden, 8);
  EXPECT_EQ(info->deepstack_layers, 2);
  EXPECT_EQ(info->dtype, DType::kFloat32);
  EXPECT_EQ(info->version, EPD_PROJECT_VERSION);  // CMake's project(VERSION), passed by src/server/CMakeLists.txt
}

TEST(EncodeClientTest, ReassemblesPerKeyCallsByIndex) {
  TestServer t = StartTestServer();
  auto client = EncodeClient::Connect({.target = t.target});
  ASSERT_TRUE(client.ok());
  const std::string a = Png(56, 56, 11), b = Png(84, 56, 12);
  EncodeResult r = (*client)->Encode({Img(a), Img(b), Img(a)});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_EQ(r.items.size(), 3u);
  const std::string imgs[] = {a, b, a};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.items[i].index, i);
    ASSERT_NE(r.items[i].embedding, nullptr);
    ExpectSameEmbedding(*r.items[i].embedding, Expected(imgs[i]));
    EXPECT_EQ(r.items[i].key, KeyOf(imgs[i]));
    EXPECT_EQ(r.items[i].server_id, t.server->server_id());
  }
  // One call per distinct key: a's call (2 items) and b's.
  StatusOr<ServerStats> stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->worker.requests, 2u);
  EXPECT_EQ(stats->worker.items, 3u);
  EXPECT_EQ(t.tower_state->items_encoded(), 2);
}

TEST(EncodeClientTest, AFailedItemIsNamedByItsPlaceInTheRequest) {
  TestServer t = StartTestServer();
  auto client = EncodeClient::Connect({.target = t.target});
  ASSERT_TRUE(client.ok());
  const std::string a = Png(56, 56, 21);
  // The bad image travels alone in its own per-key call, where it is item 0.
  EncodeResult r = (*client)->Encode({Img(a), Img(a), Img("not an image at all")});
  ASSERT_EQ(r.items.size(), 3u);
  EXPECT_TRUE(r.items[0].status.ok());
  EXPECT_TRUE(r.items[1].status.ok());
  EXPECT_EQ(r.items[2].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.items[2].status.message().rfind("item 2: ", 0), 0u) << r.items[2].status.message();
}

TEST(EncodeClientTest, KeyForMatchesTheServersKey) {
  TestServer t = StartTestServer();
  auto client = EncodeClient::Connect({.target = t.target});
  const std::string a = Png(56, 56, 13);
  StatusOr<ContentKey> k = (*client)->KeyFor(Img(a));
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(*k, KeyOf(a));
  StatusOr<ContentKey> ck = (*client)->KeyFor(Img("", std::string("gateway-hash-1")));
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ(*ck, *CallerContentKey("test-model", PreprocessConfig{}, "gateway-hash-1"));
}

TEST(EncodeClientTest, WithoutRoutingSendsOneCall) {
  TestServer t = StartTestServer();
  auto client = EncodeClient::Connect({.target = t.target, .route_by_key = false});
  EncodeResult r = (*client)->Encode({Img(Png(56, 56, 14)), Img(Png(56, 56, 15))});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(t.server->Stats().worker.requests, 1u);
}

TEST(EncodeClientTest, CallerKeyHitNeedsNoImageBytes) {
  TestServer t = StartTestServer();
  auto client = EncodeClient::Connect({.target = t.target});
  const std::string img = Png(56, 56, 16);
  ASSERT_TRUE((*client)->Encode({Img(img, std::string("gw-16"))}).status.ok());
  EncodeResult r = (*client)->Encode({Img("", std::string("gw-16"), 4)});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.items[0].source, ItemSource::kL1);
  ExpectSameEmbedding(*r.items[0].embedding, Expected(img));
}

TEST(EncodeClientTest, EmptyRequestIsInvalidArgumentWithoutACall) {
  TestServer t = StartTestServer();
  auto client = EncodeClient::Connect({.target = t.target});
  EncodeResult r = (*client)->Encode({});
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.items.empty());
  EXPECT_EQ(t.server->Stats().worker.requests + t.server->Stats().rpc_errors.size(), 0u);
}

TEST(EncodeClientTest, UnreachableServerFailsEveryItemWithUnavailable) {
  auto client = EncodeClient::Connect({.target = "127.0.0.1:1", .timeout = milliseconds(2000)});
  ASSERT_TRUE(client.ok());
  EncodeResult r = (*client)->Encode({Img(Png(56, 56, 17)), Img(Png(56, 56, 18))});
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  for (const auto& item : r.items) EXPECT_EQ(item.status.code(), StatusCode::kUnavailable);
}

TEST(EncodeServerTest, DeadlineDropsQueuedItemsNoOneElseWaitsFor) {
  TestServer t = StartTestServer();
  t.hold->store(true);
  RawCall call = CallEncode(*t.stub, MakeRequest("late", {Png(56, 56, 20)}), milliseconds(300));
  EXPECT_EQ(call.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The server cancels the request in the worker before its handler returns.
  ASSERT_TRUE(WaitFor([&] {
    const ServerStats s = t.server->Stats();
    return s.worker.cancelled_requests == 1 && s.worker.pending_items == 0;
  }));
  t.hold->store(false);
  RawCall next = CallEncode(*t.stub, MakeRequest("next", {Png(56, 56, 21)}));
  ASSERT_TRUE(next.status.ok());
  EXPECT_EQ(t.tower_state->items_encoded(), 1);  // only "next"'s image ran
}

TEST(EncodeServerTest, ExpiredRequestKeepsAComputationAnotherRequestWaitsOn) {
  TestServer t = StartTestServer();
  t.hold->store(true);
  const std::string img = Png(56, 56, 22);
  auto patient = std::async(std::launch::async, [&] { return CallEncode(*t.stub, MakeRequest("patient", {img})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.pending_items == 1; }));
  RawCall hasty = CallEncode(*t.stub, MakeRequest("hasty", {img}), milliseconds(300));
  EXPECT_EQ(hasty.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.cancelled_requests == 1; }));
  EXPECT_EQ(t.server->Stats().worker.pending_items, 1);
  t.hold->store(false);
  RawCall p = patient.get();
  ASSERT_TRUE(p.status.ok()) << p.status.error_message();
  ASSERT_EQ(p.items.size(), 1u);
  ExpectItemIs(p.items[0], img);
  EXPECT_EQ(t.tower_state->items_encoded(), 1);
}

TEST(EncodeServerTest, ShutdownFinishesCallsInFlightWithinTheGrace) {
  TestServer t = StartTestServer();
  t.hold->store(true);
  const std::string img = Png(56, 56, 23);
  auto in_flight = std::async(std::launch::async, [&] { return CallEncode(*t.stub, MakeRequest("f", {img})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.pending_items == 1; }));
  auto stopping = std::async(std::launch::async, [&] { t.server->Shutdown(std::chrono::seconds(30)); });
  // New calls are refused once shutdown has begun.
  ASSERT_TRUE(WaitFor([&] {
    return CallEncode(*t.stub, MakeRequest("new", {img}), milliseconds(1000)).status.error_code() ==
           grpc::StatusCode::UNAVAILABLE;
  }));
  t.hold->store(false);
  RawCall r = in_flight.get();
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.items.size(), 1u);
  ExpectItemIs(r.items[0], img);
  stopping.get();
}

TEST(EncodeServerTest, ShutdownCancelsCallsStillRunningAfterTheGrace) {
  TestServer t = StartTestServer();
  t.hold->store(true);
  auto in_flight =
      std::async(std::launch::async, [&] { return CallEncode(*t.stub, MakeRequest("stuck", {Png(56, 56, 24)})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.pending_items == 1; }));
  t.server->Shutdown(milliseconds(200));
  RawCall r = in_flight.get();
  EXPECT_FALSE(r.status.ok());
  EXPECT_TRUE(r.items.empty());
}

// A stub for a client that does not read: its own connection, with BDP
// probing off and a fixed 64 KiB stream window, so what it does not read
// stays in the server's buffer. On the connection the test's other calls use,
// the result did not stay there: under ThreadSanitizer the buffer drained
// from 9 MiB to 0 within seconds with no Read (2 of 4 runs with a 4 s pause
// after the hit; none of 18 on a connection of its own). Most likely the other
// calls' traffic (the hit's 3 MiB) let gRPC's flow control raise the window
// of every stream on the connection, so the server's Writes completed.
// The global bound, when one tenant may pass it alone (a share above the
// bound; by default a tenant's share is a quarter of it and this cannot
// happen, see the next test).
TEST(EncodeServerTest, ClientThatDoesNotReadHoldsTowerBatchesWhenItsShareIsPastTheBoundButNotHits) {
  TestServerOptions o;
  o.tower.hidden = 1 << 16;  // 4 tokens x 65536 x 3 halves x 4 B = 3 MiB per 56x56 item
  o.server.max_buffered_bytes = 1 << 20;
  o.server.max_buffered_bytes_per_tenant = 2 << 20;
  TestServer t = StartTestServer(o);
  const std::string cached = Png(56, 56, 30);
  ASSERT_TRUE(CallEncode(*t.stub, MakeRequest("warm", {cached})).status.ok());

  // A slow client: starts a call for three misses and reads nothing, so its
  // handler blocks in Write and the other two results stay buffered.
  const auto slow_stub = NonReadingClientStub(t.target);
  grpc::ClientContext slow_ctx;
  auto slow = slow_stub->Encode(&slow_ctx, MakeRequest("slow", {Png(56, 56, 31), Png(56, 56, 32), Png(56, 56, 33)}));
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().buffered_bytes > (1 << 20); }));

  // Another miss now waits: the worker starts no tower batch while the
  // buffered bytes are over the limit...
  auto other =
      std::async(std::launch::async, [&] { return CallEncode(*t.stub, MakeRequest("other", {Png(56, 56, 34)})); });
  ASSERT_TRUE(WaitFor([&] {
    const ServerStats s = t.server->Stats();
    return s.worker.pending_items == 1 && s.worker.sink_full_stalls > 0;
  }));
  // ...but cache hits are still served.
  RawCall hit = CallEncode(*t.stub, MakeRequest("hit", {cached}));
  ASSERT_TRUE(hit.status.ok());
  EXPECT_EQ(hit.items[0].source(), v1::SOURCE_L1);
  const ServerStats held = t.server->Stats();
  EXPECT_EQ(held.worker.pending_items, 1);
  EXPECT_GT(held.buffered_bytes, 1 << 20);  // still held: nothing read
  EXPECT_EQ(held.worker.tower_items, 4u);   // the warm-up and the slow call's three

  // Reading drains the buffer; the held miss then runs.
  v1::EncodedItem item;
  int read = 0;
  while (slow->Read(&item)) ++read;
  EXPECT_TRUE(slow->Finish().ok());
  EXPECT_EQ(read, 3);
  RawCall o2 = other.get();
  EXPECT_TRUE(o2.status.ok()) << o2.status.error_message();
  // The last reply's bytes are given back when its call is done, which may
  // follow the client's Finish by a moment.
  EXPECT_TRUE(WaitFor([&] { return t.server->Stats().buffered_bytes == 0; }));
}

// Issue 27, fault 4: with the default share (a quarter of the bound), one
// tenant that stops reading is throttled (its results wait on its call) and
// the tower goes on for everyone else: sink_full never holds.
TEST(EncodeServerTest, ClientThatDoesNotReadPastItsTenantsShareHoldsNoTowerBatch) {
  TestServerOptions o;
  o.tower.hidden = 1 << 16;  // 3 MiB per 56x56 item, as above
  o.server.max_buffered_bytes = 1 << 20;
  TestServer t = StartTestServer(o);

  const auto slow_stub = NonReadingClientStub(t.target);
  grpc::ClientContext slow_ctx;
  slow_ctx.AddMetadata("x-epd-tenant", "slow");
  auto slow = slow_stub->Encode(&slow_ctx, MakeRequest("slow", {Png(56, 56, 41), Png(56, 56, 42), Png(56, 56, 43)}));
  // All three results wait on the slow call: 9 MiB, nine times the bound.
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().buffered_bytes == std::int64_t{3} * (3 << 20); }));
  EXPECT_EQ(t.server->Stats().throttled_calls, 1u);

  // Another tenant's miss runs on the tower meanwhile.
  const std::string img = Png(56, 56, 44);
  RawCall other = CallEncode(*t.stub, MakeRequest("other", {img}));
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  ASSERT_EQ(other.items.size(), 1u);
  EXPECT_EQ(other.items[0].source(), v1::SOURCE_MISS);
  const Embedding want = Expected(img, o.tower);
  EXPECT_TRUE(other.items[0].main() == std::string(reinterpret_cast<const char*>(want.main.data()), want.main.size()))
      << "wrong rows";
  const ServerStats s = t.server->Stats();
  EXPECT_EQ(s.worker.sink_full_stalls, 0u);
  // The other call too: its one 3 MiB result is past its tenant's share of
  // 256 KiB, so it did not count towards the bound either.
  EXPECT_EQ(s.throttled_calls, 2u);

  // The slow client still gets all of its results when it reads.
  v1::EncodedItem item;
  int read = 0;
  while (slow->Read(&item)) ++read;
  EXPECT_TRUE(slow->Finish().ok());
  EXPECT_EQ(read, 3);
  EXPECT_TRUE(WaitFor([&] { return t.server->Stats().buffered_bytes == 0; }));
}

// A bare HTTP/1.0 GET, so the test does not trust the exposer's own client.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<std::size_t>(n));
  close(fd);
  return out;
}

TEST(EncodeServerTest, MetricsEndpointServesCountersAndHistograms) {
  TestServerOptions o;
  o.server.metrics_port = 0;
  o.server.metrics_address = "127.0.0.1";
  TestServer t = StartTestServer(o);
  ASSERT_GT(t.server->metrics_port(), 0);
  const std::string img = Png(56, 56, 25);  // 2x2 merge blocks: 4 tokens
  ASSERT_TRUE(CallEncode(*t.stub, MakeRequest("m1", {img})).status.ok());
  ASSERT_TRUE(CallEncode(*t.stub, MakeRequest("m2", {img})).status.ok());
  EXPECT_EQ(CallEncode(*t.stub, MakeRequest("m3", {})).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // The worker publishes stats after the loop iteration that delivered m2.
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.hits_l1 == 1; }));
  const std::string page = HttpGet(t.server->metrics_port(), "/metrics");
  EXPECT_NE(page.find("epd_cache_hits_total{tier=\"l1\"} 1\n"), std::string::npos) << page;
  EXPECT_NE(page.find("epd_cache_hits_total{tier=\"l2\"} 0\n"), std::string::npos);
  EXPECT_NE(page.find("epd_cache_misses_total 1\n"), std::string::npos);
  EXPECT_NE(page.find("epd_rpc_errors_total{code=\"INVALID_ARGUMENT\"} 1\n"), std::string::npos);
  EXPECT_NE(page.find("epd_batch_tokens_count 1\n"), std::string::npos);
  EXPECT_NE(page.find("epd_batch_tokens_sum 4\n"), std::string::npos);
  EXPECT_NE(page.find("epd_tower_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(page.find("epd_request_seconds_count 3\n"), std::string::npos);
  const Embedding e = Expected(img);
  EXPECT_NE(page.find("epd_cache_bytes{tier=\"l1\"} " + std::to_string(e.nbytes()) + "\n"), std::string::npos);
  EXPECT_NE(page.find("epd_queue_items 0\n"), std::string::npos);
}

}  // namespace
}  // namespace epd::testing
