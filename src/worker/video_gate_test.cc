// Video decodes off the owning thread (issue 22 section 1, issue 27 fault 1):
// other requests are served while a video decodes, batches stay what the
// calls alone decide (the gate), identical videos share one decode, a cancel
// stops a decode and lets what it held go on, and one tenant's decodes leave
// a decode thread for another tenant.
//
// The decoder here (HeldDecoder, held_decoder.h) decodes the clips of
// video_test_clips.h; a container "hold:<clip>" waits until the test releases
// it (or its stop token is requested).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "epd/worker/encode_worker.h"
#include "epd/worker/worker_loop.h"
#include "held_decoder.h"
#include "tenant_task_pool.h"
#include "video_test_clips.h"
#include "worker_test_util.h"

namespace epd {
namespace {

using namespace std::chrono_literals;
using testing::Chunk;
using testing::Clip;
using testing::Expected;
using testing::ExpectSameEmbedding;
using testing::FakeDecode;
using testing::Png;
using testing::Req;
using testing::Request;
using testing::S0;
using testing::VideoItem;
using testing::WantClip;

using testing::HeldDecoder;
using testing::kBound;

class VideoGateTest : public ::testing::Test, protected testing::WorkerRig {
 protected:
  WorkerOptions Options(int decode_threads = 1) {
    WorkerOptions o = WorkerRig::Options(decode_threads);
    o.decode_video = decoder_.Fn();
    return o;
  }
  HeldDecoder decoder_;
  const std::string a_ = Png(56, 56, 100), b_ = Png(56, 56, 101), d_ = Png(56, 56, 102);
};

// Issue 22's check: a cache hit submitted behind a video whose decode takes
// 500 ms completes in under 50 ms (the bound the issue sets; the hit itself
// takes about a millisecond).
TEST_F(VideoGateTest, HitBehindAVideoWhoseDecodeTakes500MsCompletesInUnder50Ms) {
  WorkerOptions o = Options();
  std::atomic<int> decodes{0};
  o.decode_video = [&decodes](std::span<const std::uint8_t> b, const VideoSampling&, const PreprocessConfig& cfg,
                              const VideoLimits&, const std::stop_token&) {
    std::this_thread::sleep_for(500ms);
    return FakeDecode(b, cfg, &decodes);
  };
  WorkerLoop loop(Make(o));
  ASSERT_TRUE(loop.Submit(Request("prime", {a_})).get().all_ok());

  std::future<RequestResult> video = loop.Submit(Req("video", {VideoItem(Clip(0, 2))}));
  const auto start = std::chrono::steady_clock::now();
  std::future<RequestResult> hit = loop.Submit(Request("hit", {a_}));
  ASSERT_EQ(hit.wait_for(kBound), std::future_status::ready);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 50ms) << std::chrono::duration<double, std::milli>(took).count() << " ms";
  const RequestResult h = hit.get();
  ASSERT_TRUE(h.all_ok());
  EXPECT_EQ(h.items[0].source, ItemSource::kL1);
  ExpectSameEmbedding(*h.items[0].embedding, Expected(a_));

  ASSERT_EQ(video.wait_for(kBound), std::future_status::ready);
  const RequestResult v = video.get();
  ASSERT_TRUE(v.all_ok()) << v.items[0].status.ToString();
  ExpectSameEmbedding(*v.items[0].embedding, WantClip(0, 2));
}

// The batches of a sequence of calls are the same whether each video is
// decoded before the next call or only after all of them, and are the
// arrival order: a, v's chunks, b, c's chunk, d.
TEST_F(VideoGateTest, MissesBehindAPendingVideoAreHeldAndBatchesFollowTheCallsOnly) {
  auto run = [&](bool hold) {
    WorkerOptions o = Options();
    o.max_items_per_batch = 3;
    auto w = Make(o);
    const std::string pre = hold ? "hold:" : "";
    auto submit = [&](EncodeRequest r) {
      const std::string id = r.id;
      EXPECT_TRUE(w->Submit(std::move(r), c_.For(id)).ok());
      if (!hold) Settle(*w);
    };
    submit(Request("a", {a_}));
    submit(Req("v", {VideoItem(pre + Clip(10, 2))}));
    submit(Request("b", {b_}));
    submit(Req("c", {VideoItem(pre + Clip(20, 1))}));
    submit(Request("d", {d_}));
    if (hold) {
      // b and d are jobs held behind the videos; no batch may start.
      EXPECT_TRUE(w->WaitingOnDecode());
      EXPECT_EQ(w->stats().pending_items, 3);
      EXPECT_FALSE(w->StartBatch());
      decoder_.Release();
    }
    Drain(*w);
    for (const char* id : {"a", "v", "b", "c", "d"}) EXPECT_TRUE(c_.done[id].all_ok()) << id;
    ExpectSameEmbedding(*c_.done["v"].items[0].embedding, WantClip(10, 2));
    std::vector<std::vector<float>> batches = state_->batch_ids;
    c_ = testing::Collector{};
    return batches;
  };
  const std::vector<std::vector<float>> want = {{S0(a_), S0(Chunk(10)), S0(Chunk(11))},
                                                {S0(b_), S0(Chunk(20)), S0(d_)}};
  EXPECT_EQ(run(false), want);
  EXPECT_EQ(run(true), want);
}

TEST_F(VideoGateTest, AClosedFifoBatchStartsWhileAVideoDecodes) {
  WorkerOptions o = Options();
  o.max_items_per_batch = 2;
  auto w = Make(o);
  const std::string c = Png(56, 56, 103);
  ASSERT_TRUE(w->Submit(Request("imgs", {a_, b_, c}), c_.For("imgs")).ok());
  ASSERT_TRUE(w->Submit(Req("v", {VideoItem("hold:" + Clip(0, 2))}), c_.For("v")).ok());
  // {a, b} is closed (c does not fit in it), so no later job could join it.
  ASSERT_TRUE(w->StartBatch());
  EXPECT_EQ(w->FinishBatch(), 2);
  // {c} is not: the video's first chunk belongs in it.
  EXPECT_TRUE(w->WaitingOnDecode());
  EXPECT_FALSE(w->StartBatch());
  decoder_.Release();
  Drain(*w);
  ASSERT_TRUE(c_.done["v"].all_ok());
  const std::vector<std::vector<float>> want = {{S0(a_), S0(b_)}, {S0(c), S0(Chunk(0))}, {S0(Chunk(1))}};
  EXPECT_EQ(state_->batch_ids, want);
}

TEST_F(VideoGateTest, AnIdenticalVideoJoinsThePendingDecode) {
  auto w = Make(Options());
  ASSERT_TRUE(w->Submit(Req("v1", {VideoItem("hold:" + Clip(0, 2))}), c_.For("v1")).ok());
  ASSERT_TRUE(w->Submit(Req("v2", {VideoItem("hold:" + Clip(0, 2))}), c_.For("v2")).ok());
  decoder_.Release();
  Drain(*w);
  for (const char* id : {"v1", "v2"}) {
    ASSERT_TRUE(c_.done[id].all_ok()) << id;
    ExpectSameEmbedding(*c_.done[id].items[0].embedding, WantClip(0, 2));
  }
  EXPECT_EQ(decoder_.calls(), 1);
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.video_decodes, 1u);
  EXPECT_EQ(s.chunk_misses, 2u);
  EXPECT_EQ(s.chunk_joins, 2u);  // v2's chunks join v1's jobs
  EXPECT_EQ(s.tower_items, 2u);
}

// Issue 27 fault 1: a cancel (a deadline reaches the worker as one) stops the
// decode before its next frame, and what the video held goes on at once.
TEST_F(VideoGateTest, CancelStopsThePendingDecodeAndReleasesWhatItHeld) {
  auto w = Make(Options());
  ASSERT_TRUE(w->Submit(Req("v", {VideoItem("hold:" + Clip(0, 3))}), c_.For("v")).ok());
  ASSERT_TRUE(w->Submit(Request("b", {b_}), c_.For("b")).ok());
  EXPECT_EQ(w->stats().pending_items, 1);  // b, held
  EXPECT_FALSE(w->StartBatch());
  ASSERT_TRUE(decoder_.AwaitHeld(1));  // the decode is under way
  ASSERT_TRUE(w->Cancel("v"));
  EXPECT_EQ(c_.done["v"].status.code(), StatusCode::kCancelled);
  EXPECT_FALSE(w->WaitingOnDecode());
  EXPECT_TRUE(decoder_.AwaitStopSeen());
  Drain(*w);
  ASSERT_TRUE(c_.done["b"].all_ok());
  ExpectSameEmbedding(*c_.done["b"].items[0].embedding, Expected(b_));
  // The stopped decode's late completion is taken and ignored.
  while (w->DecodesPending() > 0) {
    if (w->Poll() == 0) std::this_thread::yield();
  }
  EXPECT_EQ(decoder_.calls(), 0);  // it never reached the frames
  EXPECT_EQ(w->stats().tower_items, 1u);
  EXPECT_EQ(w->stats().in_flight_requests, 0);
}

// Issue 27 fault 1: with two decode threads, one tenant's decodes hold at
// most one, so another tenant's video is decoded while both of the first
// tenant's wait.
TEST_F(VideoGateTest, OneTenantsDecodesLeaveADecodeThreadForAnother) {
  auto w = Make(Options(/*decode_threads=*/2));
  auto submit = [&](const std::string& tenant, const std::string& id, const std::string& clip) {
    EncodeRequest r = Req(id, {VideoItem(clip)});
    r.tenant = tenant;
    ASSERT_TRUE(w->Submit(std::move(r), c_.For(id)).ok());
  };
  submit("a", "a1", "hold:" + Clip(0, 1));
  submit("a", "a2", "hold:" + Clip(1, 1));
  submit("b", "b1", Clip(2, 1));
  // b1's decode completes; its chunk queues behind a1's and a2's (the gate).
  const auto until = std::chrono::steady_clock::now() + kBound;
  while (w->DecodesPending() > 2 && std::chrono::steady_clock::now() < until) {
    if (w->Poll() == 0) std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(w->DecodesPending(), 2) << "b1's decode waited for tenant a's";
  EXPECT_EQ(decoder_.max_held(), 1);
  decoder_.Release();
  Drain(*w);
  for (const char* id : {"a1", "a2", "b1"}) EXPECT_TRUE(c_.done[id].all_ok()) << id;
  ExpectSameEmbedding(*c_.done["b1"].items[0].embedding, WantClip(2, 1));
}

// Issue 40 (TSan): everything the tasks use is declared before the pool, so
// the pool's destructor, which waits for the third x task (it starts once
// `release` frees a thread), runs while mu and cv are still alive.
TEST(TenantTaskPoolTest, OneTenantHoldsAtMostAllButOneThread) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  int running_x = 0, max_x = 0;
  bool y_ran = false;
  internal::TenantTaskPool pool(3);
  EXPECT_EQ(pool.share(), 2);
  auto x_task = [&] {
    std::unique_lock<std::mutex> lock(mu);
    max_x = std::max(max_x, ++running_x);
    cv.notify_all();
    cv.wait_for(lock, kBound, [&] { return release; });
    --running_x;
  };
  for (int i = 0; i < 3; ++i) pool.Post("x", x_task);
  pool.Post("y", [&] {
    std::lock_guard<std::mutex> lock(mu);
    y_ran = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    // y runs while two x tasks hold their threads. The second x task is
    // taken before y but may not have started its body yet when y is done:
    // wait for both, not only for y (a check of running_x right after y_ran
    // failed under TSan's slower threads).
    EXPECT_TRUE(cv.wait_for(lock, kBound, [&] { return y_ran && running_x == 2; }));
    EXPECT_EQ(max_x, 2);  // the third x task waited for its tenant's share
    release = true;
    cv.notify_all();
  }
  // The third x task runs once a thread frees; the pool's destructor waits.
}

TEST(TenantTaskPoolTest, OneThreadRunsEveryTenantInArrivalOrder) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> order;
  internal::TenantTaskPool pool(0);  // max(1, 0) threads
  EXPECT_EQ(pool.threads(), 1);
  EXPECT_EQ(pool.share(), 1);
  for (int i = 0; i < 4; ++i) {
    pool.Post(i % 2 ? "x" : "y", [&, i] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, kBound, [&] { return order.size() == 4; }));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace epd
