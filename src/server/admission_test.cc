// The in-flight request budget and the tenant of a call (admission.h), alone
// and through a real in-process server (issue 15, items 6 and 7).
#include "admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

using internal::PeerWithoutPort;
using internal::RequestBudget;
using std::chrono::milliseconds;

RequestBudget::Clock::time_point In(milliseconds d) { return RequestBudget::Clock::now() + d; }

TEST(RequestBudgetTest, AdmitsUpToTheCapacityThenRefusesNamingTheBudget) {
  RequestBudget b(100, 1000, nullptr);
  EXPECT_TRUE(b.Acquire(60, In(milliseconds(0))).ok());
  EXPECT_TRUE(b.Acquire(40, In(milliseconds(0))).ok());
  EXPECT_EQ(b.in_flight(), 100);
  const Status refused = b.Acquire(1, In(milliseconds(5)));
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("in-flight request budget"));
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("--max-inflight-request-mb"));
  EXPECT_EQ(b.in_flight(), 100);  // a refusal takes nothing
  b.Release(40);
  EXPECT_TRUE(b.Acquire(40, In(milliseconds(0))).ok());
}

TEST(RequestBudgetTest, AWaiterIsAdmittedWhenBytesComeBack) {
  RequestBudget b(100, 1000, nullptr);
  ASSERT_TRUE(b.Acquire(100, In(milliseconds(0))).ok());
  auto waiter = std::async(std::launch::async, [&] { return b.Acquire(70, In(milliseconds(10000))); });
  // Not admitted while the budget is full (it may not have started waiting
  // yet; either way it cannot have got in).
  EXPECT_EQ(waiter.wait_for(milliseconds(20)), std::future_status::timeout);
  b.Release(100);
  EXPECT_TRUE(waiter.get().ok());
  EXPECT_EQ(b.in_flight(), 70);
}

TEST(RequestBudgetTest, DrainedHookRunsOnceABurstHasFullyLeft) {
  int drained = 0;
  RequestBudget b(100, 50, [&] { ++drained; });
  ASSERT_TRUE(b.Acquire(30, In(milliseconds(0))).ok());
  b.Release(30);
  EXPECT_EQ(drained, 0);  // at most 30 in flight at once: below the burst size
  ASSERT_TRUE(b.Acquire(30, In(milliseconds(0))).ok());
  ASSERT_TRUE(b.Acquire(25, In(milliseconds(0))).ok());
  b.Release(30);
  EXPECT_EQ(drained, 0);  // 25 still in flight
  b.Release(25);
  EXPECT_EQ(drained, 1);  // 55 were in flight at once, now all gone
  ASSERT_TRUE(b.Acquire(5, In(milliseconds(0))).ok());
  b.Release(5);
  EXPECT_EQ(drained, 1);
}

TEST(RequestBudgetTest, ManySmallCallsOneAtATimeAreNoBurst) {
  int drained = 0;
  RequestBudget b(100, 50, [&] { ++drained; });
  for (int i = 0; i < 20; ++i) {  // 200 bytes in all, never more than 10 at once
    ASSERT_TRUE(b.Acquire(10, In(milliseconds(0))).ok());
    b.Release(10);
  }
  EXPECT_EQ(drained, 0);
}

TEST(TenantTest, PeerAddressLosesOnlyItsPort) {
  EXPECT_EQ(PeerWithoutPort("ipv4:10.1.2.3:45678"), "ipv4:10.1.2.3");
  EXPECT_EQ(PeerWithoutPort("ipv6:[::1]:5000"), "ipv6:[::1]");
  EXPECT_EQ(PeerWithoutPort("ipv6:%5B::1%5D:5000"), "ipv6:%5B::1%5D");
  EXPECT_EQ(PeerWithoutPort("unix:/tmp/sock"), "unix:/tmp/sock");
  EXPECT_EQ(PeerWithoutPort("ipv6:fe80::1"), "ipv6:fe80::1");  // no port to strip
}

// A PNG followed by `pad` zero bytes: its header probes as the PNG's, so the
// worker queues it, and the message is as large as we need.
std::string PaddedPng(int seed, std::size_t pad) { return Png(56, 56, seed) + std::string(pad, '\0'); }

// Issue 15, item 6: 48 x 60 MB requests were all held at once. Here, scaled
// down: a burst of large requests over the budget gets RESOURCE_EXHAUSTED
// for the excess, small requests still get in, and the refusals are counted.
TEST(AdmissionServerTest, BurstOverTheBudgetRefusesTheExcessAndSmallRequestsStillPass) {
  TestServerOptions o;
  o.server.max_request_bytes = 1536 << 10;          // 1.5 MiB
  o.server.max_inflight_request_bytes = 3 << 20;    // 3 MiB: two 1.2 MiB requests fit, a third does not
  o.server.admission_wait = milliseconds(50);
  std::atomic<int> drained{0};
  o.server.on_requests_drained = [&] { ++drained; };
  TestServer t = StartTestServer(o);
  ASSERT_NE(t.server, nullptr);
  t.hold->store(true);  // admitted requests stay in flight (queued, no tower batch)

  constexpr std::size_t kBig = 1200 << 10;
  std::vector<std::future<RawCall>> big;
  for (int i = 0; i < 2; ++i) {
    big.push_back(std::async(std::launch::async, [&, i] {
      return CallEncode(*t.stub, MakeRequest("big-" + std::to_string(i), {PaddedPng(i, kBig)}));
    }));
  }
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.in_flight_requests == 2; }));

  const RawCall third = CallEncode(*t.stub, MakeRequest("big-2", {PaddedPng(2, kBig)}));
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.status.error_message(), ::testing::HasSubstr("in-flight request budget of 3.0 MiB"));

  // A small request fits next to the two big ones.
  auto small = std::async(std::launch::async,
                          [&] { return CallEncode(*t.stub, MakeRequest("small", {Png(56, 56, 9)})); });
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().worker.in_flight_requests == 3; }));
  t.hold->store(false);
  EXPECT_TRUE(small.get().status.ok());
  for (auto& f : big) EXPECT_EQ(f.get().status.error_code(), grpc::StatusCode::OK);

  const ServerStats s = t.server->Stats();
  ASSERT_EQ(s.rpc_errors.count(StatusCode::kResourceExhausted), 1u);
  EXPECT_EQ(s.rpc_errors.at(StatusCode::kResourceExhausted), 1u);
  // Everything admitted has left, and more than a sixteenth of the budget was in flight at once.
  EXPECT_TRUE(WaitFor([&] { return drained.load() == 1; }));
}

TEST(AdmissionServerTest, RejectsABudgetSmallerThanTheLargestRequest) {
  ServerOptions so;
  so.address = "127.0.0.1:0";
  so.max_request_bytes = 64 << 20;
  so.max_inflight_request_bytes = 32 << 20;
  WorkerOptions wo;
  wo.model_id = "test-model";
  auto s = EncodeServer::Start(so, wo, std::make_unique<FakeTower>());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("max_inflight_request_bytes"));
}

TEST(AdmissionServerTest, MalformedTenantIdIsInvalidArgumentNamingTheKey) {
  TestServer t = StartTestServer();
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-epd-tenant", std::string(200, 'a'));
  auto reader = t.stub->Encode(&ctx, MakeRequest("r", {Png(56, 56, 1)}));
  v1::EncodedItem item;
  while (reader->Read(&item)) {
  }
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("x-epd-tenant"));
}

}  // namespace
}  // namespace epd::testing
