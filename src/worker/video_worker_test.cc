// The encode worker's video items (docs/VIDEO.md): a video is answered from
// its temporal chunks, each cached, joined or encoded like an image. The
// clips and their expected embeddings: video_test_clips.h.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "epd/worker/encode_worker.h"
#include "video_test_clips.h"
#include "worker_test_util.h"

namespace epd {
namespace {

using testing::Clip;
using testing::Expected;
using testing::FakeDecode;
using testing::FakeTowerOptions;
using testing::kChunkTokens;
using testing::Png;
using testing::Req;
using testing::VideoItem;
using testing::WantClip;

class VideoWorkerTest : public ::testing::TestWithParam<int>, protected testing::WorkerRig {
 protected:
  WorkerOptions Options() {
    WorkerOptions o = WorkerRig::Options(GetParam());
    o.decode_video = [this](std::span<const std::uint8_t> b, const VideoSampling&, const PreprocessConfig& cfg,
                            const VideoLimits&, const std::stop_token&) { return FakeDecode(b, cfg, &decodes_); };
    return o;
  }
  std::unique_ptr<EncodeWorker> Make() { return Make(Options()); }
  using WorkerRig::Make;
  const ItemResult& Item(const std::string& id, std::size_t i = 0) { return c_.done.at(id).items.at(i); }

  std::atomic<int> decodes_{0};
};

TEST_P(VideoWorkerTest, VideoIsItsChunksEncodedOneByOneAndConcatenated) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Req("v", {VideoItem(Clip(0, 3))}), c_.For("v")).ok());
  Drain(*w);

  ASSERT_TRUE(c_.done["v"].all_ok()) << Item("v").status.ToString();
  const ItemResult& r = Item("v");
  EXPECT_EQ(r.source, ItemSource::kMiss);
  testing::ExpectSameEmbedding(*r.embedding, WantClip(0, 3));
  ASSERT_NE(r.video, nullptr);
  EXPECT_EQ(r.video->timestamps_s, (std::vector<double>{0, 0.5, 1, 1.5, 2, 2.5}));
  EXPECT_EQ(r.video->seconds_per_grid_t, 1.0);
  // Every tower item is one chunk of grid (1, 4, 4).
  std::int64_t items = 0;
  for (const auto& batch : state_->batches) {
    for (const GridTHW& g : batch) {
      EXPECT_EQ(g, (GridTHW{1, 4, 4}));
      ++items;
    }
  }
  EXPECT_EQ(items, 3);
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.video_items, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.chunk_misses, 3u);
  EXPECT_EQ(s.chunk_hits, 0u);
  EXPECT_EQ(s.tower_items, 3u);
  EXPECT_EQ(s.tower_tokens, 3u * kChunkTokens);
}

TEST_P(VideoWorkerTest, LongerClipRunsTheTowerOnlyOnItsNewChunks) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Req("short", {VideoItem(Clip(0, 3))}), c_.For("short")).ok());
  Drain(*w);
  ASSERT_EQ(w->stats().tower_items, 3u);

  // A growing stream's next prefix: chunks 0..4, of which 0..2 are cached.
  ASSERT_TRUE(w->Submit(Req("prefix", {VideoItem(Clip(0, 5))}), c_.For("prefix")).ok());
  Drain(*w);
  ASSERT_TRUE(c_.done["prefix"].all_ok());
  testing::ExpectSameEmbedding(*Item("prefix").embedding, WantClip(0, 5));
  WorkerStats s = w->stats();
  EXPECT_EQ(s.tower_items, 5u);
  EXPECT_EQ(s.chunk_hits, 3u);
  EXPECT_EQ(s.chunk_misses, 5u);

  // A sliding window inside what is cached: no tower work at all, delivered
  // once its decode is handled.
  ASSERT_TRUE(w->Submit(Req("window", {VideoItem(Clip(2, 3))}), c_.For("window")).ok());
  Settle(*w);
  ASSERT_EQ(c_.done.count("window"), 1u);
  ASSERT_TRUE(c_.done["window"].all_ok());
  testing::ExpectSameEmbedding(*Item("window").embedding, WantClip(2, 3));
  s = w->stats();
  EXPECT_EQ(s.tower_items, 5u);
  EXPECT_EQ(s.chunk_hits, 6u);
  EXPECT_EQ(s.video_decodes, 3u);
}

TEST_P(VideoWorkerTest, ExactRepeatIsOneLookupWithoutDecode) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Req("a", {VideoItem(Clip(0, 2))}), c_.For("a")).ok());
  Drain(*w);
  ASSERT_EQ(decodes_.load(), 1);
  ASSERT_TRUE(w->Submit(Req("b", {VideoItem(Clip(0, 2))}), c_.For("b")).ok());

  ASSERT_EQ(c_.done.count("b"), 1u);
  const ItemResult& hit = Item("b");
  EXPECT_EQ(hit.source, ItemSource::kL1);
  EXPECT_EQ(decodes_.load(), 1);
  testing::ExpectSameEmbedding(*hit.embedding, WantClip(0, 2));
  ASSERT_NE(hit.video, nullptr);
  EXPECT_EQ(hit.video->timestamps_s.size(), 4u);
  EXPECT_EQ(hit.key, Item("a").key);
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.hits_l1, 1u);
  EXPECT_EQ(s.video_decodes, 1u);
  EXPECT_EQ(s.chunk_hits, 0u);
}

TEST_P(VideoWorkerTest, OtherSamplingIsAnotherVideoKey) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Req("a", {VideoItem(Clip(0, 2))}), c_.For("a")).ok());
  Drain(*w);
  EncodeItemInput other = VideoItem(Clip(0, 2));
  other.video->sampling = VideoSampling{};
  other.video->sampling->fps = 1.0;
  ASSERT_TRUE(w->Submit(Req("b", {other}), c_.For("b")).ok());
  // Not a whole-video hit (decoded again), but the fake decoder gives the
  // same frames, so every chunk hits.
  Settle(*w);
  ASSERT_EQ(c_.done.count("b"), 1u);
  EXPECT_NE(Item("b").key, Item("a").key);
  EXPECT_EQ(decodes_.load(), 2);
  EXPECT_EQ(w->stats().chunk_hits, 2u);
}

TEST_P(VideoWorkerTest, ChunksInFlightAreJoinedAcrossVideosAndWithinOne) {
  auto w = Make();
  // b overlaps a in chunks 1 and 2; c repeats chunk 3 (same pixels twice).
  ASSERT_TRUE(w->Submit(Req("a", {VideoItem(Clip(0, 3))}), c_.For("a")).ok());
  ASSERT_TRUE(w->Submit(Req("b", {VideoItem(Clip(1, 3))}), c_.For("b")).ok());
  Drain(*w);
  ASSERT_TRUE(c_.done["a"].all_ok());
  ASSERT_TRUE(c_.done["b"].all_ok());
  testing::ExpectSameEmbedding(*Item("a").embedding, WantClip(0, 3));
  testing::ExpectSameEmbedding(*Item("b").embedding, WantClip(1, 3));
  const WorkerStats s = w->stats();
  EXPECT_EQ(s.chunk_misses, 4u);  // chunks 0, 1, 2, 3
  EXPECT_EQ(s.chunk_joins, 2u);   // b's 1 and 2
  EXPECT_EQ(s.tower_items, 4u);
}

TEST_P(VideoWorkerTest, LongVideoIsSplitUnderTheTokenBudgetAndImagesKeepTheirTurn) {
  WorkerOptions o = Options();
  o.max_tokens_per_batch = 3 * kChunkTokens;
  auto w = Make(o);
  const std::string before = Png(56, 56, 100);
  const std::string after = Png(56, 56, 101);
  EncodeRequest first = testing::Request("img-before", {before});
  ASSERT_TRUE(w->Submit(std::move(first), c_.For("img-before")).ok());
  ASSERT_TRUE(w->Submit(Req("long", {VideoItem(Clip(0, 10))}), c_.For("long")).ok());
  ASSERT_TRUE(w->Submit(testing::Request("img-after", {after}), c_.For("img-after")).ok());
  Drain(*w);

  ASSERT_TRUE(c_.done["long"].all_ok());
  testing::ExpectSameEmbedding(*Item("long").embedding, WantClip(0, 10));
  // 12 computations of 4 tokens, 3 per batch, in arrival order: the earlier
  // image rides in the first batch, the later one right after the video.
  ASSERT_EQ(state_->batches.size(), 4u);
  for (const auto& batch : state_->batches) EXPECT_LE(static_cast<std::int64_t>(batch.size()) * kChunkTokens, 12);
  // A batch records each item's s_0, the first main value of its embedding.
  auto s0 = [](const Embedding& e) {
    float v;
    std::memcpy(&v, e.main.data(), sizeof v);
    return v;
  };
  ASSERT_EQ(state_->batch_ids[0].size(), 3u);
  ASSERT_EQ(state_->batch_ids[3].size(), 3u);
  EXPECT_EQ(state_->batch_ids[0][0], s0(Expected(before)));
  EXPECT_EQ(state_->batch_ids[3][2], s0(Expected(after)));
  testing::ExpectSameEmbedding(*Item("img-before").embedding, Expected(before));
  testing::ExpectSameEmbedding(*Item("img-after").embedding, Expected(after));
}

TEST_P(VideoWorkerTest, CancelDropsQueuedChunksNobodyElseWaitsOn) {
  auto w = Make();
  ASSERT_TRUE(w->Submit(Req("a", {VideoItem(Clip(0, 3))}), c_.For("a")).ok());
  ASSERT_TRUE(w->Submit(Req("b", {VideoItem(Clip(2, 2))}), c_.For("b")).ok());
  Settle(*w);
  ASSERT_EQ(w->stats().pending_items, 4);
  ASSERT_TRUE(w->Cancel("a"));
  EXPECT_EQ(c_.done["a"].status.code(), StatusCode::kCancelled);
  // Chunks 0 and 1 go; 2 stays for b.
  EXPECT_EQ(w->stats().pending_items, 2);
  Drain(*w);
  ASSERT_TRUE(c_.done["b"].all_ok());
  testing::ExpectSameEmbedding(*Item("b").embedding, WantClip(2, 2));
  EXPECT_EQ(w->stats().tower_items, 2u);
}

TEST_P(VideoWorkerTest, BadVideoFailsOnlyItsItem) {
  auto w = Make();
  const std::string img = Png(56, 56, 7);
  EncodeRequest r = Req("r", {VideoItem("not a clip"), testing::Request("x", {img}).items[0]});
  ASSERT_TRUE(w->Submit(std::move(r), c_.For("r")).ok());
  Drain(*w);
  const RequestResult& done = c_.done["r"];
  EXPECT_EQ(done.items[0].status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(done.items[0].status.message().find("not a clip"), std::string::npos);
  ASSERT_TRUE(done.items[1].status.ok());
  testing::ExpectSameEmbedding(*done.items[1].embedding, Expected(img));
  EXPECT_EQ(w->stats().errors.at(StatusCode::kInvalidArgument), 1u);
}

TEST_P(VideoWorkerTest, WrongExpectedTokensFailsTheVideo) {
  auto w = Make();
  EncodeItemInput item = VideoItem(Clip(0, 2));
  item.expected_tokens = 5;
  ASSERT_TRUE(w->Submit(Req("r", {item}), c_.For("r")).ok());
  Settle(*w);
  EXPECT_EQ(Item("r").status.code(), StatusCode::kInvalidArgument);
  item.expected_tokens = 2 * kChunkTokens;
  ASSERT_TRUE(w->Submit(Req("ok", {item}), c_.For("ok")).ok());
  Drain(*w);
  EXPECT_TRUE(c_.done["ok"].all_ok());
}

TEST_P(VideoWorkerTest, TowerWithoutChunkIndependenceEncodesVideosWholeWithoutChunkCaching) {
  FakeTowerOptions t;
  t.temporal_chunks_independent = false;
  auto w = Make(Options(), t);
  ASSERT_TRUE(w->Submit(Req("a", {VideoItem(Clip(0, 3))}), c_.For("a")).ok());
  ASSERT_TRUE(w->Submit(Req("b", {VideoItem(Clip(0, 3))}), c_.For("b")).ok());  // joins a's job
  ASSERT_TRUE(w->Submit(Req("c", {VideoItem(Clip(1, 3))}), c_.For("c")).ok());  // overlaps, shares nothing
  Drain(*w);
  ASSERT_TRUE(c_.done["a"].all_ok()) << Item("a").status.ToString();
  testing::ExpectSameEmbedding(*Item("a").embedding, WantClip(0, 3));
  testing::ExpectSameEmbedding(*Item("b").embedding, WantClip(0, 3));
  testing::ExpectSameEmbedding(*Item("c").embedding, WantClip(1, 3));
  EXPECT_EQ(Item("b").source, ItemSource::kJoined);
  ASSERT_NE(Item("b").video, nullptr);
  // Two tower items, each a whole video of grid (3, 4, 4).
  std::vector<GridTHW> grids;
  for (const auto& batch : state_->batches) grids.insert(grids.end(), batch.begin(), batch.end());
  EXPECT_EQ(grids, (std::vector<GridTHW>{{3, 4, 4}, {3, 4, 4}}));
  WorkerStats s = w->stats();
  EXPECT_EQ(s.chunk_misses + s.chunk_hits + s.chunk_joins, 0u);
  EXPECT_EQ(s.joins, 1u);
  EXPECT_EQ(decodes_.load(), 2);
  // A repeat is a whole-video hit, with its timing, and no decode.
  ASSERT_TRUE(w->Submit(Req("d", {VideoItem(Clip(1, 3))}), c_.For("d")).ok());
  EXPECT_EQ(Item("d").source, ItemSource::kL1);
  ASSERT_NE(Item("d").video, nullptr);
  EXPECT_EQ(Item("d").video->timestamps_s.front(), 1.0);
  EXPECT_EQ(decodes_.load(), 2);
}

TEST_P(VideoWorkerTest, ContainerWithoutDecoderFailsAndFrameListsWork) {
  WorkerOptions o = Options();
  o.decode_video = nullptr;
  // Sampling that keeps 56x56 frames at 56x56 (smart_resize within bounds).
  o.video_sampling.min_pixels = std::int64_t{28} * 28;
  o.video_sampling.max_pixels = std::int64_t{56} * 56;
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Req("c", {VideoItem(Clip(0, 2))}), c_.For("c")).ok());
  EXPECT_EQ(Item("c").status.code(), StatusCode::kFailedPrecondition);

  EncodeItemInput frames;
  frames.video = VideoInput{};
  for (int k = 0; k < 2; ++k) {
    frames.video->frames.push_back(Png(56, 56, k + 1));
    frames.video->frames.push_back(Png(56, 56, k + 1));
  }
  ASSERT_TRUE(w->Submit(Req("f", {frames}), c_.For("f")).ok());
  Drain(*w);
  ASSERT_TRUE(c_.done["f"].all_ok()) << Item("f").status.ToString();
  testing::ExpectSameEmbedding(*Item("f").embedding, WantClip(0, 2));
}

TEST_P(VideoWorkerTest, VideoItemWithImageBytesIsRejected) {
  auto w = Make();
  EncodeItemInput item = VideoItem(Clip(0, 1));
  item.media = Png(56, 56, 1);
  ASSERT_TRUE(w->Submit(Req("r", {item}), c_.For("r")).ok());
  EXPECT_EQ(Item("r").status.code(), StatusCode::kInvalidArgument);
}

TEST_P(VideoWorkerTest, VideoOverTheQueueBoundFailsAloneAndQueuesNothing) {
  WorkerOptions o = Options();
  o.max_pending_items = 4;
  auto w = Make(std::move(o));
  ASSERT_TRUE(w->Submit(Req("a", {VideoItem(Clip(0, 3))}), c_.For("a")).ok());  // 3 chunks queued
  // Submit counts the video as one job (3 + 1 <= 4); its 2 chunks would make 5.
  ASSERT_TRUE(w->Submit(Req("b", {VideoItem(Clip(10, 2))}), c_.For("b")).ok());
  Settle(*w);
  ASSERT_EQ(c_.done.count("b"), 1u);  // failed once decoded, before any batch
  const Status& refused = Item("b").status;
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("2 temporal chunks on top of 3 pending; the limit is 4"), std::string::npos)
      << refused.message();
  // Chunks already queued are joined, not counted: chunks 0-2 are in flight,
  // so a clip of chunks 0-3 adds one (3 + 1 <= 4).
  ASSERT_TRUE(w->Submit(Req("c", {VideoItem(Clip(0, 4))}), c_.For("c")).ok());
  Drain(*w);
  ASSERT_TRUE(c_.done["a"].all_ok());
  ASSERT_TRUE(c_.done["c"].all_ok()) << Item("c").status.ToString();
  testing::ExpectSameEmbedding(*Item("c").embedding, WantClip(0, 4));
  EXPECT_EQ(w->stats().tower_items, 4u);  // chunks 0-3; nothing of "b"
  // With the queue empty, the same video goes through.
  ASSERT_TRUE(w->Submit(Req("b2", {VideoItem(Clip(10, 2))}), c_.For("b2")).ok());
  Drain(*w);
  ASSERT_TRUE(c_.done["b2"].all_ok());
  testing::ExpectSameEmbedding(*Item("b2").embedding, WantClip(10, 2));
}

TEST_P(VideoWorkerTest, VideoWithMoreNewChunksThanTheQueueHoldsIsInvalidAndCachedChunksDoNotCount) {
  WorkerOptions o = Options();
  o.max_pending_items = 2;
  auto w = Make(std::move(o));
  ASSERT_TRUE(w->Submit(Req("long", {VideoItem(Clip(0, 3))}), c_.For("long")).ok());
  Settle(*w);
  const Status& refused = Item("long").status;
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.ToString();
  EXPECT_NE(refused.message().find("3 temporal chunks"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("max_pending_items 2"), std::string::npos) << refused.message();
  EXPECT_FALSE(w->HasQueuedWork());
  // Once its first chunk is cached, the same clip has 2 new chunks: it fits.
  ASSERT_TRUE(w->Submit(Req("first", {VideoItem(Clip(0, 1))}), c_.For("first")).ok());
  Drain(*w);
  ASSERT_TRUE(w->Submit(Req("again", {VideoItem(Clip(0, 3))}), c_.For("again")).ok());
  Drain(*w);
  ASSERT_TRUE(c_.done["again"].all_ok()) << Item("again").status.ToString();
  testing::ExpectSameEmbedding(*Item("again").embedding, WantClip(0, 3));
  EXPECT_EQ(w->stats().tower_items, 3u);
}

// Issue 26: each chunk's cost carries an equal share of its container's
// decode (held here for 150 ms), and the whole video, assembled from its
// chunks, is cached with their sum: what its whole-video hit saves.
TEST_P(VideoWorkerTest, ChunksCarryAShareOfTheDecodeAndTheWholeVideoTheirSum) {
  WorkerOptions o = Options();
  o.decode_video = [this](std::span<const std::uint8_t> b, const VideoSampling&, const PreprocessConfig& cfg,
                          const VideoLimits&, const std::stop_token&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    return FakeDecode(b, cfg, &decodes_);
  };
  auto w = Make(o);
  ASSERT_TRUE(w->Submit(Req("v", {VideoItem(Clip(0, 3))}), c_.For("v")).ok());
  Drain(*w);
  ASSERT_TRUE(c_.done["v"].all_ok());
  const WorkerStats m = w->stats();
  // Three chunk entries: the decode once (in thirds), their preprocessing
  // and the tower time.
  EXPECT_GE(m.miss_seconds - m.tower_seconds, 0.15);
  EXPECT_LT(m.miss_seconds - m.tower_seconds, 0.15 + 0.25) << "three 56x56 chunk preprocessings";
  // The assembled video reports the cost it is cached with: its chunks' sum.
  EXPECT_NEAR(c_.done["v"].items[0].encode_seconds, m.miss_seconds, 1e-9);
  ASSERT_TRUE(w->Submit(Req("again", {VideoItem(Clip(0, 3))}), c_.For("again")).ok());
  EXPECT_EQ(Item("again").source, ItemSource::kL1);
  EXPECT_EQ(Item("again").encode_seconds, -1);  // a hit ran nothing
  EXPECT_NEAR(w->stats().hit_seconds_l1, m.miss_seconds, 1e-9);
  // A clip of its first two chunks (decoded again): two chunk hits, each
  // worth a third of the first decode at least.
  ASSERT_TRUE(w->Submit(Req("two", {VideoItem(Clip(0, 2))}), c_.For("two")).ok());
  Drain(*w);
  EXPECT_EQ(w->stats().chunk_hits, 2u);
  EXPECT_GE(w->stats().hit_seconds_l1 - m.miss_seconds, 2 * 0.05);
}

INSTANTIATE_TEST_SUITE_P(DecodeThreads, VideoWorkerTest, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& p) { return "helpers" + std::to_string(p.param); });

}  // namespace
}  // namespace epd
