// EmbeddingCache under EvictionPolicy::kAdaptive (epd/core/cache_options.h,
// epd/core/policy_duel.h): the victims follow the leader of the duel, and the
// duel follows the workload. The workloads are built so that one policy's
// choice is known by hand; each test also runs pure LRU and pure GDSF caches
// over the same calls, as the independent yardsticks. The exact rule,
// victim by victim, is checked against a Python model in
// tests/python/test_adaptive_model.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "epd/core/embedding_cache.h"
#include "epd/core/tiered_cache.h"

namespace epd {
namespace {

using ::testing::ElementsAre;

using Cache = EmbeddingCache<std::string, int>;

// A user of the cache: a get, and a put on a miss. Returns whether it hit.
bool Request(Cache& c, const std::string& key, std::int64_t nbytes, double seconds) {
  if (c.Get(key).has_value()) return true;
  c.Put(key, 0, nbytes, {seconds});
  return false;
}

// Multi-turn chat: each round a new image that is expensive per byte and is
// never sent again (a one-turn conversation), a new cheap image, and the
// second turn of the previous round's cheap image. Holding four entries, LRU
// keeps the previous cheap image (three touches since its put); GDSF ranks
// the never-again expensive images above it and evicts it.
struct RecencyWorkload {
  static constexpr int kRounds = 400;
  template <typename F>
  static void Run(F&& request) {
    for (int j = 0; j < kRounds; ++j) {
      request("e" + std::to_string(j), 100, 1.0);  // 0.01 s/B, never again
      request("c" + std::to_string(j), 100, 0.1);  // 0.001 s/B
      if (j > 0) request("c" + std::to_string(j - 1), 100, 0.1);
    }
  }
};

// Hot expensive images between scans of cheap one-off images: GDSF keeps the
// hot ones, LRU lets each scan flush them.
struct SkewWorkload {
  static constexpr int kRounds = 200;
  template <typename F>
  static void Run(F&& request) {
    int fresh = 0;
    for (int j = 0; j < kRounds; ++j) {
      for (int h = 0; h < 3; ++h) request("hot" + std::to_string(h), 100, 1.0);
      for (int s = 0; s < 4; ++s) request("once" + std::to_string(fresh++), 100, 0.1);
    }
  }
};

// The workload W through a cache of `capacity` bytes under policy p.
// Hot images of a moderate cost per byte between one-off images of a high
// one: GDSF ranks each one-off above the hot set and lets it displace a hot
// image; with probation a one-off is ranked at the clock and goes first.
struct OneOffWorkload {
  static constexpr int kRounds = 300;
  template <typename F>
  static void Run(F&& request) {
    int fresh = 0;
    for (int j = 0; j < kRounds; ++j) {
      for (int h = 0; h < 3; ++h) request("hot" + std::to_string(h), 100, 0.2);           // 0.002 s/B
      for (int s = 0; s < 2; ++s) request("once" + std::to_string(fresh++), 100, 100.0);  // 1 s/B
    }
  }
};

template <typename W>
std::unique_ptr<Cache> RunOn(EvictionPolicy p, std::int64_t capacity, bool probation = false) {
  CacheOptions o{p};
  o.gdsf_probation = probation;
  auto c = std::make_unique<Cache>(capacity, o);
  W::Run([&](const std::string& k, std::int64_t n, double s) { Request(*c, k, n, s); });
  return c;
}

TEST(AdaptiveTest, FollowsLruWhereReuseFollowsRecency) {
  const double lru = RunOn<RecencyWorkload>(EvictionPolicy::kLru, 400)->hit_seconds();
  const double gdsf = RunOn<RecencyWorkload>(EvictionPolicy::kGdsf, 400)->hit_seconds();
  const auto adaptive = RunOn<RecencyWorkload>(EvictionPolicy::kAdaptive, 400);
  const double mixed = adaptive->hit_seconds();
  // Every second turn is a hit under LRU: 399 x 0.1 s.
  EXPECT_NEAR(lru, 39.9, 1e-9);
  EXPECT_LT(gdsf, 0.5 * lru);
  ASSERT_NE(adaptive->duel(), nullptr);
  EXPECT_TRUE(adaptive->duel()->lru_leads());
  EXPECT_DOUBLE_EQ(adaptive->duel()->rate(), 1.0);  // four entries: every key sampled
  EXPECT_GT(adaptive->lru_victims(), 0u);
  // It starts under GDSF and switches once LRU's miniature has scored.
  EXPECT_GT(mixed, 0.9 * lru);
  EXPECT_GT(mixed, gdsf);
}

TEST(AdaptiveTest, StaysWithGdsfWhereCostAndFrequencyPay) {
  const double lru = RunOn<SkewWorkload>(EvictionPolicy::kLru, 400)->hit_seconds();
  const double gdsf = RunOn<SkewWorkload>(EvictionPolicy::kGdsf, 400)->hit_seconds();
  const auto adaptive = RunOn<SkewWorkload>(EvictionPolicy::kAdaptive, 400);
  const double mixed = adaptive->hit_seconds();
  EXPECT_DOUBLE_EQ(lru, 0);  // each scan of four flushes the three hot images
  EXPECT_GT(gdsf, 0);
  ASSERT_NE(adaptive->duel(), nullptr);
  EXPECT_FALSE(adaptive->duel()->lru_leads());
  EXPECT_EQ(adaptive->duel()->switches(), 0u);
  EXPECT_EQ(adaptive->lru_victims(), 0u);
  // Never led by LRU, it evicts exactly as GDSF does.
  EXPECT_DOUBLE_EQ(mixed, gdsf);
}

TEST(AdaptiveTest, TakesProbationWhereOneOffsWouldDisplaceTheHotSet) {
  const double gdsf = RunOn<OneOffWorkload>(EvictionPolicy::kGdsf, 400)->hit_seconds();
  const double probation = RunOn<OneOffWorkload>(EvictionPolicy::kGdsf, 400, true)->hit_seconds();
  const auto adaptive = RunOn<OneOffWorkload>(EvictionPolicy::kAdaptive, 400);
  // With probation the three hot images stay once they are referenced again
  // (probation starts with the history, at the first eviction; two one-offs
  // ranked before it squat until the clock reaches them): most of the 900
  // hot requests hit (0.2 s each).
  EXPECT_GT(probation, 0.85 * 900 * 0.2);
  EXPECT_LT(gdsf, 0.5 * probation);
  ASSERT_NE(adaptive->duel(), nullptr);
  EXPECT_TRUE(adaptive->duel()->probation_leads());
  EXPECT_EQ(adaptive->lru_victims(), 0u);
  EXPECT_GT(adaptive->hit_seconds(), 0.9 * probation);
}

// Before the first eviction there is no duel, and the first victim is GDSF's.
TEST(AdaptiveTest, StartsUnderGdsf) {
  std::vector<std::string> evicted;
  Cache c(300, CacheOptions{EvictionPolicy::kAdaptive},
          [&](const std::string& k, int&&, std::int64_t, const EntryCost&) { evicted.push_back(k); });
  c.Put("a", 1, 100, {1.0});  // 0.01 s/B, least recently touched
  c.Put("b", 2, 100, {0.1});  // 0.001 s/B
  c.Put("c", 3, 100, {0.5});
  EXPECT_EQ(c.duel(), nullptr);
  c.Put("d", 4, 100, {0.5});  // LRU would take a; GDSF takes b
  EXPECT_THAT(evicted, ElementsAre("b"));
  ASSERT_NE(c.duel(), nullptr);
  EXPECT_FALSE(c.duel()->lru_leads());
  EXPECT_EQ(c.lru_victims(), 0u);
  EXPECT_DOUBLE_EQ(c.clock(), 0.001);
}

// The sampling rate falls as the cache holds more entries: the smallest power
// of two >= 64 / n, within [1/32, 1], n the entries held at the first
// eviction, the newcomer whose put evicts included.
TEST(AdaptiveTest, SamplingRateFollowsTheEntriesAtTheFirstEviction) {
  const struct {
    int held;
    double rate;
  } cases[] = {{4, 1.0},    {127, 1.0},       {128, 0.5},       {255, 0.5},
               {256, 0.25}, {2047, 1.0 / 16}, {2048, 1.0 / 32}, {100000, 1.0 / 32}};
  for (const auto& k : cases) {
    const int fit = k.held - 1;
    Cache c(static_cast<std::int64_t>(fit) * 10, CacheOptions{EvictionPolicy::kAdaptive});
    for (int i = 0; i < fit; ++i) c.Put(std::to_string(i), 0, 10, {0.01});
    EXPECT_EQ(c.duel(), nullptr) << k.held;
    c.Put("one more", 0, 10, {0.01});
    ASSERT_NE(c.duel(), nullptr) << k.held;
    EXPECT_DOUBLE_EQ(c.duel()->rate(), k.rate) << k.held;
  }
}

TEST(AdaptiveTest, NoDuelWithoutEvictions) {
  Cache c(0, CacheOptions{EvictionPolicy::kAdaptive});
  EXPECT_TRUE(c.Put("empty", 0, 0, {0.5}));
  EXPECT_FALSE(c.Put("big", 0, 1, {0.5}));
  EXPECT_TRUE(c.Get("empty").has_value());
  EXPECT_EQ(c.duel(), nullptr);
  EXPECT_EQ(c.evictions(), 0u);
}

// The duel's miniatures are bookkeeping: counted in bookkeeping_bytes().
TEST(AdaptiveTest, BookkeepingCountsTheMiniatures) {
  Cache gdsf(1000, CacheOptions{EvictionPolicy::kGdsf});
  Cache adaptive(1000, CacheOptions{EvictionPolicy::kAdaptive});
  for (int i = 0; i < 200; ++i) {
    gdsf.Put(std::to_string(i % 30), 0, 100, {0.01});
    adaptive.Put(std::to_string(i % 30), 0, 100, {0.01});
  }
  ASSERT_NE(adaptive.duel(), nullptr);
  EXPECT_GE(adaptive.bookkeeping_bytes(), gdsf.bookkeeping_bytes() + adaptive.duel()->memory_bytes());
}

// In a tiered cache L2's hits are promotions (PopRequested), not Gets: they
// must reach L2's duel, or under kAdaptive L2 would score nothing and stay
// with GDSF whatever the workload. The recency workload with L1 of two
// entries and L2 of four: the second turns are served by L2.
TEST(AdaptiveTest, PromotionsOutOfL2AreRequestsToItsDuel) {
  TieredOptions o;
  o.eviction = EvictionPolicy::kAdaptive;
  TieredEmbeddingCache<std::string, int> t(200, 400, o);
  std::uint64_t l2_hits = 0;
  RecencyWorkload::Run([&](const std::string& k, std::int64_t n, double s) {
    CacheTier tier;
    if (t.Get(k, &tier).has_value()) {
      l2_hits += tier == CacheTier::kL2;
      return;
    }
    t.Put(k, 0, n, {s});
  });
  EXPECT_GT(l2_hits, 100u);
  ASSERT_NE(t.l2().duel(), nullptr);
  EXPECT_GT(t.l2().duel()->lru_score() + t.l2().duel()->gdsf_score(), 0);
  EXPECT_TRUE(t.l2().duel()->lru_leads());
}

// Under kLru and kGdsf PopRequested is Pop: no duel, nothing counted.
class PopRequestedTest : public ::testing::TestWithParam<EvictionPolicy> {};

TEST_P(PopRequestedTest, IsPopOutsideAdaptive) {
  Cache c(200, CacheOptions{GetParam()});
  c.Put("a", 7, 100, {0.5});
  c.Put("b", 8, 100, {0.5});
  c.Put("c", 9, 100, {0.5});
  auto popped = c.PopRequested("c");
  ASSERT_TRUE(popped.has_value());
  EXPECT_EQ(popped->value, 9);
  EXPECT_EQ(popped->nbytes, 100);
  EXPECT_FALSE(c.PopRequested("c").has_value());
  EXPECT_EQ(c.hits(), 0u);
  EXPECT_EQ(c.misses(), 0u);
  EXPECT_EQ(c.duel(), nullptr);
}
INSTANTIATE_TEST_SUITE_P(Policies, PopRequestedTest, ::testing::Values(EvictionPolicy::kLru, EvictionPolicy::kGdsf),
                         [](const auto& info) { return std::string(EvictionPolicyName(info.param)); });

}  // namespace
}  // namespace epd
