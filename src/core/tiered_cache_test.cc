// TieredEmbeddingCache against the reference's tiering behaviour, with a fake
// device whose copies are recorded, so each promotion and demotion is visible.
#include "epd/core/tiered_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "epd/core/policy_duel.h"

namespace epd {
namespace {

using ::testing::ElementsAre;

// A value tagged with where it lives; the fake copies flip the tag.
struct Tagged {
  std::string payload;
  bool on_device = true;
  friend bool operator==(const Tagged&, const Tagged&) = default;
};

class TieredTest : public ::testing::Test {
 protected:
  std::vector<std::string> to_host_calls_, to_device_calls_;
  TieredEmbeddingCache<std::string, Tagged> Make(std::int64_t l1, std::int64_t l2) {
    return TieredEmbeddingCache<std::string, Tagged>(
        l1, l2,
        [this](const Tagged& v) {
          to_host_calls_.push_back(v.payload);
          return Tagged{v.payload, false};
        },
        [this](const Tagged& v) {
          to_device_calls_.push_back(v.payload);
          return Tagged{v.payload, true};
        });
  }
  static std::set<std::string> Keys(const EmbeddingCache<std::string, Tagged>& c) {
    std::set<std::string> out;
    c.ForEachLruToMru([&](const std::string& k, const Tagged&, std::int64_t) { out.insert(k); });
    return out;
  }
  static void ExpectExclusive(TieredEmbeddingCache<std::string, Tagged>& t) {
    for (const auto& k : Keys(t.l1())) EXPECT_FALSE(t.l2().Contains(k)) << k << " is in both tiers";
  }
};

// Regression case from the issue, with the counters checked at each step.
TEST_F(TieredTest, DemotesL1VictimAndPromotesOnL2Hit) {
  auto t = Make(200, 200);
  t.Put("a", {"a"}, 100);
  t.Put("b", {"b"}, 100);
  t.Put("c", {"c"}, 100);
  EXPECT_EQ(Keys(t.l1()), (std::set<std::string>{"b", "c"}));
  EXPECT_EQ(Keys(t.l2()), (std::set<std::string>{"a"}));
  EXPECT_EQ(t.demotions(), 1u);
  EXPECT_THAT(to_host_calls_, ElementsAre("a"));
  t.l2().ForEachLruToMru([](const std::string&, const Tagged& v, std::int64_t) {
    EXPECT_FALSE(v.on_device) << "L2 must hold the host copy";
  });
  ExpectExclusive(t);

  auto got = t.Get("a");
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->on_device);
  EXPECT_EQ(Keys(t.l1()), (std::set<std::string>{"c", "a"}));
  EXPECT_EQ(Keys(t.l2()), (std::set<std::string>{"b"}));
  EXPECT_EQ(t.l1_hits(), 0u);
  EXPECT_EQ(t.l2_hits(), 1u);
  EXPECT_EQ(t.hits(), 1u);
  EXPECT_EQ(t.misses(), 0u);
  EXPECT_EQ(t.promotions(), 1u);
  EXPECT_EQ(t.demotions(), 2u);
  EXPECT_THAT(to_device_calls_, ElementsAre("a"));
  EXPECT_THAT(to_host_calls_, ElementsAre("a", "b"));
  ExpectExclusive(t);
  EXPECT_EQ(t.size(), 3u);
  EXPECT_TRUE(t.Contains("b"));
}

TEST_F(TieredTest, L1HitCountsOnlyL1) {
  auto t = Make(200, 200);
  t.Put("a", {"a"}, 100);
  EXPECT_EQ(t.Get("a")->payload, "a");
  EXPECT_EQ(t.l1_hits(), 1u);
  EXPECT_EQ(t.l2_hits(), 0u);
  EXPECT_TRUE(to_device_calls_.empty());
}

TEST_F(TieredTest, MissInBothTiersCountsOneMiss) {
  auto t = Make(200, 200);
  EXPECT_EQ(t.Get("x"), std::nullopt);
  EXPECT_EQ(t.misses(), 1u);
  EXPECT_EQ(t.l1().misses(), 1u);
  EXPECT_EQ(t.l2().misses(), 0u) << "L2 is probed with pop, which is structural";
}

TEST_F(TieredTest, PromotedKeyIsNeverItsOwnVictim) {
  auto t = Make(100, 300);
  t.Put("a", {"a"}, 100);
  t.Put("b", {"b"}, 100);  // a -> L2
  auto got = t.Get("a");   // a promoted; b demoted
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(t.l1().Contains("a"));
  EXPECT_TRUE(t.l2().Contains("b"));
  EXPECT_FALSE(t.l2().Contains("a"));
}

TEST_F(TieredTest, PutDropsStaleL2Copy) {
  auto t = Make(100, 300);
  t.Put("a", {"old"}, 100);
  t.Put("b", {"b"}, 100);  // a demoted
  ASSERT_TRUE(t.l2().Contains("a"));
  t.Put("a", {"new"}, 100);  // lands in L1, b demoted, stale a dropped from L2
  EXPECT_FALSE(t.l2().Contains("a"));
  EXPECT_EQ(t.Get("a")->payload, "new");
  ExpectExclusive(t);
}

TEST_F(TieredTest, VictimLargerThanL2IsDroppedWithoutCopy) {
  auto t = Make(300, 100);
  t.Put("big", {"big"}, 200);
  t.Put("x", {"x"}, 200);  // big evicted from L1, too large for L2
  EXPECT_FALSE(t.Contains("big"));
  EXPECT_TRUE(to_host_calls_.empty());
  EXPECT_EQ(t.demotions(), 0u);
}

TEST_F(TieredTest, L2EvictionsAreDrops) {
  auto t = Make(100, 100);
  t.Put("a", {"a"}, 100);
  t.Put("b", {"b"}, 100);  // a -> L2
  t.Put("c", {"c"}, 100);  // b -> L2, a dropped
  EXPECT_FALSE(t.Contains("a"));
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(t.l2().evictions(), 1u);
}

TEST_F(TieredTest, ThrowingToDeviceLosesTheEntryAsTheReferenceDoes) {
  TieredEmbeddingCache<std::string, Tagged> t(
      100, 100,
      [](const Tagged& v) {
        return Tagged{v.payload, false};
      },
      [](const Tagged&) -> Tagged { throw std::runtime_error("device copy failed"); });
  t.Put("a", {"a"}, 100);
  t.Put("b", {"b"}, 100);
  EXPECT_THROW(t.Get("a"), std::runtime_error);
  EXPECT_FALSE(t.Contains("a"));
  EXPECT_EQ(t.l2_hits(), 0u);
  EXPECT_EQ(t.promotions(), 0u);
  EXPECT_TRUE(t.Contains("b"));
}

// An L2 entry larger than all of L1 (placed by a direct l2().Put). Without
// the option, the reference's get: promoted, skipped by L1, lost.
TEST_F(TieredTest, OversizeL2EntryIsLostOnPromotionAsTheReferenceDoes) {
  auto t = Make(100, 1000);
  t.l2().Put("big", {"big", false}, 300);
  EXPECT_EQ(t.Get("big"), (Tagged{"big", true}));
  EXPECT_EQ(t.promotions(), 1u);
  EXPECT_EQ(t.l2_hits(), 1u);
  EXPECT_FALSE(t.Contains("big"));
}

// keep_oversize_in_l2: each hit is a device copy, the entry stays in L2 and
// gains one reference per hit (GDSF's frequency: 1 at the put, 3 after two hits).
TEST_F(TieredTest, OversizeL2EntryStaysInL2WithOneReferencePerHit) {
  TieredOptions o;
  o.eviction = EvictionPolicy::kGdsf;
  o.keep_oversize_in_l2 = true;
  TieredEmbeddingCache<std::string, Tagged> t(100, 1000, o, nullptr, [this](const Tagged& v) {
    to_device_calls_.push_back(v.payload);
    return Tagged{v.payload, true};
  });
  t.l2().Put("big", {"big", false}, 300, EntryCost{2.0});
  t.Put("small", {"small"}, 50);
  for (int i = 0; i < 2; ++i) {
    CacheTier tier = CacheTier::kMiss;
    EXPECT_EQ(t.Get("big", &tier), (Tagged{"big", true}));
    EXPECT_EQ(tier, CacheTier::kL2);
  }
  EXPECT_TRUE(t.l2().Contains("big"));
  EXPECT_FALSE(t.l1().Contains("big"));
  EXPECT_TRUE(t.l1().Contains("small"));
  EXPECT_EQ(t.l2().CostOf("big")->frequency, 3u);
  EXPECT_DOUBLE_EQ(t.l2().CostOf("big")->seconds, 2.0);
  EXPECT_EQ(t.promotions(), 0u);
  EXPECT_EQ(t.l2_hits(), 2u);
  EXPECT_EQ(t.l2().hits(), 2u);  // served in place: L2's own get
  EXPECT_EQ(t.l2_hit_bytes(), 600);
  EXPECT_DOUBLE_EQ(t.l2_hit_seconds(), 4.0);
  EXPECT_THAT(to_device_calls_, ElementsAre("big", "big"));
  // An entry L1 can hold is still promoted.
  t.l2().Put("mid", {"mid", false}, 60);
  EXPECT_EQ(t.Get("mid"), (Tagged{"mid", true}));
  EXPECT_TRUE(t.l1().Contains("mid"));
  EXPECT_EQ(t.promotions(), 1u);
}

// The doorkeeper's first put can place an entry larger than L1 into L2; its
// admitted hits are served in place too (the reference has no doorkeeper).
TEST(TieredOversizeTest, DoorkeeperKeepsAnOversizeEntryInL2) {
  TieredOptions o;
  o.l1_admission = L1Admission::kDoorkeeper;
  TieredEmbeddingCache<std::string, int> t(100, 1000, o);
  t.Put("big", 7, 300);  // a first request: into L2
  ASSERT_TRUE(t.l2().Contains("big"));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(t.Get("big"), 7) << i;  // the 2nd and 3rd are admitted
  EXPECT_TRUE(t.l2().Contains("big"));
  EXPECT_EQ(t.promotions(), 0u);
  EXPECT_EQ(t.l2_hits(), 3u);
  EXPECT_EQ(t.misses(), 0u);
}

// An L2 hit whose tenant L1 refuses is served in place: a reservation set
// after the entry arrived shrinks the shared pool below the entry, so a
// re-put into L2 would be refused and the entry lost (as a pop and re-put did).
TEST(TieredOversizeTest, AnEntryL1RefusesIsNotLostWhenTheSharedPoolShrank) {
  TieredEmbeddingCache<std::string, int> t(400, 1000);
  t.SetTenantReservation(1, 0, 0);  // per-tenant accounting on
  t.l2().Put("a", 7, 300, EntryCost{1.0, 1, 1});
  t.SetTenantReservation(2, 200, 800);  // shared pools: 200 bytes in L1 and in L2, under tenant 1's 300
  for (int i = 0; i < 2; ++i) EXPECT_EQ(t.Get("a"), 7) << i;
  EXPECT_TRUE(t.l2().Contains("a"));
  EXPECT_FALSE(t.l1().Contains("a"));
  EXPECT_EQ(t.l2_hits(), 2u);
  EXPECT_EQ(t.promotions(), 0u);
  EXPECT_EQ(t.l2().refusals(), 0u);
}

// Under kAdaptive an L2 hit served in place is a request to L2's duel: a hit
// in each miniature that holds the key, so each score rises by its cost.
TEST(TieredOversizeTest, AnInPlaceL2HitReachesL2sDuel) {
  TieredOptions o;
  o.eviction = EvictionPolicy::kAdaptive;
  o.keep_oversize_in_l2 = true;
  TieredEmbeddingCache<int, int> t(100, 1000, o);
  for (int k = 1; k <= 6; ++k) t.l2().Put(k, k, 200, EntryCost{1.0});  // the sixth evicts: the duel starts
  const PolicyDuel* duel = t.l2().duel();
  ASSERT_NE(duel, nullptr);
  t.l2().Put(99, 99, 300, EntryCost{5.0});  // larger than L1
  const double lru = duel->lru_score(), gdsf = duel->gdsf_score(), probation = duel->probation_score();
  EXPECT_EQ(t.Get(99), 99);
  EXPECT_TRUE(t.l2().Contains(99));
  EXPECT_GT(duel->lru_score(), lru + 4);
  EXPECT_GT(duel->gdsf_score(), gdsf + 4);
  EXPECT_GT(duel->probation_score(), probation + 4);
}

// A copy that throws on such a hit loses nothing and counts no hit.
TEST(TieredOversizeTest, ThrowingCopyKeepsTheOversizeEntry) {
  TieredOptions o;
  o.keep_oversize_in_l2 = true;
  TieredEmbeddingCache<std::string, int> t(100, 1000, o, nullptr,
                                           [](const int&) -> int { throw std::runtime_error("device copy failed"); });
  t.l2().Put("big", 7, 300);
  EXPECT_THROW(t.Get("big"), std::runtime_error);
  EXPECT_TRUE(t.l2().Contains("big"));
  EXPECT_EQ(t.l2_hits(), 0u);
  EXPECT_EQ(t.l2().current_bytes(), 300);
}

TEST(TieredNullValueTest, NullL1ValueFallsThroughLikeTheReference) {
  TieredEmbeddingCache<int, std::shared_ptr<int>> t(100, 100);
  t.Put(1, nullptr, 10);
  EXPECT_EQ(t.Get(1), std::nullopt);
  EXPECT_EQ(t.l1().hits(), 1u);
  EXPECT_EQ(t.l1_hits(), 0u);
  EXPECT_EQ(t.misses(), 1u);
}

TEST(TieredTierReportTest, GetReportsTheTier) {
  TieredEmbeddingCache<int, int> t(100, 100);
  t.Put(1, 10, 100);
  t.Put(2, 20, 100);
  CacheTier tier;
  t.Get(2, &tier);
  EXPECT_EQ(tier, CacheTier::kL1);
  t.Get(1, &tier);
  EXPECT_EQ(tier, CacheTier::kL2);
  t.Get(3, &tier);
  EXPECT_EQ(tier, CacheTier::kMiss);
}

// The byte counters summed over accesses stop at INT64_MAX rather than wrap
// (a signed overflow): entries of 2^61 - 1 bytes pass it at the fifth.
TEST(TieredByteCountersTest, StopAtInt64MaxInsteadOfWrapping) {
  constexpr std::int64_t kBig = (std::int64_t{1} << 61) - 1;
  TieredEmbeddingCache<int, int> t(kMaxCacheBytes, kMaxCacheBytes);
  for (int i = 0; i < 4; ++i) t.Put(1, i, kBig);  // a re-put is a write too
  EXPECT_EQ(t.l1_write_bytes(), 4 * kBig);        // 9223372036854775804
  t.Put(1, 4, kBig);
  EXPECT_EQ(t.l1_write_bytes(), INT64_MAX);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t.Get(1), 4);
  EXPECT_EQ(t.l1_hit_bytes(), 4 * kBig);
  EXPECT_EQ(t.l1().hit_bytes(), 4 * kBig);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(t.Get(1), 4);
  EXPECT_EQ(t.l1_hit_bytes(), INT64_MAX);
  EXPECT_EQ(t.l1().hit_bytes(), INT64_MAX);
  EXPECT_EQ(t.l1_hits(), 6u);
  // L2's writes (demotions) likewise: each put of a new key demotes the last.
  TieredEmbeddingCache<int, int> d(kBig, kMaxCacheBytes);
  for (int k = 0; k < 5; ++k) d.Put(k, k, kBig);
  EXPECT_EQ(d.l2_write_bytes(), 4 * kBig);
  d.Put(5, 5, kBig);
  EXPECT_EQ(d.l2_write_bytes(), INT64_MAX);
}

}  // namespace
}  // namespace epd
