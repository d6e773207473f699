// ServerOptions::miss_reply_floor through a real EncodeServer (FakeTower)
// over gRPC and through the front door (the HTTP front's way in): a miss is
// not sent before the floor; a hit, an in-flight join and a failed item are
// not held; a call waiting on the floor still ends at its deadline or at
// shutdown; and a negative floor is refused (docs/SECURITY.md, "The load
// channel, and the miss floor").
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <utility>

#include "epd/server/front_door.h"
#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TestServerOptions WithFloor(milliseconds floor) {
  TestServerOptions o;
  o.server.miss_reply_floor = floor;
  return o;
}

struct Timed {
  RawCall call;
  milliseconds took;
};

Timed TimedCall(TestServer& t, const v1::EncodeRequest& req, milliseconds timeout = milliseconds(20000)) {
  const Clock::time_point start = Clock::now();
  RawCall c = CallEncode(*t.stub, req, timeout);
  return {std::move(c), std::chrono::duration_cast<milliseconds>(Clock::now() - start)};
}

v1::Source Only(const RawCall& c) {
  EXPECT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.items.size(), 1u);
  return c.items.empty() ? v1::SOURCE_UNSPECIFIED : c.items[0].source();
}

TEST(MissReplyFloorTest, AMissWaitsForTheFloorAndAHitOfItDoesNot) {
  const milliseconds floor(1500);
  TestServer t = StartTestServer(WithFloor(floor));
  const std::string x = Png(56, 56, 1);
  const Timed miss = TimedCall(t, MakeRequest("m", {x}));
  EXPECT_EQ(Only(miss.call), v1::SOURCE_MISS);
  EXPECT_GE(miss.took, floor);
  EXPECT_FALSE(miss.call.items[0].main().empty());
  const Timed hit = TimedCall(t, MakeRequest("h", {x}));
  EXPECT_EQ(Only(hit.call), v1::SOURCE_L1);
  EXPECT_LT(hit.took, floor);  // a hit takes milliseconds; the floor is 1.5 s
}

TEST(MissReplyFloorTest, AJoinIsNotHeldWhileTheMissItJoinedIs) {
  const milliseconds floor(3000);
  TestServer t = StartTestServer(WithFloor(floor));
  const std::string x = Png(56, 56, 2);
  t.hold->store(true);
  auto first = std::async(std::launch::async, [&] { return TimedCall(t, MakeRequest("a", {x})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.pending_items == 1; }));
  auto joined = std::async(std::launch::async, [&] { return TimedCall(t, MakeRequest("b", {x})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.joins == 1; }));
  t.hold->store(false);
  const Timed j = joined.get();
  EXPECT_EQ(Only(j.call), v1::SOURCE_JOINED);
  const Timed m = first.get();
  EXPECT_EQ(Only(m.call), v1::SOURCE_MISS);
  EXPECT_GE(m.took, floor);
  EXPECT_LT(j.took, m.took);  // the join went out when the encode finished, not at the floor
  EXPECT_EQ(j.call.items[0].main(), m.call.items[0].main());  // the same rows
}

TEST(MissReplyFloorTest, ACallWithAMissAndAHitEndsAtTheFloorAndAFailedItemIsNotHeld) {
  const milliseconds floor(1500);
  TestServer t = StartTestServer(WithFloor(floor));
  const std::string cached = Png(56, 56, 3);
  ASSERT_EQ(Only(TimedCall(t, MakeRequest("warm", {cached})).call), v1::SOURCE_MISS);
  // A fresh image and the cached one: the hit goes out at once, the miss at the floor.
  const Timed both = TimedCall(t, MakeRequest("mix", {Png(56, 56, 4), cached}));
  ASSERT_TRUE(both.call.status.ok()) << both.call.status.error_message();
  ASSERT_EQ(both.call.items.size(), 2u);
  EXPECT_GE(both.took, floor);
  // Bytes that are no image fail before the tower, and are not held.
  const Timed bad = TimedCall(t, MakeRequest("bad", {std::string("not an image")}));
  EXPECT_EQ(bad.call.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.call.status.error_message();
  EXPECT_LT(bad.took, floor);
}

TEST(MissReplyFloorTest, ACallWaitingOnTheFloorStillEndsAtItsDeadline) {
  TestServer t = StartTestServer(WithFloor(milliseconds(60000)));
  const Timed r = TimedCall(t, MakeRequest("d", {Png(56, 56, 5)}), milliseconds(1000));
  EXPECT_EQ(r.call.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << r.call.status.error_message();
  EXPECT_TRUE(r.call.items.empty());
  EXPECT_EQ(t.tower_state->items_encoded(), 1);  // encoded, then held, then dropped with the call
}

TEST(MissReplyFloorTest, ShutdownEndsACallWaitingOnTheFloor) {
  TestServer t = StartTestServer(WithFloor(milliseconds(60000)));
  auto waiting = std::async(std::launch::async, [&] { return TimedCall(t, MakeRequest("s", {Png(56, 56, 6)})); });
  ASSERT_TRUE(WaitFor([&] { return t.tower_state->items_encoded() == 1; }));
  t.server->Shutdown(milliseconds(200));
  const Timed r = waiting.get();
  EXPECT_FALSE(r.call.status.ok());
  EXPECT_TRUE(r.call.items.empty());
  EXPECT_LT(r.took, milliseconds(60000));
}

TEST(MissReplyFloorTest, TheFrontDoorHoldsAReplyWithAMissAndNotAHit) {
  const milliseconds floor(1500);
  TestServer t = StartTestServer(WithFloor(floor));
  const std::string x = Png(56, 56, 7);
  auto encode = [&](const std::string& id) {
    EncodeRequest req;
    req.id = id;
    EncodeItemInput in;
    in.media = std::string(x);
    req.items.push_back(std::move(in));
    const Clock::time_point start = Clock::now();
    RequestResult r = t.server->front_door().Encode(std::move(req), static_cast<std::int64_t>(x.size()),
                                                    CallerIdentity{"default", false, false, "default", {}});
    EXPECT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.items.size(), 1u);
    return std::make_pair(r.items.empty() ? ItemSource::kL1 : r.items[0].source,
                          std::chrono::duration_cast<milliseconds>(Clock::now() - start));
  };
  const auto [miss_source, miss_took] = encode("front-miss");
  EXPECT_EQ(miss_source, ItemSource::kMiss);
  EXPECT_GE(miss_took, floor);
  const auto [hit_source, hit_took] = encode("front-hit");
  EXPECT_EQ(hit_source, ItemSource::kL1);
  EXPECT_LT(hit_took, floor);
}

TEST(MissReplyFloorTest, ANegativeFloorIsRefused) {
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.miss_reply_floor = milliseconds(-1);
  WorkerOptions w;
  w.model_id = "test-model";
  auto s = EncodeServer::Start(o, w, std::make_unique<FakeTower>(FakeTowerOptions{}));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("miss_reply_floor"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace epd::testing
