// WorkerCache (worker_cache.h) on its own: the L2-only rule and the count of
// references a hit adds under GDSF. Expected values follow from the rule in
// epd/core/tiered_cache.h (a put is one reference, each hit one more), worked
// out by hand for each step below.
#include "worker_cache.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <memory>

#include "fake_tower.h"

namespace epd::internal {
namespace {

using epd::testing::FakeTower;

class WorkerCacheTest : public ::testing::Test {
 protected:
  // The fake tower's rows: 8 main columns and 2 deepstack layers of float32,
  // so 96 bytes per post-merge token.
  EmbeddingPtr Rows(std::int64_t tokens) const {
    auto e = std::make_shared<Embedding>();
    static_cast<EmbeddingShape&>(*e) = tower_.OutputShape(tokens);
    e->main.resize(e->main_bytes());
    e->deepstack.resize(e->deepstack_bytes());
    return e;
  }
  static ContentKey Key(std::uint8_t tag) {
    ContentKey k{};
    k.bytes[0] = tag;
    return k;
  }

  FakeTower tower_;
  WorkerStats stats_;
};

// One L2 hit is one reference, whether or not an entry too big for L1 has
// been placed in L2. (An earlier get re-put an L2 entry with its frequency
// plus one before the promotion added one more, once any entry had been
// placed straight into L2: a single hit counted twice.)
TEST_F(WorkerCacheTest, OneL2HitAddsOneReferenceUnderGdsf) {
  WorkerOptions o;
  o.eviction = EvictionPolicy::kGdsf;
  o.l1_capacity_bytes = 500;  // one 4-token entry (384 bytes); a 6-token one (576) is L2-only
  o.l2_capacity_bytes = 10'000;
  WorkerCache cache(o, tower_, stats_);
  const ContentKey a = Key(1), b = Key(2), big = Key(3);
  cache.PutEncoded(a, Rows(4), EntryCost{0.010});
  cache.PutEncoded(b, Rows(4), EntryCost{0.020});  // L1 holds one: a is demoted with frequency 1
  cache.PutEncoded(big, Rows(6), EntryCost{0.030});
  ASSERT_EQ(cache.CostOf(a)->frequency, 1u);
  ASSERT_EQ(cache.CostOf(big)->frequency, 1u);

  std::optional<WorkerCache::Hit> hit = cache.Lookup(a, 4);  // promoted into L1: 1 + 1
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->source, ItemSource::kL2);
  EXPECT_EQ(cache.CostOf(a)->frequency, 2u);

  hit = cache.Lookup(big, 6);  // served from L2 and kept there: 1 + 1
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->source, ItemSource::kL2);
  EXPECT_EQ(cache.CostOf(big)->frequency, 2u);
  hit = cache.Lookup(big, 6);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(cache.CostOf(big)->frequency, 3u);

  WorkerStats s;
  cache.Report(s);
  EXPECT_EQ(s.promotions, 1u);            // a's; the big entry is never promoted
  EXPECT_EQ(s.l2_used_bytes, 384 + 576);  // b (demoted by a's promotion) and the big entry
  EXPECT_EQ(s.l1_used_bytes, 384);
  EXPECT_EQ(stats_.hit_bytes_l2, 384u + 2 * 576u);
  EXPECT_DOUBLE_EQ(stats_.hit_seconds_l2, 0.010 + 2 * 0.030);
}

// The same L2-only entry under LRU: served from L2 on every repeat, never lost.
TEST_F(WorkerCacheTest, L2OnlyEntryIsServedFromL2UnderLru) {
  WorkerOptions o;
  o.l1_capacity_bytes = 500;
  o.l2_capacity_bytes = 10'000;
  WorkerCache cache(o, tower_, stats_);
  const ContentKey big = Key(3);
  cache.PutEncoded(big, Rows(6), EntryCost{0.030});
  for (int i = 0; i < 3; ++i) {
    std::optional<WorkerCache::Hit> hit = cache.Lookup(big, 6);
    ASSERT_TRUE(hit.has_value()) << i;
    EXPECT_EQ(hit->source, ItemSource::kL2);
  }
  WorkerStats s;
  cache.Report(s);
  EXPECT_EQ(s.promotions, 0u);
  EXPECT_EQ(s.l2_entries, 1);
  EXPECT_EQ(s.l1_entries, 0);
  EXPECT_EQ(stats_.hit_bytes_l2, 3u * 576u);
}

}  // namespace
}  // namespace epd::internal
