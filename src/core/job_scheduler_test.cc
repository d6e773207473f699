// JobScheduler's own surface (epd/core/job_scheduler.h): the by-key rank's
// field order, NextBatchClosed and Find. The packing rule and the orders are
// covered through EncodeScheduler (encode_scheduler_test.cc), which is a thin
// adapter over it.
#include "epd/core/job_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace epd {
namespace {

using ::testing::ElementsAre;

std::vector<JobScheduler::Id> Ids(const std::vector<ScheduledJob>& batch) {
  std::vector<JobScheduler::Id> ids;
  ids.reserve(batch.size());
  for (const ScheduledJob& j : batch) ids.push_back(j.id);
  return ids;
}

TEST(JobSchedulerTest, ByKeyOrdersByRequestIdThenSubmissionThenItemThenPart) {
  JobScheduler s(1000, 10, ScheduleOrder::kByKey);
  // Added out of order; the expected order is written out by hand.
  s.Add({.id = 1, .cost = 1, .by_key = {"b", 1, 0, 0}});
  s.Add({.id = 2, .cost = 1, .by_key = {"a", 2, 0, 0}});
  s.Add({.id = 3, .cost = 1, .by_key = {"a", 1, 1, 0}});
  s.Add({.id = 4, .cost = 1, .by_key = {"a", 1, 0, 2}});
  s.Add({.id = 5, .cost = 1, .by_key = {"a", 1, 0, 1}});
  s.Add({.id = 6, .cost = 1, .by_key = {std::string("a\0", 2), 0, 0, 0}});  // longer id: after "a"
  EXPECT_THAT(Ids(s.NextBatch()), ElementsAre(5, 4, 3, 2, 6, 1));
}

TEST(JobSchedulerTest, FifoBatchIsClosedWhenItStopsBeforeTheLastJobOrIsFull) {
  JobScheduler s(10, 2, ScheduleOrder::kFifo);
  s.Add({.id = 1, .cost = 4});
  EXPECT_FALSE(s.NextBatchClosed());  // a later job of cost <= 6 would join it
  s.Add({.id = 2, .cost = 7});
  EXPECT_TRUE(s.NextBatchClosed());  // job 2 does not fit: the batch is {1}
  EXPECT_THAT(Ids(s.NextBatch()), ElementsAre(1));
  s.Add({.id = 3, .cost = 1});
  EXPECT_TRUE(s.NextBatchClosed());  // {2, 3} holds max_items_per_batch jobs
  EXPECT_THAT(Ids(s.NextBatch()), ElementsAre(2, 3));
  EXPECT_FALSE(s.NextBatchClosed());  // nothing pending
}

TEST(JobSchedulerTest, BatchIsNeverClosedUnderOrdersWhereALaterJobMaySortFirst) {
  for (ScheduleOrder order : {ScheduleOrder::kByKey, ScheduleOrder::kFair}) {
    JobScheduler s(10, 1, order);
    s.Add({.id = 1, .cost = 4});
    s.Add({.id = 2, .cost = 4});
    EXPECT_FALSE(s.NextBatchClosed());
  }
}

TEST(JobSchedulerTest, FindGivesThePendingJobUntilItLeaves) {
  JobScheduler s(10, 4);
  s.Add({.id = 7, .cost = 3, .tenant = "t", .by_key = {"r", 1, 2, 3}});
  ASSERT_NE(s.Find(7), nullptr);
  EXPECT_EQ(s.Find(7)->by_key, (ByKeyRank{"r", 1, 2, 3}));
  EXPECT_EQ(s.Find(7)->tenant, "t");
  EXPECT_EQ(s.Find(8), nullptr);
  EXPECT_TRUE(s.Remove(7));
  EXPECT_EQ(s.Find(7), nullptr);
  EXPECT_FALSE(s.Contains(7));
}

TEST(JobSchedulerTest, EachOrderHasOneNameThatParsesBack) {
  EXPECT_EQ(ScheduleOrderName(ScheduleOrder::kByKey), "by_key");
  EXPECT_EQ(ScheduleOrderName(ScheduleOrder::kFifo), "fifo");
  EXPECT_EQ(ScheduleOrderName(ScheduleOrder::kFair), "fair");
  for (ScheduleOrder o : {ScheduleOrder::kByKey, ScheduleOrder::kFifo, ScheduleOrder::kFair}) {
    StatusOr<ScheduleOrder> back = ParseScheduleOrder(ScheduleOrderName(o));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, o);
  }
  const StatusOr<ScheduleOrder> bad = ParseScheduleOrder("lifo");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "schedule order must be 'by_key', 'fifo' or 'fair', got 'lifo'");
}

}  // namespace
}  // namespace epd
