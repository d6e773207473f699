// TieredEmbeddingCache's options beyond the reference: the doorkeeper in
// front of L1, GDSF in both tiers (cost and frequency travelling with an
// entry), and the weighted counters. The reference's behaviour under the
// defaults is tiered_cache_test.cc's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "epd/core/tiered_cache.h"

namespace epd {
namespace {

using Tiered = TieredEmbeddingCache<std::string, std::string>;

class TieredEconomicsTest : public ::testing::Test {
 protected:
  std::vector<std::string> to_host_, to_device_;
  Tiered Make(std::int64_t l1, std::int64_t l2, TieredOptions o) {
    return Tiered(
        l1, l2, o,
        [this](const std::string& v) {
          to_host_.push_back(v);
          return v;
        },
        [this](const std::string& v) {
          to_device_.push_back(v);
          return v;
        });
  }
  static TieredOptions Doorkeeper(std::uint64_t window) {
    TieredOptions o;
    o.l1_admission = L1Admission::kDoorkeeper;
    o.admission.window = window;
    return o;
  }
  // A worker's request: get, and put on a miss.
  static CacheTier Request(Tiered& t, const std::string& key, std::int64_t nbytes, double seconds = 0.1) {
    CacheTier tier;
    if (!t.Get(key, &tier).has_value()) t.Put(key, key, nbytes, {seconds});
    return tier;
  }
};

TEST_F(TieredEconomicsTest, OneHitWonderNeverEntersL1) {
  Tiered t = Make(1000, 100000, Doorkeeper(1 << 12));
  std::int64_t repeated_bytes = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string once = "once-" + std::to_string(i);
    Request(t, once, 10);
    EXPECT_FALSE(t.l1().Contains(once)) << once;
    EXPECT_TRUE(t.l2().Contains(once)) << once;
    if (i % 10 == 0) {  // a key requested twice, which must reach L1
      const std::string twice = "twice-" + std::to_string(i);
      Request(t, twice, 10);
      EXPECT_EQ(Request(t, twice, 10), CacheTier::kL2);
      EXPECT_TRUE(t.l1().Contains(twice));
      repeated_bytes += 10;
    }
  }
  EXPECT_EQ(t.l1_write_bytes(), repeated_bytes);
  EXPECT_EQ(t.admission_rejections(), 330u);
}

TEST_F(TieredEconomicsTest, SecondRequestWithinTheWindowPromotesToL1) {
  Tiered t = Make(1000, 1000, Doorkeeper(100));
  EXPECT_EQ(Request(t, "k", 100), CacheTier::kMiss);
  EXPECT_TRUE(t.l2().Contains("k"));
  EXPECT_THAT(to_host_, ::testing::ElementsAre("k"));  // the put's device->host copy
  EXPECT_EQ(Request(t, "k", 100), CacheTier::kL2);
  EXPECT_TRUE(t.l1().Contains("k"));
  EXPECT_FALSE(t.l2().Contains("k"));
  EXPECT_EQ(t.promotions(), 1u);
  EXPECT_EQ(Request(t, "k", 100), CacheTier::kL1);
}

// The second request misses (L2 dropped the entry): its put goes to L1.
TEST_F(TieredEconomicsTest, SecondRequestAfterAnL2DropIsPutIntoL1) {
  Tiered t = Make(1000, 150, Doorkeeper(100));
  Request(t, "k", 100);
  Request(t, "other", 100);  // L2 holds 150: k is dropped
  EXPECT_FALSE(t.Contains("k"));
  EXPECT_EQ(Request(t, "k", 100), CacheTier::kMiss);
  EXPECT_TRUE(t.l1().Contains("k"));
}

// A window ends between the two requests: the second counts as a first, so
// the L2 hit is served by a copy and the entry stays in L2.
TEST_F(TieredEconomicsTest, RequestsInDifferentWindowsDoNotAdmit) {
  Tiered t = Make(1000, 1000, Doorkeeper(4));
  Request(t, "k", 100);                                        // request 1 of window 1
  for (int i = 0; i < 3; ++i) t.Get("x" + std::to_string(i));  // window 1 ends
  ASSERT_EQ(t.admission_filter()->resets(), 1u);
  auto v = t.Get("k");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, "k");
  EXPECT_FALSE(t.l1().Contains("k"));
  EXPECT_TRUE(t.l2().Contains("k"));
  EXPECT_EQ(t.l2_hits(), 1u);
  EXPECT_EQ(t.promotions(), 0u);
  EXPECT_THAT(to_device_, ::testing::ElementsAre("k"));
  EXPECT_EQ(Request(t, "k", 100), CacheTier::kL2);  // request 2 in this window: promoted
  EXPECT_TRUE(t.l1().Contains("k"));
}

TEST_F(TieredEconomicsTest, GdsfCarriesCostAndFrequencyAcrossTiers) {
  TieredOptions o;
  o.eviction = EvictionPolicy::kGdsf;
  Tiered t = Make(200, 1000, o);
  t.Put("a", "a", 100, {0.5});
  t.Put("b", "b", 100, {0.7});
  t.Get("b");                   // f(b) = 2
  t.Put("c", "c", 100, {0.1});  // L1 ranks by promotion: a (f 1, oldest) is demoted
  ASSERT_TRUE(t.l2().CostOf("a").has_value());
  EXPECT_DOUBLE_EQ(t.l2().CostOf("a")->seconds, 0.5);
  EXPECT_EQ(t.l2().CostOf("a")->frequency, 1u);
  CacheTier tier;
  t.Get("a", &tier);
  EXPECT_EQ(tier, CacheTier::kL2);
  ASSERT_TRUE(t.l1().CostOf("a").has_value());
  EXPECT_DOUBLE_EQ(t.l1().CostOf("a")->seconds, 0.5);
  EXPECT_EQ(t.l1().CostOf("a")->frequency, 2u);
  EXPECT_DOUBLE_EQ(t.l2_hit_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(t.seconds_saved(), 0.7 + 0.5);
  EXPECT_EQ(t.l1_hit_bytes(), 100);
  EXPECT_EQ(t.l2_hit_bytes(), 100);
}

// L1 holds one entry and demotes each; L2 holds two. GDSF's L2 keeps the
// expensive x and drops the cheap y; LRU's drops x, the oldest.
class TieredL2OrderTest : public TieredEconomicsTest, public ::testing::WithParamInterface<EvictionPolicy> {};

TEST_P(TieredL2OrderTest, GdsfL2KeepsTheExpensiveEntryLruDropsTheOldest) {
  const EvictionPolicy p = GetParam();
  TieredOptions o;
  o.eviction = p;
  Tiered t = Make(100, 200, o);
  t.Put("x", "x", 100, {10.0});
  t.Put("y", "y", 100, {0.01});
  t.Put("z", "z", 100, {0.02});
  t.Put("w", "w", 100, {0.03});
  EXPECT_EQ(t.l2().Contains("x"), p == EvictionPolicy::kGdsf) << EvictionPolicyName(p);
  EXPECT_EQ(t.l2().Contains("y"), p == EvictionPolicy::kLru) << EvictionPolicyName(p);
  EXPECT_TRUE(t.l2().Contains("z"));
  EXPECT_TRUE(t.l1().Contains("w"));
}
INSTANTIATE_TEST_SUITE_P(Policies, TieredL2OrderTest, ::testing::Values(EvictionPolicy::kLru, EvictionPolicy::kGdsf),
                         [](const auto& info) { return std::string(EvictionPolicyName(info.param)); });

TEST_F(TieredEconomicsTest, L2VictimHookSeesTheDropsWithTheirCost) {
  Tiered t = Make(100, 100, TieredOptions{});
  std::vector<std::pair<std::string, double>> dropped;
  t.set_l2_victim_hook([&](const std::string& k, std::string&&, std::int64_t, const EntryCost& c) {
    dropped.emplace_back(k, c.seconds);
  });
  t.Put("a", "a", 100, {1.5});
  t.Put("b", "b", 100, {2.5});
  t.Put("c", "c", 100, {3.5});  // b demoted, a dropped from L2
  EXPECT_THAT(dropped, ::testing::ElementsAre(std::pair<std::string, double>{"a", 1.5}));
}

TEST(L1AdmissionTest, ParsesItsNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseL1Admission("none"), L1Admission::kNone);
  EXPECT_EQ(*ParseL1Admission("doorkeeper"), L1Admission::kDoorkeeper);
  EXPECT_FALSE(ParseL1Admission("bloom").ok());
}

}  // namespace
}  // namespace epd
