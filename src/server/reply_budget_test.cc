// The reply budget (reply_budget.h) alone, and through a real in-process
// server: the write-progress timeout and the per-connection reply budget
// (issue 27, faults 4 and 5). The raw HTTP/2 peer with a zero window, against
// the real CLI, is tests/python/test_slow_readers.py.
//
// Expected numbers are worked out by hand from the limits each test sets.
#include "reply_budget.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

using internal::ReplyBudget;
using ::testing::HasSubstr;

ReplyBudget::Limits SmallLimits() {
  ReplyBudget::Limits l;
  l.buffered_bytes = 100;
  l.tenant_share_bytes = 40;
  l.held_bytes = 150;
  l.connection_held_bytes = 100;
  l.burst_bytes = 100;
  return l;
}

TEST(ReplyBudgetTest, SinkFullCountsEachTenantOnlyUpToItsShare) {
  std::atomic<int> rooms{0};
  ReplyBudget b(
      SmallLimits(), [&] { ++rooms; }, nullptr);
  ReplyBudget::Account a = b.Open("a", "conn-1"), a2 = b.Open("a", "conn-2");
  ReplyBudget::Account x = b.Open("b", "conn-3"), y = b.Open("c", "conn-4");
  // Tenant a alone, far past the bound: counted as its share of 40.
  EXPECT_FALSE(b.Buffer(a, 30));
  EXPECT_TRUE(b.Buffer(a2, 60));  // tenant a at 90 > 40: throttled
  EXPECT_FALSE(b.SinkFull());
  EXPECT_FALSE(b.Buffer(x, 40));  // 40 + 40
  EXPECT_FALSE(b.SinkFull());
  EXPECT_FALSE(b.Buffer(y, 30));  // 40 + 40 + 30 = 110 > 100
  EXPECT_TRUE(b.SinkFull());
  EXPECT_EQ(b.Snapshot().buffered_bytes, 160);  // the real total, uncapped
  // a falls to 30: 30 + 40 + 30 = 100, not past the bound: room, once.
  b.Unbuffer(a2, 60);
  EXPECT_FALSE(b.SinkFull());
  EXPECT_EQ(rooms.load(), 1);
  b.Unbuffer(a, 30);
  b.Unbuffer(x, 40);
  b.Unbuffer(y, 30);
  EXPECT_EQ(rooms.load(), 1);
  EXPECT_EQ(b.Snapshot().buffered_bytes, 0);
  for (ReplyBudget::Account* acc : {&a, &a2, &x, &y}) b.Close(*acc);
  EXPECT_FALSE(a.open());
}

TEST(ReplyBudgetTest, HoldRefusesPastTheConnectionOrTheTotalBudgetNamingIt) {
  ReplyBudget b(SmallLimits(), nullptr, nullptr);
  ReplyBudget::Account c1 = b.Open("t", "conn-1"), c1b = b.Open("u", "conn-1"), c2 = b.Open("t", "conn-2"),
                       c3 = b.Open("t", "conn-3");
  ASSERT_TRUE(b.Hold(c1, 60).ok());
  // 60 + 50 > 100 on conn-1 (whichever tenant the call is of).
  const Status conn = b.Hold(c1b, 50);
  EXPECT_EQ(conn.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(conn.message(), HasSubstr("--max-reply-mb-per-connection"));
  ASSERT_TRUE(b.Hold(c1b, 40).ok());    // exactly 100
  ASSERT_TRUE(b.Hold(c2, 40).ok());     // total 140
  const Status total = b.Hold(c3, 20);  // 160 > 150
  EXPECT_EQ(total.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(total.message(), HasSubstr("--max-reply-mb)"));
  EXPECT_EQ(b.Snapshot().held_bytes, 140);
  EXPECT_EQ(b.Snapshot().refusals, 2u);
  b.Unhold(c1, 60);
  b.Unhold(c1b, 40);
  b.Unhold(c2, 40);
  // Nothing held anywhere: one reply larger than both budgets still goes.
  ASSERT_TRUE(b.Hold(c3, 500).ok());
  // ...and the next one on another connection meets the total budget.
  EXPECT_EQ(b.Hold(c2, 1).code(), StatusCode::kResourceExhausted);
  b.Unhold(c3, 500);
  EXPECT_EQ(b.Snapshot().held_bytes, 0);
  EXPECT_EQ(b.Snapshot().refusals, 3u);
  for (ReplyBudget::Account* acc : {&c1, &c1b, &c2, &c3}) b.Close(*acc);
}

TEST(ReplyBudgetTest, DrainedRunsOnceAfterABurstAndNotAfterSmallReplies) {
  std::atomic<int> drained{0};
  ReplyBudget b(SmallLimits(), nullptr, [&] { ++drained; });
  ReplyBudget::Account c1 = b.Open("t", "conn-1"), c2 = b.Open("t", "conn-2");
  for (int i = 0; i < 50; ++i) {  // 500 bytes through, never 100 at once
    ASSERT_TRUE(b.Hold(c1, 10).ok());
    b.Unhold(c1, 10);
  }
  EXPECT_EQ(drained.load(), 0);
  ASSERT_TRUE(b.Hold(c1, 60).ok());
  ASSERT_TRUE(b.Hold(c2, 60).ok());  // 120 at once: a burst
  b.Unhold(c1, 60);
  EXPECT_EQ(drained.load(), 0);  // 60 still held
  b.Unhold(c2, 60);
  EXPECT_EQ(drained.load(), 1);
  b.Close(c1);
  b.Close(c2);
}

// --- through a server ----------------------------------------------------------

// A non-reading client's call of three 0.75 MiB results: its first write
// cannot complete in a 64 KiB window, so with a 300 ms write timeout the call
// is cancelled, counted once and leaves nothing held.
TEST(ReplyBudgetServerTest, WriteTimeoutCancelsACallWhoseClientAcceptsNothing) {
  TestServerOptions o;
  o.tower.hidden = 1 << 14;  // 4 tokens x 16384 x 3 halves x 4 B = 0.75 MiB per 56x56 item
  o.server.write_timeout = std::chrono::milliseconds(300);
  TestServer t = StartTestServer(o);
  const auto stub = NonReadingClientStub(t.target);
  grpc::ClientContext ctx;
  const auto began = std::chrono::steady_clock::now();
  auto reader = stub->Encode(&ctx, MakeRequest("stuck", {Png(56, 56, 61), Png(56, 56, 62), Png(56, 56, 63)}));
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().write_timeouts == 1; }));
  EXPECT_GE(std::chrono::steady_clock::now() - began, std::chrono::milliseconds(300));
  // The client then reads what reached it before the reset, and the end.
  v1::EncodedItem item;
  while (reader->Read(&item)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(WaitFor([&] {
    const ServerStats s = t.server->Stats();
    return s.buffered_bytes == 0 && s.reply_held_bytes == 0 && s.worker.in_flight_requests == 0;
  }));
  const ServerStats s = t.server->Stats();
  EXPECT_EQ(s.write_timeouts, 1u);
  EXPECT_EQ(s.rpc_errors.at(StatusCode::kCancelled), 1u);
  // A client that reads is not timed out.
  RawCall fine = CallEncode(*t.stub, MakeRequest("reads", {Png(56, 56, 64), Png(56, 56, 65)}));
  EXPECT_TRUE(fine.status.ok()) << fine.status.error_message();
  EXPECT_EQ(fine.items.size(), 2u);
  EXPECT_EQ(t.server->Stats().write_timeouts, 1u);
}

// Two single-item calls on one connection that reads nothing, each reply
// 0.75 MiB (charged 1.5 MiB: the message twice), under a 2 MiB
// per-connection budget: the first is held, the second refused naming the
// budget; another connection is unaffected.
TEST(ReplyBudgetServerTest, AReplyPastTheConnectionsBudgetEndsItsCallWithResourceExhausted) {
  TestServerOptions o;
  o.tower.hidden = 1 << 14;
  o.server.max_reply_bytes_per_connection = 2 << 20;
  o.server.write_timeout = std::chrono::milliseconds(0);
  TestServer t = StartTestServer(o);
  const auto stub = NonReadingClientStub(t.target);
  grpc::ClientContext first_ctx, second_ctx;
  auto first = stub->Encode(&first_ctx, MakeRequest("first", {Png(56, 56, 71)}));
  ASSERT_TRUE(WaitFor([&] { return t.server->Stats().reply_held_bytes > (3 << 19); }));
  const std::int64_t held = t.server->Stats().reply_held_bytes;
  EXPECT_LE(held, (3 << 19) + 2048);  // 2 x (0.75 MiB of rows + a few hundred bytes of fields)
  auto second = stub->Encode(&second_ctx, MakeRequest("second", {Png(56, 56, 72)}));
  const grpc::Status refused = second->Finish();  // trailers only: no window needed
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("per-connection reply budget of 2.0 MiB"));
  EXPECT_THAT(refused.error_message(), HasSubstr("(0 of 1 items were sent)"));
  EXPECT_EQ(t.server->Stats().reply_refusals, 1u);
  EXPECT_EQ(t.server->Stats().reply_held_bytes, held);
  // Another connection has a budget of its own.
  RawCall other = CallEncode(*t.stub, MakeRequest("other", {Png(56, 56, 73)}));
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
  // The first client reads after all: everything comes back.
  v1::EncodedItem item;
  ASSERT_TRUE(first->Read(&item));
  EXPECT_TRUE(first->Finish().ok());
  ASSERT_TRUE(WaitFor([&] {
    const ServerStats s = t.server->Stats();
    return s.buffered_bytes == 0 && s.reply_held_bytes == 0;
  }));
  EXPECT_EQ(t.server->Stats().rpc_errors.at(StatusCode::kResourceExhausted), 1u);
}

}  // namespace
}  // namespace epd::testing
