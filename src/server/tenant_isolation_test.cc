// Tenant isolation through a real EncodeServer (FakeTower) over gRPC: one
// image from two tenants is two entries and two tower runs, tenants never
// join each other's in-flight encode, a caller key resolves in its caller's
// namespace only, public items are shared, a token cannot claim another
// tenant by header, and Stats is scoped to the caller (docs/SECURITY.md).
#include <gtest/gtest.h>

#include <future>
#include <random>
#include <string>
#include <vector>

#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

TestServerOptions TenantOptions(TenantIsolation isolation = TenantIsolation::kAuto) {
  TestServerOptions o;
  o.server.tenant_tokens = {{"tok-a", "alice", false}, {"tok-b", "bob", false}, {"tok-op", "ops", true}};
  o.server.tenant_secret = "tenant-isolation-test-secret";
  o.server.tenant_isolation = isolation;
  o.server.public_readers = {"alice", "bob"};
  return o;
}

RawCall As(TestServer& t, const std::string& token, const v1::EncodeRequest& req, const std::string& header = "") {
  RawCall out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  if (!header.empty()) ctx.AddMetadata("x-epd-tenant", header);
  auto reader = t.stub->Encode(&ctx, req);
  v1::EncodedItem item;
  while (reader->Read(&item)) out.items.push_back(item);
  out.status = reader->Finish();
  return out;
}

v1::Source SourceOf(const RawCall& c) {
  EXPECT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.items.size(), 1u);
  return c.items.empty() ? v1::SOURCE_UNSPECIFIED : c.items[0].source();
}

v1::StatsResponse StatsAs(TestServer& t, const std::string& token, grpc::Status* status = nullptr) {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + token);
  v1::StatsResponse out;
  grpc::Status s = t.stub->Stats(&ctx, v1::StatsRequest(), &out);
  if (status != nullptr) *status = s;
  EXPECT_TRUE(status != nullptr || s.ok()) << s.error_message();
  return out;
}

TEST(TenantIsolationTest, AnotherTenantsImageIsAMissAndRunsTheTower) {
  TestServer t = StartTestServer(TenantOptions());
  const std::string x = Png(56, 56, 1);
  EXPECT_EQ(SourceOf(As(t, "tok-a", MakeRequest("a1", {x}))), v1::SOURCE_MISS);
  EXPECT_EQ(SourceOf(As(t, "tok-b", MakeRequest("b1", {x}))), v1::SOURCE_MISS);
  EXPECT_EQ(t.tower_state->items_encoded(), 2);
  // Each tenant hits its own entry.
  EXPECT_EQ(SourceOf(As(t, "tok-a", MakeRequest("a2", {x}))), v1::SOURCE_L1);
  EXPECT_EQ(SourceOf(As(t, "tok-b", MakeRequest("b2", {x}))), v1::SOURCE_L1);
  EXPECT_EQ(t.tower_state->items_encoded(), 2);
  EXPECT_EQ(t.server->Stats().worker.l1_entries, 2);
}

TEST(TenantIsolationTest, IsolationNoneSharesOneEntryAsBefore) {
  TestServer t = StartTestServer(TenantOptions(TenantIsolation::kNone));
  const std::string x = Png(56, 56, 2);
  EXPECT_EQ(SourceOf(As(t, "tok-a", MakeRequest("a1", {x}))), v1::SOURCE_MISS);
  EXPECT_EQ(SourceOf(As(t, "tok-b", MakeRequest("b1", {x}))), v1::SOURCE_L1);
  EXPECT_EQ(t.tower_state->items_encoded(), 1);
}

TEST(TenantIsolationTest, AnotherTenantNeverJoinsAnInFlightEncode) {
  TestServer t = StartTestServer(TenantOptions());
  const std::string x = Png(56, 56, 3);
  t.hold->store(true);
  auto a = std::async(std::launch::async, [&] { return As(t, "tok-a", MakeRequest("a", {x})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.pending_items == 1; }));
  auto b = std::async(std::launch::async, [&] { return As(t, "tok-b", MakeRequest("b", {x})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.pending_items == 2; }));  // a job of its own
  // Within one tenant the same image does join (the control).
  auto a2 = std::async(std::launch::async, [&] { return As(t, "tok-a", MakeRequest("a2", {x})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.joins == 1; }));
  t.hold->store(false);
  EXPECT_EQ(SourceOf(a.get()), v1::SOURCE_MISS);
  EXPECT_EQ(SourceOf(b.get()), v1::SOURCE_MISS);
  EXPECT_EQ(SourceOf(a2.get()), v1::SOURCE_JOINED);
  EXPECT_EQ(t.tower_state->items_encoded(), 2);
}

TEST(TenantIsolationTest, ACallerKeyResolvesInTheCallersNamespaceOnly) {
  TestServer t = StartTestServer(TenantOptions());
  v1::EncodeRequest put = MakeRequest("put", {Png(56, 56, 4)});
  put.mutable_items(0)->set_caller_key("gateway-hash-1");
  ASSERT_EQ(SourceOf(As(t, "tok-a", put)), v1::SOURCE_MISS);
  v1::EncodeRequest fetch;
  fetch.set_id("fetch");
  fetch.add_items()->set_caller_key("gateway-hash-1");
  // Bob has no entry under that key: a miss without bytes fails, no rows.
  const RawCall bob = As(t, "tok-b", fetch);
  EXPECT_EQ(bob.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bob.status.error_message();
  for (const v1::EncodedItem& it : bob.items) EXPECT_TRUE(it.main().empty());
  // Alice's own fetch by key is a hit.
  fetch.set_id("fetch-a");
  EXPECT_EQ(SourceOf(As(t, "tok-a", fetch)), v1::SOURCE_L1);
}

TEST(TenantIsolationTest, APublicItemIsSharedAndOthersStayPrivate) {
  TestServer t = StartTestServer(TenantOptions());
  const std::string catalog = Png(56, 56, 5);
  v1::EncodeRequest pub = MakeRequest("pa", {catalog});
  pub.mutable_items(0)->set_public_(true);
  EXPECT_EQ(SourceOf(As(t, "tok-a", pub)), v1::SOURCE_MISS);
  pub.set_id("pb");
  EXPECT_EQ(SourceOf(As(t, "tok-b", pub)), v1::SOURCE_L1);  // shared
  // Unmarked, the same image is bob's own: a miss.
  EXPECT_EQ(SourceOf(As(t, "tok-b", MakeRequest("pb2", {catalog}))), v1::SOURCE_MISS);
  // "ops" is not a public reader: its public mark is ignored.
  pub.set_id("po");
  EXPECT_EQ(SourceOf(As(t, "tok-op", pub)), v1::SOURCE_MISS);
  EXPECT_EQ(t.tower_state->items_encoded(), 3);
}

TEST(TenantIsolationTest, ATokenCannotClaimAnotherTenantByHeaderAndUnknownTokensAreRefused) {
  TestServer t = StartTestServer(TenantOptions());
  const std::string x = Png(56, 56, 6);
  ASSERT_EQ(SourceOf(As(t, "tok-b", MakeRequest("b", {x}))), v1::SOURCE_MISS);
  // Alice claiming bob by header is still alice: bob's entry is no hit.
  EXPECT_EQ(SourceOf(As(t, "tok-a", MakeRequest("a", {x}), "bob")), v1::SOURCE_MISS);
  const v1::StatsResponse bob = StatsAs(t, "tok-b");
  EXPECT_EQ(bob.tenant_stats().requests(), 1u);
  EXPECT_EQ(StatsAs(t, "tok-a").tenant_stats().requests(), 1u);
  const RawCall stranger = As(t, "tok-zzz", MakeRequest("z", {x}));
  EXPECT_EQ(stranger.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const RawCall none = As(t, "", MakeRequest("n", {x}), "alice");
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(t.tower_state->items_encoded(), 2);
}

TEST(TenantIsolationTest, StatsAreTheCallersTenantsAndGlobalOnlyForAnOperator) {
  TestServer t = StartTestServer(TenantOptions());
  ASSERT_EQ(SourceOf(As(t, "tok-a", MakeRequest("a1", {Png(56, 56, 7)}))), v1::SOURCE_MISS);
  ASSERT_EQ(SourceOf(As(t, "tok-a", MakeRequest("a2", {Png(56, 56, 7)}))), v1::SOURCE_L1);
  ASSERT_EQ(SourceOf(As(t, "tok-b", MakeRequest("b1", {Png(56, 56, 8)}))), v1::SOURCE_MISS);
  const v1::StatsResponse bob = StatsAs(t, "tok-b");
  EXPECT_EQ(bob.scope(), "tenant");
  EXPECT_EQ(bob.tenant(), "bob");
  EXPECT_EQ(bob.tenant_stats().requests(), 1u);
  EXPECT_EQ(bob.tenant_stats().misses(), 1u);
  EXPECT_EQ(bob.tenant_stats().hits_l1(), 0u);
  // None of the server's global counters reach a tenant.
  EXPECT_EQ(bob.requests(), 0u);
  EXPECT_EQ(bob.tower_items(), 0u);
  EXPECT_EQ(bob.hits_l1(), 0u);
  EXPECT_EQ(bob.l1_entries(), 0);
  const v1::StatsResponse alice = StatsAs(t, "tok-a");
  EXPECT_EQ(alice.tenant_stats().hits_l1(), 1u);
  EXPECT_EQ(alice.tenant_stats().misses(), 1u);
  const v1::StatsResponse op = StatsAs(t, "tok-op");
  EXPECT_EQ(op.scope(), "global");
  EXPECT_EQ(op.requests(), 3u);
  EXPECT_EQ(op.tower_items(), 2u);
  EXPECT_EQ(op.hits_l1(), 1u);
}

v1::EncodeRequest FramesRequest(const std::string& id, int frames) {
  v1::EncodeRequest r;
  r.set_id(id);
  v1::EncodeItem* item = r.add_items();
  for (int k = 0; k < frames; ++k) item->mutable_video_frames()->add_frames(Png(56, 56, 40 + k));
  item->mutable_sampling()->set_min_pixels(std::int64_t{28} * 28);
  item->mutable_sampling()->set_max_pixels(std::int64_t{56} * 56);
  return r;
}

TEST(TenantIsolationTest, AVideosTemporalChunksStayInTheirTenantsNamespace) {
  TestServer t = StartTestServer(TenantOptions());
  // Alice's 4 frames are 2 temporal chunks; bob's first 2 frames are the
  // same pixels as her first chunk, in a video of their own.
  ASSERT_TRUE(As(t, "tok-a", FramesRequest("a4", 4)).status.ok());
  ASSERT_EQ(t.server->Stats().worker.chunk_misses, 2u);
  ASSERT_TRUE(As(t, "tok-b", FramesRequest("b2", 2)).status.ok());
  EXPECT_EQ(t.server->Stats().worker.chunk_hits, 0u);
  EXPECT_EQ(t.server->Stats().worker.chunk_misses, 3u);
  // Alice's own 2-frame video hits her chunk (the control).
  ASSERT_TRUE(As(t, "tok-a", FramesRequest("a2", 2)).status.ok());
  EXPECT_EQ(t.server->Stats().worker.chunk_hits, 1u);
}

// The probe: a victim sends some of 40 fresh images; an attacker then
// sends all 40. With isolation the attacker's `source` is "miss" every time;
// without it, `source` tells exactly which the victim sent (the control).
int CorrectGuesses(TestServer& t, std::uint32_t seed, int base) {
  std::mt19937 rng(seed);
  int correct = 0;
  for (int i = 0; i < 40; ++i) {
    const std::string x = Png(56, 56, base + i);
    const bool sent = (rng() & 1) != 0;
    if (sent) SourceOf(As(t, "tok-a", MakeRequest("v" + std::to_string(i), {x})));
    const v1::Source seen = SourceOf(As(t, "tok-b", MakeRequest("p" + std::to_string(i), {x})));
    const bool guess = seen != v1::SOURCE_MISS;
    correct += guess == sent ? 1 : 0;
  }
  return correct;
}

TEST(TenantIsolationTest, TheSourceFieldNeverRevealsAnotherTenantsImage) {
  TestServer salted = StartTestServer(TenantOptions());
  std::mt19937 rng(11);
  int sent = 0;
  for (int i = 0; i < 40; ++i) sent += (rng() & 1) != 0 ? 1 : 0;
  // Guessing "miss" always is right exactly when the victim did not send.
  EXPECT_EQ(CorrectGuesses(salted, 11, 100), 40 - sent);
  TestServer open = StartTestServer(TenantOptions(TenantIsolation::kNone));
  EXPECT_EQ(CorrectGuesses(open, 11, 100), 40);
}

}  // namespace
}  // namespace epd::testing
