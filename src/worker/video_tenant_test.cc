// Issue 40, B67: one tenant's pending video decodes hold back only the tower
// batches that its own chunks could join, and each tenant's queued decodes
// are capped (max_video_decodes_per_tenant).
//
// Under ScheduleOrder::kFair (the order that tells tenants apart) a pending
// video waits in its tenant's lane with a slot in the fair order
// (job_queue.h): another tenant's miss ahead of that slot is batched and
// answered while the decode is pending; the tenant's own later misses queue
// behind the video's chunks and share their batch. The decodes are held by
// the test (HeldDecoder), never slowed by sleeps.
//
// Tags by hand (default WorkerOptions, factor 28): a 56x56 image is 4 tokens
// + 4 pixel units = share 8; a clip chunk is 4 tokens = share 4; a video's
// slot has share S = 8192^2 / 28^2 = 85,598 (SlotShare: the decode term of
// one frame of the largest size the default video limits admit).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "epd/worker/encode_worker.h"
#include "epd/worker/worker_loop.h"
#include "held_decoder.h"
#include "video_test_clips.h"
#include "worker_test_util.h"

namespace epd {
namespace {

using namespace std::chrono_literals;
using testing::Chunk;
using testing::Clip;
using testing::Expected;
using testing::ExpectSameEmbedding;
using testing::HeldDecoder;
using testing::kBound;
using testing::Png;
using testing::Req;
using testing::Request;
using testing::S0;
using testing::VideoItem;
using testing::WantClip;

EncodeRequest For(std::string tenant, EncodeRequest r) {
  r.tenant = std::move(tenant);
  return r;
}

class VideoTenantTest : public ::testing::Test, protected testing::WorkerRig {
 protected:
  WorkerOptions Options(ScheduleOrder order = ScheduleOrder::kFair, int decode_threads = 0) {
    WorkerOptions o = WorkerRig::Options(decode_threads);
    o.order = order;
    o.decode_video = decoder_.Fn();
    return o;
  }
  // Starts and collects one batch (a batch waits for its items' prefetch).
  static bool OneBatch(EncodeWorker& w) {
    const auto until = std::chrono::steady_clock::now() + kBound;
    while (!w.StartBatch()) {
      if (w.WaitingOnDecode() || std::chrono::steady_clock::now() > until) return false;
      std::this_thread::yield();
    }
    return w.FinishBatch() > 0;
  }
  // Steps until nothing is queued, held or decoding (a kFair Step with decode
  // helpers may start nothing while its batch's items decode).
  static void DrainAll(EncodeWorker& w) {
    const auto until = std::chrono::steady_clock::now() + kBound;
    while (w.HasQueuedWork() && std::chrono::steady_clock::now() < until) {
      if (w.Step() == 0) std::this_thread::yield();
    }
    EXPECT_FALSE(w.HasQueuedWork());
  }
  void Submit(EncodeWorker& w, const std::string& tenant, EncodeRequest r) {
    const std::string id = r.id;
    ASSERT_TRUE(w.Submit(For(tenant, std::move(r)), c_.For(id)).ok()) << id;
  }

  HeldDecoder decoder_{60s};  // held until the test releases it
  const std::string a_ = Png(56, 56, 100), b_ = Png(56, 56, 101), d_ = Png(56, 56, 102);
};

// B67: tenant b's miss, submitted after tenant a's video, runs in a batch of
// its own while a's decode is held; a's chunks come after, once released.
TEST_F(VideoTenantTest, AnotherTenantsMissIsBatchedWhileAVideoDecodes) {
  auto w = Make(Options());
  Submit(*w, "a", Req("v", {VideoItem("hold:" + Clip(0, 2))}));
  Submit(*w, "b", Request("x", {b_}));
  ASSERT_TRUE(decoder_.AwaitHeld(1));
  EXPECT_FALSE(w->WaitingOnDecode());  // x is ahead of the video's slot
  ASSERT_TRUE(OneBatch(*w));
  ASSERT_TRUE(c_.done["x"].all_ok());
  ExpectSameEmbedding(*c_.done["x"].items[0].embedding, Expected(b_));
  EXPECT_EQ(decoder_.held(), 1);  // answered while the decode was held
  EXPECT_EQ(c_.done.count("v"), 0u);
  // Now the slot heads the order: nothing starts until the decode is in.
  EXPECT_TRUE(w->WaitingOnDecode());
  EXPECT_FALSE(w->StartBatch());
  decoder_.Release();
  DrainAll(*w);
  ASSERT_TRUE(c_.done["v"].all_ok());
  ExpectSameEmbedding(*c_.done["v"].items[0].embedding, WantClip(0, 2));
  const std::vector<std::vector<float>> want = {{S0(b_)}, {S0(Chunk(0)), S0(Chunk(1))}};
  EXPECT_EQ(state_->batch_ids, want);
}

// The same through WorkerLoop, the server's driver: x's reply arrives while
// the video's decode is still held.
TEST_F(VideoTenantTest, AnotherTenantsMissIsAnsweredThroughTheLoopWhileAVideoDecodes) {
  WorkerLoop loop(Make(Options()));
  std::future<RequestResult> v = loop.Submit(For("a", Req("v", {VideoItem("hold:" + Clip(0, 2))})));
  ASSERT_TRUE(decoder_.AwaitHeld(1));
  std::future<RequestResult> x = loop.Submit(For("b", Request("x", {b_})));
  ASSERT_EQ(x.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(decoder_.held(), 1);
  const RequestResult rx = x.get();
  ASSERT_TRUE(rx.all_ok());
  EXPECT_EQ(rx.items[0].source, ItemSource::kMiss);
  ExpectSameEmbedding(*rx.items[0].embedding, Expected(b_));
  EXPECT_NE(v.wait_for(0s), std::future_status::ready);
  decoder_.Release();
  ASSERT_EQ(v.wait_for(kBound), std::future_status::ready);
  const RequestResult rv = v.get();
  ASSERT_TRUE(rv.all_ok()) << rv.items[0].status.ToString();
  ExpectSameEmbedding(*rv.items[0].embedding, WantClip(0, 2));
}

// A tenant's own miss submitted after its video waits for it and shares its
// chunks' batch, as before; another tenant's miss does not wait.
TEST_F(VideoTenantTest, SameTenantChunksStillJoinItsLaterMissInOneBatch) {
  auto w = Make(Options());
  Submit(*w, "a", Req("v", {VideoItem("hold:" + Clip(0, 2))}));
  Submit(*w, "a", Request("y", {a_}));
  Submit(*w, "b", Request("x", {b_}));
  EXPECT_EQ(w->stats().pending_items, 2);  // y (held in a's lane) and x
  ASSERT_TRUE(OneBatch(*w));               // x alone: the slot closes it
  EXPECT_EQ(c_.done.count("y"), 0u);
  decoder_.Release();
  DrainAll(*w);
  for (const char* id : {"v", "x", "y"}) ASSERT_TRUE(c_.done[id].all_ok()) << id;
  ExpectSameEmbedding(*c_.done["y"].items[0].embedding, Expected(a_));
  // a's tags after the slot S: chunks S+4, S+8, then y S+16, in one batch.
  const std::vector<std::vector<float>> want = {{S0(b_)}, {S0(Chunk(0)), S0(Chunk(1)), S0(a_)}};
  EXPECT_EQ(state_->batch_ids, want);
}

// The bound of the rule: once the other tenant has been served the slot's
// share past the video's place, the slot heads the order and the pending
// decode holds its next miss too. Here S = max(56^2 / 28^2, 2 x 8) = 16, the
// batch share bound: x (tags 0-8) passes, z (8-16) ties with the slot (0-16),
// which was queued first.
TEST_F(VideoTenantTest, AMissPastTheSlotsShareWaitsForTheDecode) {
  WorkerOptions o = Options();
  o.max_tokens_per_batch = 8;
  o.video_limits.max_source_pixels = std::int64_t{56} * 56;
  auto w = Make(o);
  Submit(*w, "a", Req("v", {VideoItem("hold:" + Clip(0, 2))}));
  Submit(*w, "b", Request("x", {b_}));
  ASSERT_TRUE(OneBatch(*w));
  Submit(*w, "b", Request("z", {d_}));
  EXPECT_TRUE(w->WaitingOnDecode());
  EXPECT_FALSE(w->StartBatch());
  decoder_.Release();
  DrainAll(*w);
  for (const char* id : {"v", "x", "z"}) ASSERT_TRUE(c_.done[id].all_ok()) << id;
  // a's chunks: 16-20, 20-24; z (16) first, then as many as 8 tokens hold.
  const std::vector<std::vector<float>> want = {{S0(b_)}, {S0(d_), S0(Chunk(0))}, {S0(Chunk(1))}};
  EXPECT_EQ(state_->batch_ids, want);
}

// The batches follow the calls only: the same calls give the same batches
// whether the decode completes at once or only when the worker must wait.
TEST_F(VideoTenantTest, BatchesFollowTheCallsWhateverTheDecodeTiming) {
  auto run = [&](bool hold) {
    HeldDecoder decoder(60s);
    WorkerOptions o = Options();
    o.decode_video = decoder.Fn();
    o.max_items_per_batch = 2;
    auto w = Make(o);
    const std::string pre = hold ? "hold:" : "";
    auto submit = [&](const std::string& tenant, EncodeRequest r) {
      Submit(*w, tenant, std::move(r));
      if (!hold) Settle(*w);  // every decode completes before the next call
    };
    submit("a", Req("v", {VideoItem(pre + Clip(10, 3))}));
    submit("b", Request("x", {b_}));
    EXPECT_TRUE(OneBatch(*w));
    submit("b", Request("z", {d_}));
    submit("a", Request("y", {a_}));
    if (hold) decoder.Release();
    DrainAll(*w);
    for (const char* id : {"v", "x", "y", "z"}) EXPECT_TRUE(c_.done[id].all_ok()) << id;
    ExpectSameEmbedding(*c_.done["v"].items[0].embedding, WantClip(10, 3));
    std::vector<std::vector<float>> batches = state_->batch_ids;
    c_ = testing::Collector{};
    return batches;
  };
  // x (tags 0-8), z (8-16) before a's slot; then a's chunks and y, two a batch.
  const std::vector<std::vector<float>> want = {
      {S0(b_)}, {S0(d_)}, {S0(Chunk(10)), S0(Chunk(11))}, {S0(Chunk(12)), S0(a_)}};
  EXPECT_EQ(run(false), want);
  EXPECT_EQ(run(true), want);
}

// kFifo keeps its promise of arrival order: a miss submitted after a pending
// video is held behind it, whatever its tenant.
TEST_F(VideoTenantTest, FifoStillHoldsEveryLaterMissBehindTheVideo) {
  auto w = Make(Options(ScheduleOrder::kFifo));
  Submit(*w, "a", Req("v", {VideoItem("hold:" + Clip(0, 2))}));
  Submit(*w, "b", Request("x", {b_}));
  EXPECT_TRUE(w->WaitingOnDecode());
  EXPECT_FALSE(w->StartBatch());
  decoder_.Release();
  DrainAll(*w);
  const std::vector<std::vector<float>> want = {{S0(Chunk(0)), S0(Chunk(1)), S0(b_)}};
  EXPECT_EQ(state_->batch_ids, want);
}

// The cap: tenant a's third decode is refused, naming the tenant and the
// cap; nothing else is lost: a's hits and its video identical to a pending
// one (no new decode) are accepted, tenant b decodes, and everything
// accepted completes. Once a's decodes complete, a may queue again.
TEST_F(VideoTenantTest, ATenantOverItsDecodeCapIsRefusedAndTheOthersComplete) {
  WorkerOptions o = Options(ScheduleOrder::kFair, /*decode_threads=*/2);
  o.max_video_decodes_per_tenant = 2;
  auto w = Make(o);
  Submit(*w, "a", Req("v1", {VideoItem("hold:" + Clip(0, 1))}));
  Submit(*w, "a", Req("v2", {VideoItem("hold:" + Clip(1, 1))}));
  const Status refused = w->Submit(For("a", Req("v3", {VideoItem(Clip(2, 1))})), c_.For("v3"));
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("tenant 'a'"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("max_video_decodes_per_tenant (2)"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("request 'v3'"), std::string::npos) << refused.message();
  Submit(*w, "a", Req("v1again", {VideoItem("hold:" + Clip(0, 1))}));  // shares v1's decode
  Submit(*w, "a", Request("img", {a_}));
  Submit(*w, "b", Req("vb", {VideoItem(Clip(3, 1))}));
  decoder_.Release();
  DrainAll(*w);
  Settle(*w);
  EXPECT_EQ(c_.done.count("v3"), 0u);  // refused: no callback
  ExpectSameEmbedding(*c_.done["v1"].items[0].embedding, WantClip(0, 1));
  ExpectSameEmbedding(*c_.done["v1again"].items[0].embedding, WantClip(0, 1));
  ExpectSameEmbedding(*c_.done["v2"].items[0].embedding, WantClip(1, 1));
  ExpectSameEmbedding(*c_.done["vb"].items[0].embedding, WantClip(3, 1));
  ExpectSameEmbedding(*c_.done["img"].items[0].embedding, Expected(a_));
  EXPECT_EQ(w->stats().rejected_requests, 1u);
  EXPECT_EQ(w->stats().video_decodes, 3u);
  Submit(*w, "a", Req("v3", {VideoItem(Clip(2, 1))}));
  DrainAll(*w);
  ExpectSameEmbedding(*c_.done["v3"].items[0].embedding, WantClip(2, 1));
}

TEST(VideoDecodeCapOptionTest, ANegativeCapIsRefusedByValidate) {
  WorkerOptions o;
  o.model_id = "m";
  o.max_video_decodes_per_tenant = -1;
  const Status s = o.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_video_decodes_per_tenant"), std::string::npos) << s.message();
  o.max_video_decodes_per_tenant = 0;  // unbounded
  EXPECT_TRUE(o.Validate().ok());
}

}  // namespace
}  // namespace epd
