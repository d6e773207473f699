// The worker under ScheduleOrder::kFair (issue 15, item 7): one tenant's
// expensive misses queued first do not hold another tenant's misses back
// for more than about one share, and the batches follow only the calls.
#include <gtest/gtest.h>

#include <thread>

#include "epd/worker/encode_worker.h"
#include "worker_test_util.h"

namespace epd {
namespace {

using testing::Collector;
using testing::Png;
using testing::Request;

// Under the default config (factor 28): a 112x112 image is grid 1x8x8, 16
// post-merge tokens, and 112*112 / 28^2 = 16 pixel units, so share cost 32;
// a 56x56 image is grid 1x4x4, 4 tokens + 4 units = share cost 8.
const GridTHW kHeavyGrid{1, 8, 8};
const GridTHW kLightGrid{1, 4, 4};

// 0, 1 and 2 decode helpers: with helpers a batch starts only once decoded,
// which may take several Steps, but the batches must be the same.
class FairWorkerTest : public ::testing::TestWithParam<int>, protected testing::WorkerRig {
 protected:
  std::unique_ptr<EncodeWorker> Make(ScheduleOrder order) {
    WorkerOptions o = Options(GetParam());
    o.order = order;
    o.preprocess = preprocess_;
    o.max_items_per_batch = 2;
    o.max_tokens_per_batch = 1 << 20;
    return WorkerRig::Make(std::move(o));
  }

  // Runs one tower batch, however many Steps the decode gate takes.
  static void OneBatch(EncodeWorker& w) {
    while (w.Step() == 0) std::this_thread::yield();
  }

  EncodeRequest Tenant(std::string tenant, std::string id, std::vector<std::string> media) {
    EncodeRequest r = Request(std::move(id), std::move(media));
    r.tenant = std::move(tenant);
    return r;
  }

  // The heavy tenant queues six 112x112 misses; one batch runs; then the
  // light tenant queues two 56x56 misses; the rest drains. Returns the grids
  // of every tower batch.
  std::vector<std::vector<GridTHW>> HeavyThenLight(ScheduleOrder order) {
    auto w = Make(order);
    std::vector<std::string> heavy;
    heavy.reserve(6);
    for (int i = 0; i < 6; ++i) heavy.push_back(Png(112, 112, 10 + i));
    EXPECT_TRUE(w->Submit(Tenant("10.0.0.1", "h", heavy), c_.For("h")).ok());
    OneBatch(*w);
    EXPECT_TRUE(w->Submit(Tenant("10.0.0.2", "l", {Png(56, 56, 1), Png(56, 56, 2)}), c_.For("l")).ok());
    while (w->HasQueuedWork()) OneBatch(*w);
    EXPECT_TRUE(c_.done["h"].all_ok());
    EXPECT_TRUE(c_.done["l"].all_ok());
    return state_->batches;
  }

  PreprocessConfig preprocess_;
};
INSTANTIATE_TEST_SUITE_P(DecodeThreads, FairWorkerTest, ::testing::Values(0, 1, 2));

TEST_P(FairWorkerTest, LateTenantRunsInTheNextBatch) {
  // By hand (share costs above, V = start tag of the last item served):
  // heavy's tags finish at 32, 64, 96, ..., 192. Batch 1 = h0 h1; V = 32.
  // light: start max(32, 0) = 32, finish 40 and 48, ahead of h2 (96).
  const std::vector<std::vector<GridTHW>> batches = HeavyThenLight(ScheduleOrder::kFair);
  ASSERT_EQ(batches.size(), 4u);
  EXPECT_EQ(batches[0], (std::vector<GridTHW>{kHeavyGrid, kHeavyGrid}));
  EXPECT_EQ(batches[1], (std::vector<GridTHW>{kLightGrid, kLightGrid}));
  EXPECT_EQ(batches[2], (std::vector<GridTHW>{kHeavyGrid, kHeavyGrid}));
  EXPECT_EQ(batches[3], (std::vector<GridTHW>{kHeavyGrid, kHeavyGrid}));
}

TEST_P(FairWorkerTest, FifoServesTheLateTenantLast) {
  const std::vector<std::vector<GridTHW>> batches = HeavyThenLight(ScheduleOrder::kFifo);
  ASSERT_EQ(batches.size(), 4u);
  EXPECT_EQ(batches[3], (std::vector<GridTHW>{kLightGrid, kLightGrid}));
}

TEST_P(FairWorkerTest, DecodedPixelsWeighTheShareNotOnlyTokens) {
  // With max_pixels 112*112, a stored 224x224 image is resized to 112x112:
  // 16 tokens, but 224*224 / 784 = 64 pixel units to decode, share 80. A
  // 112x84 image stays: grid 1x6x8, 12 tokens + 12 units, share 24.
  // "big" queues three 224x224, then "small" three 112x84. By share the tags
  // are big 80, 160, 240 and small 24, 48, 72: s s | s b | b b. By tokens
  // alone they would be big 16, 32, 48 and small 12, 24, 36: s b | s b | s b.
  preprocess_.max_pixels = std::int64_t{112} * 112;
  auto w = Make(ScheduleOrder::kFair);
  const std::vector<std::string> big = {Png(224, 224, 1), Png(224, 224, 2), Png(224, 224, 3)};
  ASSERT_TRUE(w->Submit(Tenant("big", "b", big), c_.For("b")).ok());
  ASSERT_TRUE(w->Submit(Tenant("small", "s", {Png(112, 84, 4), Png(112, 84, 5), Png(112, 84, 6)}), c_.For("s")).ok());
  while (w->HasQueuedWork()) OneBatch(*w);
  const GridTHW b{1, 8, 8}, s{1, 6, 8};
  ASSERT_EQ(state_->batches.size(), 3u);
  EXPECT_EQ(state_->batches[0], (std::vector<GridTHW>{s, s}));
  EXPECT_EQ(state_->batches[1], (std::vector<GridTHW>{s, b}));
  EXPECT_EQ(state_->batches[2], (std::vector<GridTHW>{b, b}));
  EXPECT_TRUE(c_.done["b"].all_ok());
  EXPECT_TRUE(c_.done["s"].all_ok());
}

TEST_P(FairWorkerTest, SameCallsGiveSameBatches) {
  const std::vector<std::vector<GridTHW>> first = HeavyThenLight(ScheduleOrder::kFair);
  c_ = Collector();
  EXPECT_EQ(HeavyThenLight(ScheduleOrder::kFair), first);
}

}  // namespace
}  // namespace epd
