// Shared-memory delivery and Unix sockets end to end: a real in-process
// EncodeServer over FakeTower, the raw stub and the client library. Expected
// rows come from FakeTower::Reference over an independent decode
// (worker_test_util.h) and from the same server's inline replies.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "epd/client/client.h"
#include "shm_rows.h"
#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

using std::chrono::milliseconds;

std::string AsString(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

v1::EncodeRequest ShmRequest(const std::string& id, const std::vector<std::string>& images) {
  v1::EncodeRequest req = MakeRequest(id, images);
  req.set_delivery(v1::DELIVERY_SHM);
  return req;
}

// The rows an item sent by reference points at, read through a fresh
// read-only mapping of the arena.
std::string RowsOf(const v1::EncodedItem& item) { return ShmRows(item.shm()); }

WorkerOptions TestWorkerOptions() {
  WorkerOptions w;
  w.model_id = "test-model";
  return w;
}

TestServer StartShmServer(std::int64_t arena_bytes, milliseconds lease = milliseconds(60000)) {
  TestServerOptions o;
  o.server.shm_arena_bytes = arena_bytes;
  o.server.shm_lease = lease;
  return StartTestServer(o);
}

TEST(ShmDeliveryTest, ShmRowsEqualTheInlineBytes) {
  TestServer t = StartShmServer(8 << 20);
  const std::string img = Png(84, 56, 3);
  const Embedding want = Expected(img);
  RawCall inline_call = CallEncode(*t.stub, MakeRequest("in", {img}));
  RawCall shm_call = CallEncode(*t.stub, ShmRequest("shm", {img}));
  ASSERT_TRUE(inline_call.status.ok() && shm_call.status.ok()) << shm_call.status.error_message();
  ASSERT_EQ(shm_call.items.size(), 1u);
  const v1::EncodedItem& item = shm_call.items[0];
  ASSERT_TRUE(item.has_shm());
  EXPECT_TRUE(item.main().empty());
  EXPECT_TRUE(item.deepstack().empty());
  EXPECT_EQ(item.source(), v1::SOURCE_L1);
  EXPECT_EQ(item.tokens(), want.tokens);
  EXPECT_EQ(item.hidden(), want.hidden);
  EXPECT_EQ(item.deepstack_layers(), want.deepstack_layers);
  EXPECT_EQ(item.grid_thw_size(), 3);
  EXPECT_EQ(item.shm().pid(), getpid());
  EXPECT_EQ(item.shm().offset() % 64, 0u);
  EXPECT_EQ(item.shm().lease_ms(), 60000);
  const std::string rows = RowsOf(item);
  EXPECT_EQ(rows, AsString(want.main) + AsString(want.deepstack));
  EXPECT_EQ(rows, inline_call.items[0].main() + inline_call.items[0].deepstack());
  const ServerStats s = t.server->Stats();
  EXPECT_EQ(s.shm.items, 1u);
  EXPECT_EQ(s.shm.leases, 1);
  EXPECT_EQ(s.shm.leased_bytes, static_cast<std::int64_t>((rows.size() + 63) / 64 * 64));
}

TEST(ShmDeliveryTest, RepeatHitsShareTheSpanWrittenOnce) {
  TestServer t = StartShmServer(8 << 20);
  const std::string img = Png(56, 56, 6);
  RawCall first = CallEncode(*t.stub, ShmRequest("a", {img}));
  RawCall second = CallEncode(*t.stub, ShmRequest("b", {img}));
  ASSERT_TRUE(first.status.ok() && second.status.ok());
  EXPECT_EQ(second.items[0].shm().offset(), first.items[0].shm().offset());
  EXPECT_NE(second.items[0].shm().generation(), first.items[0].shm().generation());
  EXPECT_EQ(RowsOf(second.items[0]), AsString(Expected(img).main) + AsString(Expected(img).deepstack));
  const ServerStats s = t.server->Stats();
  EXPECT_EQ(s.shm.items, 2u);
  EXPECT_EQ(s.shm.reused, 1u);
  EXPECT_EQ(s.shm.leases, 2);
}

TEST(ShmDeliveryTest, ReleaseEndsTheLeaseAndRefusesWrongGenerationsAndRepeats) {
  TestServer t = StartShmServer(8 << 20);
  RawCall call = CallEncode(*t.stub, ShmRequest("r", {Png(56, 56, 1)}));
  ASSERT_TRUE(call.status.ok());
  const v1::ShmRef ref = call.items[0].shm();
  auto release = [&](std::uint64_t generation, v1::ReleaseResponse* resp) {
    v1::ReleaseRequest req;
    v1::ShmLease* l = req.add_leases();
    l->set_offset(ref.offset());
    l->set_generation(generation);
    grpc::ClientContext ctx;
    return t.stub->Release(&ctx, req, resp);
  };
  v1::ReleaseResponse resp;
  grpc::Status wrong = release(ref.generation() + 7, &resp);
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(wrong.error_message().find("generation"), std::string::npos) << wrong.error_message();
  EXPECT_EQ(t.server->Stats().shm.leases, 1);
  grpc::Status ok = release(ref.generation(), &resp);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(resp.released(), 1u);
  EXPECT_EQ(release(ref.generation(), &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  const ServerStats s = t.server->Stats();
  EXPECT_EQ(s.shm.leases, 0);
  EXPECT_EQ(s.shm.leased_bytes, 0);
  EXPECT_EQ(s.shm.released, 1u);
  EXPECT_EQ(s.shm.refused_releases, 2u);
}

TEST(ShmDeliveryTest, FullArenaFallsBackToInlineBytesAndCountsIt) {
  const std::string a = Png(56, 56, 1), b = Png(56, 56, 2);
  const Embedding want_b = Expected(b);
  // Room for exactly one item's rows.
  TestServer t = StartShmServer(static_cast<std::int64_t>(Expected(a).nbytes()));
  RawCall first = CallEncode(*t.stub, ShmRequest("1", {a}));
  RawCall second = CallEncode(*t.stub, ShmRequest("2", {b}));
  ASSERT_TRUE(first.status.ok() && second.status.ok());
  EXPECT_TRUE(first.items[0].has_shm());
  EXPECT_FALSE(second.items[0].has_shm());
  EXPECT_EQ(second.items[0].main(), AsString(want_b.main));
  EXPECT_EQ(second.items[0].deepstack(), AsString(want_b.deepstack));
  const ServerStats s = t.server->Stats();
  EXPECT_EQ(s.shm.items, 1u);
  EXPECT_EQ(s.shm.fallbacks, 1u);
}

// The counters reach Prometheus too: scrape the metrics endpoint after one
// reference and one fallback.
TEST(ShmDeliveryTest, MetricsCountReferencesAndFallbacks) {
  const std::string a = Png(56, 56, 1), b = Png(56, 56, 2);
  TestServerOptions o;
  o.server.shm_arena_bytes = static_cast<std::int64_t>(Expected(a).nbytes());
  o.server.metrics_port = 0;
  o.server.metrics_address = "127.0.0.1";
  TestServer t = StartTestServer(o);
  ASSERT_TRUE(CallEncode(*t.stub, ShmRequest("1", {a})).status.ok());
  ASSERT_TRUE(CallEncode(*t.stub, ShmRequest("2", {b})).status.ok());
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(t.server->metrics_port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string get = "GET /metrics HTTP/1.0\r\n\r\n";
  ASSERT_EQ(write(fd, get.data(), get.size()), static_cast<ssize_t>(get.size()));
  std::string page;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) page.append(buf, static_cast<std::size_t>(n));
  close(fd);
  EXPECT_NE(page.find("epd_shm_items_total 1\n"), std::string::npos) << page;
  EXPECT_NE(page.find("epd_shm_fallbacks_total 1\n"), std::string::npos) << page;
  EXPECT_NE(page.find("epd_shm_leases 1\n"), std::string::npos) << page;
}

TEST(ShmDeliveryTest, WithoutAnArenaShmRequestsGetInlineBytes) {
  TestServer t = StartTestServer();
  const std::string img = Png(56, 56, 4);
  RawCall call = CallEncode(*t.stub, ShmRequest("r", {img}));
  ASSERT_TRUE(call.status.ok());
  EXPECT_FALSE(call.items[0].has_shm());
  EXPECT_EQ(call.items[0].main(), AsString(Expected(img).main));
  v1::ReleaseRequest req;
  req.add_leases()->set_generation(1);
  grpc::ClientContext ctx;
  v1::ReleaseResponse resp;
  EXPECT_EQ(t.stub->Release(&ctx, req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(ShmDeliveryTest, UnreleasedLeaseExpiresAndItsMemoryIsReclaimed) {
  TestServer t = StartShmServer(8 << 20, milliseconds(50));
  ASSERT_TRUE(CallEncode(*t.stub, ShmRequest("r", {Png(56, 56, 1)})).status.ok());
  ASSERT_TRUE(WaitFor([&] {
    const ShmStats s = t.server->Stats().shm;
    return s.leases == 0 && s.leased_bytes == 0 && s.expired == 1;
  }));
}

TEST(ShmDeliveryTest, ClientReadsRowsInPlaceAndReleasesOnDestruction) {
  TestServer t = StartShmServer(8 << 20);
  const std::vector<std::string> images = {Png(56, 56, 1), Png(84, 56, 2)};
  ClientOptions co{.target = t.target};
  co.delivery = Delivery::kShm;
  auto client = EncodeClient::Connect(co);
  ASSERT_TRUE(client.ok());
  {
    EncodeResult r =
        (*client)->Encode({ClientItem{images[0], std::nullopt, 0}, ClientItem{images[1], std::nullopt, 0}});
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    for (std::size_t i = 0; i < images.size(); ++i) {
      const ClientItemResult& item = r.items[i];
      ASSERT_NE(item.shm, nullptr);
      EXPECT_EQ(item.embedding, nullptr);
      const Embedding want = Expected(images[i]);
      EXPECT_EQ(item.shm->shape(), want.shape());
      EXPECT_EQ(item.shm->grid(), want.grid);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(item.shm->main()), item.shm->main_bytes()),
                AsString(want.main));
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(item.shm->deepstack()), item.shm->deepstack_bytes()),
                AsString(want.deepstack));
      ExpectSameEmbedding(*item.shm->Copy(), want);
    }
    EXPECT_EQ(t.server->Stats().shm.leases, 2);
  }  // both leases queued for release here
  ASSERT_TRUE((*client)->FlushReleases().ok());
  ServerStats s = t.server->Stats();
  EXPECT_EQ(s.shm.leases, 0);
  EXPECT_EQ(s.shm.released, 2u);

  // Explicit release; a second one is refused by the server.
  EncodeResult r = (*client)->Encode({ClientItem{images[0], std::nullopt, 0}});
  ASSERT_NE(r.items[0].shm, nullptr);
  EXPECT_TRUE(r.items[0].shm->Release().ok());
  EXPECT_EQ(r.items[0].shm->Release().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.server->Stats().shm.leases, 0);
}

TEST(ShmDeliveryTest, QueuedReleasesRideOnTheNextEncode) {
  TestServer t = StartShmServer(8 << 20);
  ClientOptions co{.target = t.target};
  co.delivery = Delivery::kShm;
  auto client = EncodeClient::Connect(co);
  ASSERT_TRUE(client.ok());
  const std::string img = Png(56, 56, 9);
  (void)(*client)->Encode({ClientItem{img, std::nullopt, 0}});  // result dropped: release queued
  EXPECT_EQ(t.server->Stats().shm.leases, 1);
  EncodeResult r = (*client)->Encode({ClientItem{img, std::nullopt, 0}});
  ASSERT_TRUE(r.status.ok());
  const ServerStats s = t.server->Stats();
  EXPECT_EQ(s.shm.released, 1u);
  EXPECT_EQ(s.shm.leases, 1);  // only the second call's
}

TEST(UnixSocketTest, ServesOnAUnixSocketAlongsideTcp) {
  const std::string path = ::testing::TempDir() + "/epd-uds-" + std::to_string(getpid()) + ".sock";
  std::filesystem::remove(path);
  TestServerOptions o;
  o.server.extra_addresses = {"unix:" + path};
  TestServer t = StartTestServer(o);
  ASSERT_TRUE(std::filesystem::is_socket(path));
  const std::string img = Png(56, 56, 5);
  auto client = EncodeClient::Connect({.target = "unix:" + path});
  ASSERT_TRUE(client.ok());
  EncodeResult r = (*client)->Encode({ClientItem{img, std::nullopt, 0}});
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ExpectSameEmbedding(*r.items[0].embedding, Expected(img));
  EXPECT_TRUE(CallEncode(*t.stub, MakeRequest("tcp", {img})).status.ok());  // TCP still served
  t.server->Shutdown(milliseconds(0));
  std::filesystem::remove(path);
}

TEST(UnixSocketTest, UnixSocketAsTheOnlyAddress) {
  const std::string path = ::testing::TempDir() + "/epd-uds-only-" + std::to_string(getpid()) + ".sock";
  std::filesystem::remove(path);
  ServerOptions so;
  so.address = "unix:" + path;
  auto server = EncodeServer::Start(so, TestWorkerOptions(), std::make_unique<FakeTower>());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ((*server)->port(), 0);
  auto client = EncodeClient::Connect({.target = "unix://" + path});
  ASSERT_TRUE(client.ok());
  StatusOr<ServerInfo> info = (*client)->Health();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_NE(info->server_id.find(path), std::string::npos) << info->server_id;
  (*server)->Shutdown(milliseconds(0));
  std::filesystem::remove(path);
}

TEST(UnixSocketTest, RejectsAnEmptyUnixPath) {
  ServerOptions so;
  so.address = "unix:";
  auto server = EncodeServer::Start(so, TestWorkerOptions(), std::make_unique<FakeTower>());
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace epd::testing
