#include "epd/core/encode_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "epd/core/status.h"
#include "test_names.h"

namespace epd {
namespace {

using test_util::Name;

std::vector<std::string> Ids(const std::vector<PendingEncodeItem>& batch) {
  std::vector<std::string> out;
  out.reserve(batch.size());
  for (const auto& it : batch) out.push_back(it.request_id + "/" + std::to_string(it.item_index));
  return out;
}

class SchedulerOrderTest : public ::testing::TestWithParam<ScheduleOrder> {};
// kFair with every item in one tenant ("") is kFifo, so it meets the same
// contract.
INSTANTIATE_TEST_SUITE_P(EveryOrder, SchedulerOrderTest,
                         ::testing::Values(ScheduleOrder::kByKey, ScheduleOrder::kFifo, ScheduleOrder::kFair));

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
      s.Add({Name("r", static_cast<long long>((st >> 40) % 50)), static_cast<std::int64_t>((st >> 20) % 4),
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

// ---------------------------------------------------------------- kFair ---

PendingEncodeItem Item(std::string tenant, std::string id, std::int64_t index, std::int64_t cost,
                       std::int64_t share_cost = 0) {
  PendingEncodeItem p{std::move(id), index, cost};
  p.tenant = std::move(tenant);
  p.share_cost = share_cost;
  return p;
}

// Issue 15, item 7: one tenant queues a long run of expensive items first;
// FIFO serves them all before the other tenant's first item.
TEST(EncodeSchedulerFairTest, LateTenantIsServedInTheNextBatchNotAfterTheRun) {
  // By hand, budget 1000 tokens / 4 items. "heavy" queues six items of 500:
  // tags [start, finish) = [0,500) [500,1000) [1000,1500) [1500,2000)
  // [2000,2500) [2500,3000). Batch 1 (finish order) = h0 + h1 = 1000 tokens;
  // V becomes h1's start, 500. "light" then queues three items of 100:
  // start = max(V, 0) = 500, so [500,600) [600,700) [700,800). Pending by
  // finish: l0 600, l1 700, l2 800, h2 1500, h3 2000, ... Batch 2 = l0 l1 l2
  // (300 tokens) + h2 (800 tokens, 4 items); the rest is heavy's.
  EncodeScheduler s(1000, 4, ScheduleOrder::kFair);
  for (int i = 0; i < 6; ++i) s.Add(Item("heavy", "h", i, 500));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("h/0", "h/1"));
  for (int i = 0; i < 3; ++i) s.Add(Item("light", "l", i, 100));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("l/0", "l/1", "l/2", "h/2"));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("h/3", "h/4"));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("h/5"));
  EXPECT_TRUE(s.NextBatch().empty());

  // The same calls in FIFO order: light waits behind the whole run.
  EncodeScheduler fifo(1000, 4, ScheduleOrder::kFifo);
  for (int i = 0; i < 6; ++i) fifo.Add(Item("heavy", "h", i, 500));
  fifo.NextBatch();
  for (int i = 0; i < 3; ++i) fifo.Add(Item("light", "l", i, 100));
  EXPECT_THAT(Ids(fifo.NextBatch()), ::testing::ElementsAre("h/2", "h/3"));
  EXPECT_THAT(Ids(fifo.NextBatch()), ::testing::ElementsAre("h/4", "h/5"));
  EXPECT_THAT(Ids(fifo.NextBatch()), ::testing::ElementsAre("l/0", "l/1", "l/2"));
}

// The share cost (tokens + decoded pixels in the worker), not the token
// count, decides the share: "png" items cost few tokens but a large decode.
TEST(EncodeSchedulerFairTest, ShareCostWeighsTheTenants) {
  // By hand, 2 items a batch. png: share 1000 each, tags finish 1000, 2000,
  // 3000; jpg (added after): share 10, finish 10, 20, 30. Finish order:
  // j0 j1 | j2 p0 | p1 p2.
  EncodeScheduler s(1 << 20, 2, ScheduleOrder::kFair);
  for (int i = 0; i < 3; ++i) s.Add(Item("png", "p", i, 10, 1000));
  for (int i = 0; i < 3; ++i) s.Add(Item("jpg", "j", i, 10, 10));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("j/0", "j/1"));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("j/2", "p/0"));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("p/1", "p/2"));

  // Charged by tokens alone (share_cost 0 = cost 10) the tags tie (10, 20,
  // 30 each) and arrival breaks the ties: p0 j0 | p1 j1 | p2 j2.
  EncodeScheduler by_tokens(1 << 20, 2, ScheduleOrder::kFair);
  for (int i = 0; i < 3; ++i) by_tokens.Add(Item("png", "p", i, 10));
  for (int i = 0; i < 3; ++i) by_tokens.Add(Item("jpg", "j", i, 10));
  EXPECT_THAT(Ids(by_tokens.NextBatch()), ::testing::ElementsAre("p/0", "j/0"));
  EXPECT_THAT(Ids(by_tokens.NextBatch()), ::testing::ElementsAre("p/1", "j/1"));
  EXPECT_THAT(Ids(by_tokens.NextBatch()), ::testing::ElementsAre("p/2", "j/2"));
}

TEST(EncodeSchedulerFairTest, RemovedItemsAreNotRefundedAndReAddKeepsTheTags) {
  // a: [0,100) [100,200); b: [0,50). Removing a0 leaves a1's tag at 200.
  EncodeScheduler s(1 << 20, 1, ScheduleOrder::kFair);
  s.Add(Item("a", "a", 0, 100));
  s.Add(Item("a", "a", 1, 100));
  s.Add(Item("b", "b", 0, 50));
  EXPECT_TRUE(s.Remove({"a", 0}));
  // A re-add with another tenant and cost keeps the tag (200) and tenant a.
  s.Add(Item("b", "a", 1, 1));
  s.Add(Item("b", "b", 1, 100));  // b: [50,150)
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("b/0"));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("b/1"));
  const std::vector<PendingEncodeItem> last = s.NextBatch();
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].tenant, "a");
  EXPECT_EQ(last[0].cost, 1);
}

TEST(EncodeSchedulerFairTest, ShareBoundKeepsAnExpensiveItemOutOfACheapBatch) {
  // By hand: tokens budget 1000, share budget 100. cheap: cost 10, share 20
  // (finish 20, 40); dear: cost 10, share 5000 (finish 5000), queued between
  // them by arrival but last by tag. Batch 1 = c0 c1 (share 40); dear alone
  // next (over the share bound, but first in its batch).
  EncodeScheduler s(1000, 8, ScheduleOrder::kFair, /*max_share_per_batch=*/100);
  s.Add(Item("cheap", "c", 0, 10, 20));
  s.Add(Item("dear", "d", 0, 10, 5000));
  s.Add(Item("cheap", "c", 1, 10, 20));
  s.Add(Item("cheap2", "e", 0, 10, 50));  // finish 50: fits (40 + 50 <= 100)
  s.Add(Item("cheap2", "e", 1, 10, 50));  // finish 100: would make 140
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("c/0", "c/1", "e/0"));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("e/1"));
  EXPECT_THAT(Ids(s.NextBatch()), ::testing::ElementsAre("d/0"));
  EXPECT_THROW(EncodeScheduler(10, 2, ScheduleOrder::kFair, -1), Error);
}

TEST(EncodeSchedulerFairTest, RejectsNegativeShareCost) {
  EncodeScheduler s(10, 2, ScheduleOrder::kFair);
  EXPECT_THROW(s.Add(Item("t", "r", 0, 1, -1)), Error);
  EXPECT_EQ(s.pending_size(), 0u);
}

TEST(EncodeSchedulerFairTest, PeekBatchIsTheNextBatchWithoutPopping) {
  EncodeScheduler s(300, 3, ScheduleOrder::kFair);
  for (int i = 0; i < 4; ++i) s.Add(Item("a", "a", i, 100));
  s.Add(Item("b", "b", 0, 100));
  const std::vector<EncodeScheduler::Key> peeked = s.PeekBatch();
  EXPECT_EQ(s.pending_size(), 5u);
  std::vector<EncodeScheduler::Key> popped;
  for (const PendingEncodeItem& p : s.NextBatch()) popped.push_back(p.key());
  EXPECT_EQ(peeked, popped);
  // a0 [0,100) b0 [0,100) a1 [100,200): ties by arrival.
  EXPECT_THAT(popped, ::testing::ElementsAre(EncodeScheduler::Key{"a", 0}, EncodeScheduler::Key{"b", 0},
                                             EncodeScheduler::Key{"a", 1}));
}

// An independent model of start-time fair queueing: every tenant is
// remembered until the queue empties, tags are recomputed from the written
// rule, and each batch is picked by scanning all pending items. The
// scheduler forgets idle tenants early; this checks that doing so never
// changes a tag, and that batches follow only the call sequence.
struct FairModel {
  struct P {
    PendingEncodeItem item;
    long long start, finish;
    std::uint64_t seq;
  };
  std::int64_t max_tokens = 0, max_items = 0;
  std::vector<P> pending{};
  std::map<std::string, long long> finish{};
  long long v = 0;
  std::uint64_t seq = 0;

  void Add(const PendingEncodeItem& p) {
    for (P& q : pending) {
      if (q.item.key() == p.key()) {
        q.item.cost = p.cost;
        return;
      }
    }
    const long long start = std::max(v, finish[p.tenant]);
    const long long share = p.share_cost > 0 ? p.share_cost : std::max<std::int64_t>(p.cost, 1);
    finish[p.tenant] = start + share;
    pending.push_back({p, start, start + share, seq++});
  }
  void Remove(const EncodeScheduler::Key& k) {
    std::erase_if(pending, [&](const P& q) { return q.item.key() == k; });
    if (pending.empty()) Reset();
  }
  void Reset() {
    finish.clear();
    v = 0;
  }
  std::vector<EncodeScheduler::Key> Next() {
    std::sort(pending.begin(), pending.end(),
              [](const P& a, const P& b) { return std::tie(a.finish, a.seq) < std::tie(b.finish, b.seq); });
    std::vector<EncodeScheduler::Key> out;
    std::int64_t used = 0;
    std::size_t n = 0;
    for (; n < pending.size(); ++n) {
      const std::int64_t c = pending[n].item.cost;
      if (!out.empty() && (used + c > max_tokens || static_cast<std::int64_t>(out.size()) >= max_items)) break;
      used += c;
      v = std::max(v, pending[n].start);
      out.push_back(pending[n].item.key());
    }
    pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(n));
    if (pending.empty()) Reset();
    return out;
  }
};

TEST(EncodeSchedulerFairTest, MatchesAnIndependentModelOnRandomCallSequences) {
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    EncodeScheduler s(600, 5, ScheduleOrder::kFair);
    EncodeScheduler again(600, 5, ScheduleOrder::kFair);
    FairModel model;
    model.max_tokens = 600;
    model.max_items = 5;
    for (int step = 0; step < 400; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (op < 6) {
        PendingEncodeItem p = Item("t" + std::to_string(rng() % 5), "r" + std::to_string(rng() % 40),
                                   static_cast<std::int64_t>(rng() % 3), static_cast<std::int64_t>(rng() % 400),
                                   (rng() % 2) ? static_cast<std::int64_t>(rng() % 5000) : 0);
        s.Add(p);
        again.Add(p);
        model.Add(p);
      } else if (op < 7) {
        const EncodeScheduler::Key k{"r" + std::to_string(rng() % 40), static_cast<std::int64_t>(rng() % 3)};
        EXPECT_EQ(s.Remove(k), again.Remove(k));
        model.Remove(k);
      } else {
        std::vector<EncodeScheduler::Key> got;
        for (const PendingEncodeItem& p : s.NextBatch()) got.push_back(p.key());
        std::vector<EncodeScheduler::Key> got_again;
        for (const PendingEncodeItem& p : again.NextBatch()) got_again.push_back(p.key());
        ASSERT_EQ(got, model.Next()) << "seed " << seed << " step " << step;
        ASSERT_EQ(got, got_again);
      }
      ASSERT_EQ(s.pending_size(), model.pending.size());
    }
  }
}

TEST(EncodeSchedulerFairTest, OneTenantIsFifo) {
  std::mt19937 rng(7);
  EncodeScheduler fair(500, 4, ScheduleOrder::kFair);
  EncodeScheduler fifo(500, 4, ScheduleOrder::kFifo);
  for (int step = 0; step < 500; ++step) {
    if (rng() % 3 != 0) {
      PendingEncodeItem p = Item("only", "r" + std::to_string(rng() % 60), 0, static_cast<std::int64_t>(rng() % 300),
                                 static_cast<std::int64_t>(rng() % 900));
      fair.Add(p);
      fifo.Add(p);
    } else {
      ASSERT_EQ(fair.NextBatch(), fifo.NextBatch());
    }
  }
}

}  // namespace
}  // namespace epd
