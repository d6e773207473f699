#include "epd/encode_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "epd/status.h"
#include "test_names.h"

namespace epd {
namespace {

using test_util::Name;


std::vector<std::string> Ids(const std::vector<PendingEncodeItem>& batch) {
  std::vector<std::string> out;
  for (const auto& it : batch) out.push_back(it.request_id + "/" + std::to_string(it.item_index));
  return out;
}

class SchedulerOrderTest : public ::testing::TestWithParam<ScheduleOrder> {};
INSTANTIATE_TEST_SUITE_P(BothOrders, SchedulerOrderTest,
                         ::testing::Values(ScheduleOrder::kByKey, ScheduleOrder::kFifo));

TEST_P(SchedulerOrderTest, RejectsNonPositiveBoundsNamingTheArgument) {
  try {
    EncodeScheduler s(0, 4, GetParam());
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("max_tokens_per_batch must be > 0, got 0"));
  }
  try {
    EncodeScheduler s(10, -1, GetParam());
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("max_items_per_batch must be > 0, got -1"));
  }
}

// Regression case from the issue.
TEST_P(SchedulerOrderTest, OversizedItemIsReturnedAlone) {
  EncodeScheduler s(1000, 4, GetParam());
  s.Add({"big", 0, 1200});
  s.Add({"small", 0, 100});
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("big/0"));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("small/0"));
  EXPECT_TRUE(s.NextBatch().empty());
  EXPECT_EQ(s.pending_size(), 0u);
}

TEST_P(SchedulerOrderTest, NeverReturnsEmptyWhilePending) {
  EncodeScheduler s(50, 2, GetParam());
  for (int i = 0; i < 37; ++i) s.Add({"r", i, (i * 13) % 70});
  std::size_t seen = 0;
  while (s.pending_size() > 0) {
    auto b = s.NextBatch();
    ASSERT_FALSE(b.empty());
    seen += b.size();
  }
  EXPECT_EQ(seen, 37u);
}

TEST_P(SchedulerOrderTest, GreedyStopsAtTheFirstItemThatDoesNotFit) {
  EncodeScheduler s(100, 10, GetParam());
  s.Add({"a", 0, 60});
  s.Add({"a", 1, 50});  // would overflow: ends the batch even though a/2 fits
  s.Add({"a", 2, 10});
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("a/0"));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("a/1", "a/2"));
}

TEST_P(SchedulerOrderTest, ItemCountBoundsTheBatch) {
  EncodeScheduler s(1000, 2, GetParam());
  for (int i = 0; i < 5; ++i) s.Add({"a", i, 1});
  EXPECT_EQ(s.NextBatch().size(), 2u);
  EXPECT_EQ(s.NextBatch().size(), 2u);
  EXPECT_EQ(s.NextBatch().size(), 1u);
}

// Regression: the running token sum wrapped for huge costs and admitted them
// together. (A pending total past 2^63 - 1 is refused: cache_robustness_test.)
TEST_P(SchedulerOrderTest, HugeCostsDoNotOverflowTheBudgetCheck) {
  EncodeScheduler s(10, 16, GetParam());
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  s.Add({"a", 0, 1000});
  s.Add({"a", 1, max - 2000});
  s.Add({"a", 2, 1000});
  EXPECT_EQ(s.pending_tokens(), max);
  EXPECT_EQ(s.NextBatch().size(), 1u);
  EXPECT_EQ(s.NextBatch().size(), 1u);
  EXPECT_EQ(s.NextBatch().size(), 1u);
  EXPECT_EQ(s.pending_size(), 0u);
}

TEST_P(SchedulerOrderTest, ExactBudgetFits) {
  EncodeScheduler s(100, 10, GetParam());
  s.Add({"a", 0, 40});
  s.Add({"a", 1, 60});
  EXPECT_EQ(s.NextBatch().size(), 2u);
}

TEST_P(SchedulerOrderTest, ReAddOverwritesTheItem) {
  EncodeScheduler s(1000, 10, GetParam());
  s.Add({"a", 0, 10});
  s.Add({"a", 0, 30});
  EXPECT_EQ(s.pending_size(), 1u);
  EXPECT_EQ(s.pending_tokens(), 30);
  auto b = s.NextBatch();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].cost, 30);
}

TEST_P(SchedulerOrderTest, RemoveDropsOnlyThatItem) {
  EncodeScheduler s(1000, 10, GetParam());
  s.Add({"a", 0, 10});
  s.Add({"b", 0, 10});
  EXPECT_TRUE(s.Remove({"a", 0}));
  EXPECT_FALSE(s.Remove({"a", 0}));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("b/0"));
}

TEST_P(SchedulerOrderTest, SameAddSequenceGivesSameBatches) {
  auto run = [](ScheduleOrder order) {
    EncodeScheduler s(300, 5, order);
    std::vector<std::vector<std::string>> out;
    std::uint64_t st = 7;
    for (int i = 0; i < 500; ++i) {
      st = st * 6364136223846793005ull + 1;
      s.Add({Name("r", (st >> 40) % 50), static_cast<std::int64_t>((st >> 20) % 4),
             static_cast<std::int64_t>((st >> 8) % 200)});
      if (i % 7 == 0) out.push_back(Ids(s.NextBatch()));
    }
    while (s.pending_size()) out.push_back(Ids(s.NextBatch()));
    return out;
  };
  EXPECT_EQ(run(GetParam()), run(GetParam()));
}

TEST(EncodeSchedulerTest, ByKeyOrdersByRequestIdThenIndex) {
  EncodeScheduler s(1000, 10, ScheduleOrder::kByKey);
  s.Add({"b", 1, 1});
  s.Add({"a", 2, 1});
  s.Add({"b", 0, 1});
  s.Add({"a", 10, 1});
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("a/2", "a/10", "b/0", "b/1"));
}

TEST(EncodeSchedulerTest, FifoKeepsFirstArrivalPositionOnReAdd) {
  EncodeScheduler s(1000, 10, ScheduleOrder::kFifo);
  s.Add({"z", 0, 1});
  s.Add({"a", 0, 1});
  s.Add({"z", 0, 5});  // overwrite, keeps its place ahead of a
  auto b = s.NextBatch();
  EXPECT_THAT(Ids(b), ::testing::ElementsAre("z/0", "a/0"));
  EXPECT_EQ(b[0].cost, 5);
}

// Each step one new request arrives whose id sorts before "zzz", and the
// budget admits one item per batch. Returns the step at which "zzz" ran, or -1.
int StepWhenLateIdRuns(ScheduleOrder order, int steps) {
  EncodeScheduler s(100, 1, order);
  s.Add({"zzz", 0, 100});
  for (int step = 0; step < steps; ++step) {
    s.Add({Name("a", 1000000 + step), 0, 100});
    for (const auto& it : s.NextBatch())
      if (it.request_id == "zzz") return step;
  }
  return -1;
}

TEST(EncodeSchedulerTest, ByKeyStarvesLateSortingIdUnderSteadyArrivals) {
  EXPECT_EQ(StepWhenLateIdRuns(ScheduleOrder::kByKey, 1000), -1);
}

TEST(EncodeSchedulerTest, FifoBoundsTheWaitUnderSteadyArrivals) {
  // zzz arrived first, so it runs in the first batch.
  EXPECT_EQ(StepWhenLateIdRuns(ScheduleOrder::kFifo, 1000), 0);
}

TEST(EncodeSchedulerTest, FifoWaitIsBoundedByWorkQueuedAhead) {
  // With k items queued ahead and one item per batch, an item runs within k+1 batches.
  EncodeScheduler s(100, 1, ScheduleOrder::kFifo);
  for (int i = 0; i < 20; ++i) s.Add({Name("a", i), 0, 100});
  s.Add({"zzz", 0, 100});
  int batches = 0;
  for (bool done = false; !done;) {
    s.Add({Name("b", batches), 0, 100});  // steady arrivals
    ++batches;
    for (const auto& it : s.NextBatch()) done |= it.request_id == "zzz";
  }
  EXPECT_EQ(batches, 21);
}

}  // namespace
}  // namespace epd
