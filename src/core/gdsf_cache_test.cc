// EmbeddingCache under GDSF: the sentences of epd/core/embedding_cache.h that
// are GDSF's own. Expected victims and clocks are worked out by hand from
// priority = clock + frequency x cost / size, in the comments beside them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "epd/core/embedding_cache.h"

namespace epd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Cache = EmbeddingCache<std::string, int>;

class GdsfTest : public ::testing::Test {
 protected:
  std::vector<std::string> evicted_;
  std::vector<EntryCost> evicted_cost_;
  Cache New(std::int64_t cap, CacheOptions o = {}) {
    o.eviction = EvictionPolicy::kGdsf;
    return Cache(cap, o, [this](const std::string& k, int&&, std::int64_t, const EntryCost& c) {
      evicted_.push_back(k);
      evicted_cost_.push_back(c);
    });
  }
};

TEST_F(GdsfTest, EvictsLowestCostPerByteFirst) {
  Cache c = New(300);
  c.Put("a", 1, 100, {1.0});  // 0.01 s/B
  c.Put("b", 2, 100, {0.1});  // 0.001
  c.Put("c", 3, 100, {0.5});  // 0.005
  c.Put("d", 4, 100, {2.0});
  EXPECT_THAT(evicted_, ElementsAre("b"));
  EXPECT_DOUBLE_EQ(c.clock(), 0.1 / 100);
  EXPECT_TRUE(c.Contains("d"));
}

// Without the clock x (0.01) would outrank every 0.005 newcomer forever;
// with it, each victim raises the clock and x goes after two newcomers.
TEST_F(GdsfTest, ClockAgesEntriesThatAreNotTouched) {
  Cache c = New(200);
  c.Put("x", 0, 100, {1.0});   // H = 0.01
  c.Put("y1", 1, 100, {0.5});  // H = 0.005
  c.Put("y2", 2, 100, {0.5});  // evicts y1 (0.005), clock 0.005, H(y2) = 0.01
  EXPECT_DOUBLE_EQ(c.clock(), 0.005);
  c.Put("y3", 3, 100, {0.5});  // x and y2 tie at 0.01: x, the older touch, goes
  EXPECT_THAT(evicted_, ElementsAre("y1", "x"));
  EXPECT_DOUBLE_EQ(c.clock(), 0.01);
}

TEST_F(GdsfTest, HitsRaisePriorityByFrequency) {
  Cache c = New(200);
  c.Put("a", 1, 100, {0.5});
  c.Put("b", 2, 100, {0.5});
  EXPECT_EQ(c.Get("a"), 1);
  EXPECT_EQ(c.Get("a"), 1);   // f(a) = 3: H = 0.015
  c.Put("c", 3, 100, {1.0});  // evicts b (0.005); H(c) = 0.005 + 0.01 = 0.015
  c.Put("d", 4, 100, {0.0});  // a and c tie at 0.015: a touched first, goes
  EXPECT_THAT(evicted_, ElementsAre("b", "a"));
  EXPECT_EQ(evicted_cost_[1].frequency, 3u);
  EXPECT_DOUBLE_EQ(evicted_cost_[1].seconds, 0.5);
}

TEST_F(GdsfTest, RePutCountsAsAReferenceAndTakesTheNewCost) {
  Cache c = New(200);
  c.Put("a", 1, 100, {0.5});
  c.Put("b", 2, 100, {0.5});
  c.Put("b", 22, 100, {0.5});  // f(b) = 2: H = 0.01
  c.Put("c", 3, 100, {0.2});   // evicts a (0.005); H(c) = 0.005 + 0.002
  c.Put("a", 4, 100, {0.5});   // c (0.007) goes before b (0.01)
  EXPECT_THAT(evicted_, ElementsAre("a", "c"));
  ASSERT_TRUE(c.CostOf("b").has_value());
  EXPECT_EQ(c.CostOf("b")->frequency, 2u);
  c.Put("b", 5, 100, {0.25});
  EXPECT_DOUBLE_EQ(c.CostOf("b")->seconds, 0.25);
  EXPECT_EQ(c.CostOf("b")->frequency, 3u);
}

// The newcomer is never its own put's victim, even when it ranks lowest.
TEST_F(GdsfTest, CheapNewcomerEvictsOthersNotItself) {
  Cache c = New(200);
  c.Put("a", 1, 100, {1.0});
  c.Put("b", 2, 100, {1.0});
  c.Put("cheap", 3, 100, {0.0});
  EXPECT_TRUE(c.Contains("cheap"));
  EXPECT_THAT(evicted_, ElementsAre("a"));
  // cheap was ranked after a's eviction: H = 0.01 + 0, tying b (0.01), which
  // was touched before it, so b goes next.
  c.Put("next", 4, 100, {1.0});
  EXPECT_THAT(evicted_, ElementsAre("a", "b"));
}

TEST_F(GdsfTest, PopAndCostOfHandBackCostAndFrequency) {
  Cache c = New(1000);
  c.Put("a", 1, 100, {0.25});
  c.Get("a");
  c.Get("a");
  auto cost = c.CostOf("a");
  ASSERT_TRUE(cost.has_value());
  EXPECT_EQ(cost->frequency, 3u);
  auto popped = c.Pop("a");
  ASSERT_TRUE(popped.has_value());
  EXPECT_DOUBLE_EQ(popped->cost.seconds, 0.25);
  EXPECT_EQ(popped->cost.frequency, 3u);
  EXPECT_EQ(c.CostOf("a"), std::nullopt);
  // Carried in: a put with a frequency starts from it.
  c.Put("a", 1, 100, popped->cost);
  EXPECT_EQ(c.CostOf("a")->frequency, 3u);
}

TEST_F(GdsfTest, UnmeasuredCostChargesTheDefaultRate) {
  CacheOptions o;
  o.default_seconds_per_byte = 2e-9;
  Cache c = New(1 << 20, o);
  c.Put("a", 1, 1000);
  EXPECT_DOUBLE_EQ(c.CostOf("a")->seconds, 1000 * 2e-9);
}

TEST_F(GdsfTest, InvalidCostIsRejectedNamingItAndChangesNothing) {
  Cache c = New(1000);
  c.Put("a", 1, 100, {0.5});
  for (double bad : {-0.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    try {
      c.Put("b", 2, 100, {bad});
      FAIL() << "expected epd::Error for " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(e.what(), HasSubstr("cost seconds must be finite and >= 0"));
    }
  }
  EXPECT_THROW(c.Put("a", 9, 100, {0.5, 0}), Error);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.Get("a"), 1);
  EXPECT_EQ(c.current_bytes(), 100);
}

TEST_F(GdsfTest, NegativeDefaultRateIsRejectedAtConstruction) {
  CacheOptions o;
  o.default_seconds_per_byte = -1;
  try {
    New(100, o);
    FAIL() << "expected epd::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("default_seconds_per_byte must be finite and >= 0"));
  }
}

// A tier above another ranks what the tier below can hold by the copy back:
// a, though 5 s to encode, goes before b, because both cost the same refetch.
TEST_F(GdsfTest, RefetchRateRanksEntriesTheTierBelowHolds) {
  CacheOptions o;
  o.refetch_seconds_per_byte = 1e-10;
  o.refetch_max_bytes = 150;
  Cache c = New(300, o);
  c.Put("a", 1, 100, {5.0});     // ranked 1e-10 (refetch), f 1
  c.Put("big", 2, 160, {0.01});  // over 150: ranked by its cost, 0.01 / 160
  c.Put("b", 3, 40, {0.001});    // ranked 1e-10, newer than a
  c.Put("c", 4, 100, {0.001});   // needs 100 more: a goes (lowest, oldest)
  EXPECT_THAT(evicted_, ElementsAre("a"));
  EXPECT_DOUBLE_EQ(evicted_cost_[0].seconds, 5.0);  // its own cost is handed on
  EXPECT_TRUE(c.Contains("big"));
}

class WeightedCountersTest : public ::testing::TestWithParam<EvictionPolicy> {};

TEST_P(WeightedCountersTest, HitBytesAndSecondsSumEachHitUnderEveryPolicy) {
  const EvictionPolicy p = GetParam();
  Cache c(1000, CacheOptions{p});
  c.Put("a", 1, 100, {0.3});
  c.Put("b", 2, 50, {0.2});
  c.Get("a");
  c.Get("a");
  c.Get("b");
  c.Get("missing");
  EXPECT_EQ(c.hit_bytes(), 250) << EvictionPolicyName(p);
  EXPECT_DOUBLE_EQ(c.hit_seconds(), 0.8) << EvictionPolicyName(p);
}
INSTANTIATE_TEST_SUITE_P(Policies, WeightedCountersTest,
                         ::testing::Values(EvictionPolicy::kLru, EvictionPolicy::kGdsf, EvictionPolicy::kAdaptive),
                         [](const auto& info) { return std::string(EvictionPolicyName(info.param)); });

TEST(EvictionPolicyTest, ParsesItsNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseEvictionPolicy("lru"), EvictionPolicy::kLru);
  EXPECT_EQ(*ParseEvictionPolicy("gdsf"), EvictionPolicy::kGdsf);
  EXPECT_EQ(*ParseEvictionPolicy("adaptive"), EvictionPolicy::kAdaptive);
  for (EvictionPolicy p : {EvictionPolicy::kLru, EvictionPolicy::kGdsf, EvictionPolicy::kAdaptive}) {
    EXPECT_EQ(*ParseEvictionPolicy(EvictionPolicyName(p)), p);
  }
  auto bad = ParseEvictionPolicy("lfu");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("eviction must be lru, gdsf or adaptive, got 'lfu'"));
}

// ForEachInEvictionOrder is the order the victims would go in.
TEST_F(GdsfTest, EvictionOrderWalkMatchesTheVictims) {
  Cache c = New(10000);
  for (int i = 0; i < 20; ++i) c.Put("k" + std::to_string(i), i, 100, {0.001 * ((i * 7) % 20)});
  for (int i = 0; i < 20; i += 3) c.Get("k" + std::to_string(i));
  std::vector<std::string> walk;
  c.ForEachInEvictionOrder([&](const std::string& k, const int&, std::int64_t) { walk.push_back(k); });
  ASSERT_EQ(walk.size(), 20u);
  c.Put("huge", 0, 10000, {1.0});  // evicts all 20
  EXPECT_EQ(evicted_, walk);
}

// A hot entry pushed out by expensive newcomers keeps its references under
// kHistory and re-enters with them; Cherkasova's kResident starts it at 1.
// Capacity 200, every entry 100 B; H = priority, worked by hand:
//   a, b, c at 0.001 s/B: c's put evicts a (clock 0.001; the history starts)
//   h (0.001 s/B): evicts b; h referenced by its put and 4 hits: frequency
//     5 under both rules (history count 5), H(h) = 0.001 + 5 x 0.001 = 0.006
//   n1 (0.0045 s/B): evicts c (0.002), clock 0.002, H(n1) = 0.0065
//   n2: evicts h (0.006), clock 0.006, H(n2) = 0.0105
//   h again: evicts n1 (0.0065), clock 0.0065; its frequency is
//     history: 6 (1 + its 5 references), H(h) = 0.0065 + 0.006 = 0.0125
//     resident: 1, H(h) = 0.0075
//   n3: history evicts n2 (0.0105 < 0.0125); resident evicts h again.
TEST_F(GdsfTest, HistoryKeepsFrequencyAcrossEviction) {
  for (GdsfFrequency f : {GdsfFrequency::kHistory, GdsfFrequency::kResident}) {
    evicted_.clear();
    CacheOptions o;
    o.gdsf_frequency = f;
    Cache c = New(200, o);
    for (const char* k : {"a", "b", "c"}) c.Put(k, 0, 100, {0.1});
    EXPECT_EQ(c.history() != nullptr, f == GdsfFrequency::kHistory);
    c.Put("h", 0, 100, {0.1});
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(c.Get("h").has_value());
    EXPECT_EQ(c.CostOf("h")->frequency, 5u);
    c.Put("n1", 1, 100, {0.45});
    c.Put("n2", 2, 100, {0.45});
    ASSERT_THAT(evicted_, ElementsAre("a", "b", "c", "h"));
    c.Put("h", 0, 100, {0.1});
    EXPECT_DOUBLE_EQ(c.clock(), 0.0065);
    c.Put("n3", 3, 100, {0.45});
    if (f == GdsfFrequency::kHistory) {
      EXPECT_THAT(evicted_, ElementsAre("a", "b", "c", "h", "n1", "n2"));
      EXPECT_EQ(c.CostOf("h")->frequency, 6u);
      EXPECT_DOUBLE_EQ(c.clock(), 0.0105);
    } else {
      EXPECT_THAT(evicted_, ElementsAre("a", "b", "c", "h", "n1", "h"));
      EXPECT_DOUBLE_EQ(c.clock(), 0.0075);
    }
  }
}

// The history's window: given, or 30 x the entries held at the first
// eviction, at least 1024.
TEST_F(GdsfTest, HistoryWindowIsSizedAtTheFirstEviction) {
  Cache small = New(300);
  for (int i = 0; i < 4; ++i) small.Put("k" + std::to_string(i), 0, 100, {0.1});
  ASSERT_NE(small.history(), nullptr);
  EXPECT_EQ(small.history()->window(), 1024u);
  Cache big = New(std::int64_t{100} * 100);
  for (int i = 0; i <= 100; ++i) big.Put("k" + std::to_string(i), 0, 100, {0.1});
  ASSERT_NE(big.history(), nullptr);
  EXPECT_EQ(big.history()->window(), 30u * 101);  // 101 held when the first victim is chosen
  CacheOptions o;
  o.gdsf_history_window = 77;
  Cache given = New(100, o);
  given.Put("x", 0, 100, {0.1});
  EXPECT_EQ(given.history(), nullptr);
  given.Put("y", 0, 100, {0.1});
  ASSERT_NE(given.history(), nullptr);
  EXPECT_EQ(given.history()->window(), 77u);
}

}  // namespace
}  // namespace epd
