#include "epd/worker/worker_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>

#include "worker_test_util.h"

namespace epd {
namespace {

using testing::Expected;
using testing::ExpectSameEmbedding;
using testing::FakeTower;
using testing::Png;
using testing::Request;

// "t<thread>-<index>".
std::string RequestId(int thread, int index) { return "t" + std::to_string(thread) + "-" + std::to_string(index); }

std::unique_ptr<EncodeWorker> MakeWorker(WorkerOptions o = {}) {
  o.model_id = "test-model";
  auto w = EncodeWorker::Create(std::move(o), std::make_unique<FakeTower>());
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return std::move(*w);
}

TEST(WorkerLoopTest, ConcurrentSubmitsFromSeveralThreadsAllComplete) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 15;
  std::vector<std::string> images;
  images.reserve(5);
  for (int i = 0; i < 5; ++i) images.push_back(Png(56, 56, 100 + i));
  std::vector<Embedding> want;
  want.reserve(images.size());
  for (const std::string& m : images) want.push_back(Expected(m));

  WorkerLoop loop(MakeWorker());
  std::atomic<int> items_seen{0};
  std::vector<std::vector<std::future<RequestResult>>> futures(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Request i of thread t holds images (t + i) % 5 and (t + 2 i) % 5.
        EncodeRequest r = Request(RequestId(t, i), {images[(t + i) % 5], images[(t + 2 * i) % 5]});
        futures[t].push_back(loop.Submit(std::move(r), {[&](const ItemResult&) { ++items_seen; }, nullptr}));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      RequestResult r = futures[t][i].get();
      ASSERT_TRUE(r.all_ok()) << r.id;
      ExpectSameEmbedding(*r.items[0].embedding, want[(t + i) % 5]);
      ExpectSameEmbedding(*r.items[1].embedding, want[(t + 2 * i) % 5]);
    }
  }
  loop.Shutdown(std::chrono::seconds(1));
  const WorkerStats s = loop.Stats();
  EXPECT_EQ(items_seen.load(), 2 * kThreads * kPerThread);
  EXPECT_EQ(s.requests, static_cast<std::uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(s.items, static_cast<std::uint64_t>(2 * kThreads * kPerThread));
  EXPECT_EQ(s.hits_l1 + s.hits_l2 + s.joins + s.misses, s.items);
  // Every key is either in flight or cached once computed: 5 tower items.
  EXPECT_EQ(s.tower_items, 5u);
  EXPECT_EQ(s.misses, 5u);
}

TEST(WorkerLoopTest, RefusalsCompleteTheFutureWithTheReason) {
  WorkerOptions o;
  bool never = true;
  o.sink_full = [&] { return never; };  // keeps "a" in flight
  WorkerLoop loop(MakeWorker(o));
  std::future<RequestResult> a = loop.Submit(Request("a", {Png(56, 56, 1)}));
  std::future<RequestResult> dup = loop.Submit(Request("a", {Png(56, 56, 2)}));
  RequestResult d = dup.get();
  EXPECT_EQ(d.status.code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(d.items.empty());

  loop.Cancel("a");
  RequestResult r = a.get();
  EXPECT_EQ(r.status.code(), StatusCode::kCancelled);
  ASSERT_EQ(r.items.size(), 1u);
  EXPECT_EQ(r.items[0].status.code(), StatusCode::kCancelled);
  loop.Shutdown(std::chrono::milliseconds(0));
}

TEST(WorkerLoopTest, ShutdownFailsWhatItCannotFinishAndRefusesNewWork) {
  WorkerOptions o;
  o.sink_full = [] { return true; };  // nothing can run
  WorkerLoop loop(MakeWorker(o));
  bool done_called = false;
  std::future<RequestResult> a = loop.Submit(Request("a", {Png(56, 56, 1)}));
  loop.Shutdown(std::chrono::milliseconds(20));
  RequestResult r = a.get();
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.items.at(0).status.code(), StatusCode::kUnavailable);

  std::future<RequestResult> late =
      loop.Submit(Request("b", {Png(56, 56, 2)}), {nullptr, [&](const RequestResult&) { done_called = true; }});
  EXPECT_EQ(late.get().status.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(done_called);
  loop.Shutdown(std::chrono::milliseconds(0));  // idempotent
}

TEST(WorkerLoopTest, ShutdownFinishesQueuedWorkWithinTheGrace) {
  WorkerLoop loop(MakeWorker());
  std::vector<std::future<RequestResult>> fs;
  fs.reserve(6);
  for (int i = 0; i < 6; ++i) fs.push_back(loop.Submit(Request(RequestId(0, i), {Png(56, 56, i)})));
  loop.Shutdown(std::chrono::seconds(60));
  for (auto& f : fs) EXPECT_TRUE(f.get().all_ok());
  EXPECT_EQ(loop.Stats().tower_items, 6u);
}

// Regression: a stop seen while the last batch was still outstanding left
// the loop waiting forever after collecting it (Shutdown never returned).
// The window is narrow, so the scenario is repeated.
TEST(WorkerLoopTest, ShutdownRightAfterTheLastBatchReturns) {
  const std::string image = Png(56, 56, 1);
  for (int i = 0; i < 100; ++i) {
    WorkerLoop loop(MakeWorker());
    std::future<RequestResult> f = loop.Submit(Request("a", {image}));
    loop.Shutdown(std::chrono::seconds(60));
    EXPECT_TRUE(f.get().all_ok());
  }
}

TEST(WorkerLoopTest, ACancelByTicketReachesOnlyItsOwnSubmission) {
  WorkerOptions o;
  std::atomic<bool> full{true};
  o.sink_full = [&] { return full.load(); };  // keeps "a" in flight
  WorkerLoop loop(MakeWorker(o));
  WorkerLoop::Ticket first = 0, second = 0;
  std::future<RequestResult> a = loop.Submit(Request("a", {Png(56, 56, 1)}), {}, &first);
  // A second submission reuses the id: the worker refuses it, and its own
  // cancel, by ticket, must not reach the first one.
  std::future<RequestResult> dup = loop.Submit(Request("a", {Png(56, 56, 2)}), {}, &second);
  EXPECT_NE(first, 0u);
  EXPECT_NE(second, first);
  EXPECT_EQ(dup.get().status.code(), StatusCode::kAlreadyExists);
  loop.Cancel("a", second);
  // A ticket that was never issued reaches nothing either.
  loop.Cancel("a", second + 1000);
  // Both cancels have reached the worker thread once this request, queued
  // behind them, completes (it has no items, so at once); "a" is still in
  // flight.
  EXPECT_TRUE(loop.Submit(Request("probe", {})).get().status.ok());
  EXPECT_EQ(a.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  full = false;
  loop.Wake();
  RequestResult r = a.get();
  EXPECT_TRUE(r.all_ok()) << r.status.ToString();

  // The holder's own ticket cancels it.
  full = true;
  WorkerLoop::Ticket third = 0;
  std::future<RequestResult> b = loop.Submit(Request("b", {Png(56, 56, 4)}), {}, &third);
  loop.Cancel("b", third);
  EXPECT_EQ(b.get().status.code(), StatusCode::kCancelled);
  loop.Shutdown(std::chrono::milliseconds(0));
}

TEST(WorkerLoopTest, WakeResumesAfterTheSinkDrains) {
  WorkerOptions o;
  std::atomic<bool> full{true};
  o.sink_full = [&] { return full.load(); };
  WorkerLoop loop(MakeWorker(o));
  std::future<RequestResult> a = loop.Submit(Request("a", {Png(56, 56, 1)}));
  EXPECT_EQ(a.wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  full = false;
  loop.Wake();
  EXPECT_TRUE(a.get().all_ok());
}

}  // namespace
}  // namespace epd
