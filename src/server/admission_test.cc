// The in-flight request budget and the tenant of a call (admission.h), alone
// and through a real in-process server (issue 15, items 6 and 7).
#include "admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "task_pool.h"
#include "test_server.h"
#include "worker_test_util.h"

namespace epd::testing {
namespace {

using internal::PeerWithoutPort;
using internal::RequestBudget;
using std::chrono::milliseconds;

RequestBudget::Clock::time_point In(milliseconds d) { return RequestBudget::Clock::now() + d; }

// One waiter's answer: what its grant was told, once.
struct Answer {
  std::promise<Status> promise;
  std::future<Status> future = promise.get_future();
  std::atomic<int> calls{0};
  RequestBudget::Grant Grant() {
    return [this](const Status& st) {
      if (calls.fetch_add(1) == 0) promise.set_value(st);
    };
  }
  bool answered() { return future.wait_for(milliseconds(0)) == std::future_status::ready; }
  // For grants a Release posts to the pool.
  bool arrives() { return future.wait_for(milliseconds(10000)) == std::future_status::ready; }
};

// Acquire that answers at once (room, or a deadline already past).
Status AcquireNow(RequestBudget& b, std::int64_t bytes) {
  Answer a;
  EXPECT_EQ(b.Acquire(bytes, In(milliseconds(0)), a.Grant()), 0U);
  EXPECT_TRUE(a.answered());
  return a.future.get();
}

TEST(RequestBudgetTest, AdmitsUpToTheCapacityThenRefusesNamingTheBudgetAtTheDeadline) {
  internal::TaskPool pool(1);
  RequestBudget b(100, 1000, nullptr, &pool);
  EXPECT_TRUE(AcquireNow(b, 60).ok());
  EXPECT_TRUE(AcquireNow(b, 40).ok());
  EXPECT_EQ(b.in_flight(), 100);
  Answer late;
  const auto asked = RequestBudget::Clock::now();
  EXPECT_NE(b.Acquire(1, In(milliseconds(30)), late.Grant()), 0U);  // queued
  EXPECT_EQ(b.waiting(), 1);
  const Status refused = late.future.get();
  EXPECT_GE(RequestBudget::Clock::now() - asked, milliseconds(30));  // not before its deadline
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("in-flight request budget"));
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("--max-inflight-request-mb"));
  EXPECT_EQ(b.in_flight(), 100);  // a refusal takes nothing
  EXPECT_EQ(b.waiting(), 0);
  b.Release(40);
  EXPECT_TRUE(AcquireNow(b, 40).ok());
  EXPECT_EQ(late.calls.load(), 1);
}

TEST(RequestBudgetTest, APastDeadlineIsAnsweredAtOnce) {
  internal::TaskPool pool(1);
  RequestBudget b(100, 1000, nullptr, &pool);
  ASSERT_TRUE(AcquireNow(b, 100).ok());
  EXPECT_EQ(AcquireNow(b, 1).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(b.waiting(), 0);
}

TEST(RequestBudgetTest, AWaiterIsAdmittedByTheReleaseThatMakesRoom) {
  internal::TaskPool pool(1);
  RequestBudget b(100, 1000, nullptr, &pool);
  ASSERT_TRUE(AcquireNow(b, 100).ok());
  Answer w;
  ASSERT_NE(b.Acquire(70, In(milliseconds(60000)), w.Grant()), 0U);
  b.Release(20);  // 80 in flight: 70 more do not fit
  EXPECT_FALSE(w.answered());
  b.Release(80);  // the bytes are taken here; the grant runs on the pool
  EXPECT_EQ(b.in_flight(), 70);
  ASSERT_TRUE(w.arrives());
  EXPECT_TRUE(w.future.get().ok());
  EXPECT_EQ(b.in_flight(), 70);
  EXPECT_EQ(b.waiting(), 0);
}

TEST(RequestBudgetTest, SmallWaitersPassALargeOneThatKeepsItsPlace) {
  internal::TaskPool pool(1);
  RequestBudget b(100, 1000, nullptr, &pool);
  ASSERT_TRUE(AcquireNow(b, 100).ok());
  Answer large, small1, small2;
  ASSERT_NE(b.Acquire(90, In(milliseconds(60000)), large.Grant()), 0U);  // oldest
  ASSERT_NE(b.Acquire(20, In(milliseconds(60000)), small1.Grant()), 0U);
  ASSERT_NE(b.Acquire(20, In(milliseconds(60000)), small2.Grant()), 0U);
  b.Release(50);  // 50 in flight: the large one does not fit, both small ones do (90)
  EXPECT_EQ(b.in_flight(), 90);
  ASSERT_TRUE(small1.arrives() && small2.arrives());
  EXPECT_FALSE(large.answered());
  b.Release(50 + 20 + 20);  // all out: the large one goes next
  ASSERT_TRUE(large.arrives());
  EXPECT_TRUE(large.future.get().ok());
  EXPECT_EQ(b.in_flight(), 90);
}

TEST(RequestBudgetTest, ACancelledWaiterIsToldWhyAndTakesNothing) {
  internal::TaskPool pool(1);
  RequestBudget b(100, 1000, nullptr, &pool);
  ASSERT_TRUE(AcquireNow(b, 100).ok());
  Answer w;
  const RequestBudget::WaiterId id = b.Acquire(10, In(milliseconds(60000)), w.Grant());
  ASSERT_NE(id, 0U);
  b.Cancel(id, Cancelled("the client cancelled the call"));
  ASSERT_TRUE(w.answered());
  EXPECT_EQ(w.future.get().code(), StatusCode::kCancelled);
  b.Cancel(id, Cancelled("again"));  // no longer queued: nothing happens
  b.Release(100);
  EXPECT_EQ(b.in_flight(), 0);
  EXPECT_EQ(w.calls.load(), 1);
}

TEST(RequestBudgetTest, DrainedHookRunsOnceABurstHasFullyLeft) {
  internal::TaskPool pool(1);
  int drained = 0;
  RequestBudget b(
      100, 50, [&] { ++drained; }, &pool);
  ASSERT_TRUE(AcquireNow(b, 30).ok());
  b.Release(30);
  EXPECT_EQ(drained, 0);  // at most 30 in flight at once: below the burst size
  ASSERT_TRUE(AcquireNow(b, 30).ok());
  ASSERT_TRUE(AcquireNow(b, 25).ok());
  b.Release(30);
  EXPECT_EQ(drained, 0);  // 25 still in flight
  b.Release(25);
  EXPECT_EQ(drained, 1);  // 55 were in flight at once, now all gone
  ASSERT_TRUE(AcquireNow(b, 5).ok());
  b.Release(5);
  EXPECT_EQ(drained, 1);
}

TEST(RequestBudgetTest, NoDrainWhileAReleaseAdmitsAWaiter) {
  internal::TaskPool pool(1);
  int drained = 0;
  RequestBudget b(
      100, 50, [&] { ++drained; }, &pool);
  ASSERT_TRUE(AcquireNow(b, 100).ok());
  Answer w;
  ASSERT_NE(b.Acquire(60, In(milliseconds(60000)), w.Grant()), 0U);
  b.Release(100);  // 60 go straight back in flight
  EXPECT_EQ(drained, 0);
  ASSERT_TRUE(w.arrives());
  b.Release(60);
  EXPECT_EQ(drained, 1);
}

TEST(RequestBudgetTest, ManySmallCallsOneAtATimeAreNoBurst) {
  internal::TaskPool pool(1);
  int drained = 0;
  RequestBudget b(
      100, 50, [&] { ++drained; }, &pool);
  for (int i = 0; i < 20; ++i) {  // 200 bytes in all, never more than 10 at once
    ASSERT_TRUE(AcquireNow(b, 10).ok());
    b.Release(10);
  }
  EXPECT_EQ(drained, 0);
}

// Thousands of waiters of mixed sizes, some with deadlines that pass while
// they wait, answered by Releases, Cancels and timers on four threads at
// once, with Cancels aimed at waiters a Release may be admitting at that
// moment: each waiter hears exactly once, every byte an OK grant took comes
// back, and the budget ends empty with its drained hook run.
TEST(RequestBudgetTest, ThousandsOfWaitersRacingReleasesCancelsAndDeadlinesEachHearOnceAndLeaveNothingHeld) {
  constexpr int kWaiters = 3000;
  constexpr std::int64_t kCapacity = 100;
  internal::TaskPool pool(2);
  std::atomic<int> drained{0};
  RequestBudget b(
      kCapacity, 50, [&] { ++drained; }, &pool);
  ASSERT_TRUE(AcquireNow(b, kCapacity).ok());  // full: every waiter below queues

  struct Waiter {
    std::int64_t bytes = 0;
    std::atomic<int> answers{0};
    std::atomic<int> code{-1};
    RequestBudget::WaiterId id = 0;
  };
  std::vector<Waiter> w(kWaiters);
  // OK grants hand their bytes to the releasing thread, as a finished call's
  // OnDone would.
  std::mutex held_mu;
  std::vector<std::int64_t> held;
  std::mt19937 rng(7);
  for (int i = 0; i < kWaiters; ++i) {
    w[i].bytes = 1 + static_cast<std::int64_t>(rng() % 60);
    // One in five waits only 1..20 ms; the rest long enough that only a
    // Release or a Cancel answers them.
    const milliseconds wait = i % 5 == 0 ? milliseconds(1 + static_cast<int>(rng() % 20)) : milliseconds(600000);
    w[i].id = b.Acquire(w[i].bytes, In(wait), [&, i](const Status& st) {
      w[i].code.store(static_cast<int>(st.code()));
      if (w[i].answers.fetch_add(1) == 0 && st.ok()) {
        std::lock_guard<std::mutex> lock(held_mu);
        held.push_back(w[i].bytes);
      }
    });
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  threads.reserve(2);
  // Two cancellers, over the same waiters in opposite orders: a Cancel meets
  // a waiter a Release or the other canceller is answering.
  for (int dir = 0; dir < 2; ++dir) {
    threads.emplace_back([&, dir] {
      for (int k = 0; k < kWaiters; ++k) {
        const int i = dir == 0 ? k : kWaiters - 1 - k;
        if (i % 3 == 1 && w[i].id != 0) b.Cancel(w[i].id, Cancelled("the client cancelled the call"));
      }
    });
  }
  // Two releasers: the initial fill, then whatever OK grants took.
  threads.emplace_back([&] { b.Release(kCapacity); });
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        std::int64_t bytes = -1;
        {
          std::lock_guard<std::mutex> lock(held_mu);
          if (!held.empty()) {
            bytes = held.back();
            held.pop_back();
          }
        }
        if (bytes >= 0) {
          b.Release(bytes);
        } else {
          std::this_thread::yield();
        }
      }
    });
  }
  // Every waiter is answered (the long waits only by a Release or Cancel).
  const auto until = RequestBudget::Clock::now() + std::chrono::seconds(60);
  auto all_answered = [&] {
    for (const Waiter& x : w) {
      if (x.answers.load() == 0) return false;
    }
    return true;
  };
  while (!all_answered() && RequestBudget::Clock::now() < until) std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(all_answered()) << b.waiting() << " waiters still queued, " << b.in_flight() << " bytes in flight";
  // Then wait for the releasers to hand back every OK grant's bytes.
  while (RequestBudget::Clock::now() < until) {
    {
      std::lock_guard<std::mutex> lock(held_mu);
      if (held.empty() && b.in_flight() == 0) break;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  stop.store(true);
  for (std::thread& t : threads) t.join();

  int ok = 0, cancelled = 0, refused = 0;
  for (int i = 0; i < kWaiters; ++i) {
    ASSERT_EQ(w[i].answers.load(), 1) << "waiter " << i;
    const auto code = static_cast<StatusCode>(w[i].code.load());
    ok += code == StatusCode::kOk;
    cancelled += code == StatusCode::kCancelled;
    refused += code == StatusCode::kResourceExhausted;
    // Only the waiters given a short wait can be refused, and only those
    // the cancellers aim at can be cancelled.
    if (code == StatusCode::kResourceExhausted) {
      EXPECT_EQ(i % 5, 0) << i;
    }
    if (code == StatusCode::kCancelled) {
      EXPECT_EQ(i % 3, 1) << i;
    }
  }
  EXPECT_EQ(ok + cancelled + refused, kWaiters);
  EXPECT_GT(ok, 0);
  EXPECT_EQ(b.in_flight(), 0);
  EXPECT_EQ(b.waiting(), 0);
  EXPECT_GE(drained.load(), 1);
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
  o.server.max_request_bytes = 1536 << 10;        // 1.5 MiB
  o.server.max_inflight_request_bytes = 3 << 20;  // 3 MiB: two 1.2 MiB requests fit, a third does not
  o.server.admission_wait = milliseconds(50);
  std::atomic<int> drained{0};
  o.server.on_requests_drained = [&] { ++drained; };
  TestServer t = StartTestServer(o);
  ASSERT_NE(t.server, nullptr);
  t.hold->store(true);  // admitted requests stay in flight (queued, no tower batch)

  constexpr std::size_t kBig = 1200 << 10;
  std::vector<std::future<RawCall>> big;
  big.reserve(2);
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
  auto small =
      std::async(std::launch::async, [&] { return CallEncode(*t.stub, MakeRequest("small", {Png(56, 56, 9)})); });
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
