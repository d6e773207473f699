// The per-tier prediction of `epd-encode plan` (a miniature of the tiered
// cache, plan_tiers.h) against a full replay of the same trace through the
// real TieredEmbeddingCache and an LRU L3 EmbeddingCache written through,
// as Redis runs it, written here as the oracle (its own loop, not
// TierReplayer). Issue 26: the predicted hit
// ratios at the recommended sizes within 2 points of the replayed ones.
#include "epd/plan/plan_tiers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace epd::plan {
namespace {

// Zipf(s) popularity over `keys` keys (std::discrete_distribution over 1 / rank^s),
// each key with a size of 200 to 2000 bytes and a cost per byte spread 10x.
std::vector<CacheAccess> Workload(unsigned seed, int keys, int requests, double s) {
  std::mt19937_64 rng(seed);
  std::vector<double> popularity(keys);
  for (int r = 0; r < keys; ++r) popularity[r] = std::pow(r + 1.0, -s);
  std::discrete_distribution<int> pick(popularity.begin(), popularity.end());
  std::uniform_int_distribution<std::int64_t> size(200, 2000);
  std::uniform_real_distribution<double> per_byte(1e-7, 1e-6);
  std::vector<std::int64_t> bytes(keys);
  std::vector<double> seconds(keys);
  for (int k = 0; k < keys; ++k) {
    bytes[k] = size(rng);
    seconds[k] = static_cast<double>(bytes[k]) * per_byte(rng);
  }
  std::vector<CacheAccess> out;
  out.reserve(requests);
  for (int i = 0; i < requests; ++i) {
    const int k = pick(rng);
    out.push_back({ShardsSampler::Mix(0x5eed0000ULL + static_cast<std::uint64_t>(k)), bytes[k], seconds[k]});
  }
  return out;
}

double WorkingSet(const std::vector<CacheAccess>& trace) {
  std::unordered_set<std::uint64_t> seen;
  double total = 0;
  for (const CacheAccess& a : trace) {
    if (seen.insert(a.key).second) total += static_cast<double>(a.bytes);
  }
  return total;
}

// Encode-seconds hit ratios of L1, L1 + L2 and all three, by a full replay.
struct Replayed {
  double l1 = 0, l12 = 0, all = 0;
};

Replayed Oracle(const std::vector<CacheAccess>& trace, const TierSizes& s, const PlanOptions& o) {
  TieredOptions to;
  to.eviction = o.eviction;
  to.l1_admission = o.l1_admission;
  to.admission.window = o.doorkeeper_window;
  to.keep_oversize_in_l2 = true;
  // The cache's hash is the plan's: the doorkeeper's sketch is indexed by it.
  TieredEmbeddingCache<std::uint64_t, char, TierKeyHash> tiers(static_cast<std::int64_t>(s.l1),
                                                               static_cast<std::int64_t>(s.l2), to);
  // L3 as Redis runs it (docs/L3.md): LRU over all keys, written with every
  // tower result, read on an L1/L2 miss, keeping what it serves; L2's
  // victims are dropped. Each value charged what Redis charges for it
  // (RedisChargeBytes; plan_redis_test checks it against a real Redis).
  EmbeddingCache<std::uint64_t, char, TierKeyHash> l3(static_cast<std::int64_t>(s.l3),
                                                      CacheOptions{EvictionPolicy::kLru});
  double l1 = 0, l2 = 0, l3_hits = 0, total = 0;
  for (const CacheAccess& a : trace) {
    total += a.seconds;
    CacheTier where;
    if (tiers.Get(a.key, &where)) {
      (where == CacheTier::kL1 ? l1 : l2) += a.seconds;
      continue;
    }
    const bool in_l3 = l3.Get(a.key).has_value();
    if (in_l3) l3_hits += a.seconds;
    tiers.Put(a.key, 0, a.bytes, {a.seconds});
    if (!in_l3) l3.Put(a.key, 0, RedisChargeBytes(a.bytes), {a.seconds});
  }
  return {l1 / total, (l1 + l2) / total, (l1 + l2 + l3_hits) / total};
}

Replayed Predicted(const TierHits& h) {
  const double l1 = h.Ratio(h.l1, Weighting::kSeconds), l2 = h.Ratio(h.l2, Weighting::kSeconds);
  return {l1, l1 + l2, l1 + l2 + h.Ratio(h.l3, Weighting::kSeconds)};
}

struct Case {
  EvictionPolicy eviction;
  L1Admission admission;
  double l1, l2, l3;  // shares of the working set

  // The case's policy with a doorkeeper window of `window` requests.
  PlanOptions Options(std::uint64_t window) const {
    PlanOptions o;
    o.eviction = eviction;
    o.l1_admission = admission;
    o.doorkeeper_window = window;
    return o;
  }
  // The case's tier sizes over a working set of `ws` bytes.
  TierSizes Sizes(double ws) const { return TierSizes{l1 * ws, l2 * ws, l3 * ws}; }
};

class PlanTiersTest : public ::testing::TestWithParam<Case> {};

// At rate 1 the miniature is the full replay: equal to the oracle.
TEST_P(PlanTiersTest, FullRateEqualsTheReplay) {
  const Case c = GetParam();
  const std::vector<CacheAccess> trace = Workload(11, 20000, 100000, 0.9);
  const TierSizes sizes = c.Sizes(WorkingSet(trace));
  const PlanOptions o = c.Options(4096);
  const Replayed want = Oracle(trace, sizes, o);
  const Replayed got = Predicted(SimulateTiers(SampleTrace(trace, 1.0, {}), sizes, o));
  EXPECT_NEAR(got.l1, want.l1, 1e-12);
  EXPECT_NEAR(got.l12, want.l12, 1e-12);
  EXPECT_NEAR(got.all, want.all, 1e-12);
  const Replayed full = Predicted(ReplayTiers(trace, sizes.l1, sizes.l2, sizes.l3, o));
  EXPECT_NEAR(full.l1, want.l1, 1e-12);
  EXPECT_NEAR(full.all, want.all, 1e-12);
}

// At a 10% sample (plus the 2048 hottest keys) every tier is within 2 points
// of the full replay, over three traces.
TEST_P(PlanTiersTest, SampledPredictionIsWithinTwoPointsOfTheReplay) {
  const Case c = GetParam();
  for (unsigned seed : {21u, 22u, 23u}) {
    const std::vector<CacheAccess> trace = Workload(seed, 100000, 600000, 0.9);
    const TierSizes sizes = c.Sizes(WorkingSet(trace));
    const PlanOptions o = c.Options(65536);
    const Replayed want = Oracle(trace, sizes, o);
    const TierSample sample = SampleTrace(trace, 0.1, HeavyHitters(trace, 2048));
    EXPECT_LT(sample.accesses.size(), trace.size() / 2);
    const Replayed got = Predicted(SimulateTiers(sample, sizes, o));
    EXPECT_NEAR(got.l1, want.l1, 0.02) << "seed " << seed;
    EXPECT_NEAR(got.l12, want.l12, 0.02) << "seed " << seed;
    EXPECT_NEAR(got.all, want.all, 0.02) << "seed " << seed;
    EXPECT_GT(want.l1, 0.05) << "the L1 under test serves something";
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, PlanTiersTest,
                         ::testing::Values(Case{EvictionPolicy::kGdsf, L1Admission::kNone, 0.01, 0.05, 0.2},
                                           Case{EvictionPolicy::kGdsf, L1Admission::kDoorkeeper, 0.01, 0.05, 0.2},
                                           Case{EvictionPolicy::kLru, L1Admission::kNone, 0.02, 0.1, 0.3}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(EvictionPolicyName(info.param.eviction)) +
                                  (info.param.admission == L1Admission::kDoorkeeper ? "_doorkeeper" : "");
                         });

// L3 as Redis runs it: every miss written through, LRU over its own reads
// and writes, a hit kept there. One entry per tier above it and three in L3,
// under LRU; worked by hand:
//   A, B, C  misses; L1 C, L2 B (A dropped); L3 A B C
//   A        L3 hit (kept, now most recent: B C A); L1 A, L2 C (B dropped)
//   D        miss; L1 D, L2 A (C dropped); L3 writes D and evicts B: C A D
//   B        miss (an exclusive L3 fed L2's victims would hold B); L3: A D B
//   C        miss
// L3 holds three values of 100-byte entries: 3 x 110 bytes as Redis charges
// them (EntryBytesTimesTheOverheadFactor below).
TEST(TierReplayerTest, L3IsWrittenThroughWithEveryMissAndKeepsWhatItServes) {
  PlanOptions o;
  o.eviction = EvictionPolicy::kLru;
  TierReplayer r({100, 100, 3 * 110}, 1.0, o);
  for (char k : std::string("ABCADBC")) r.Access({static_cast<std::uint64_t>(k), 100, 1.0}, false);
  const TierHits h = r.Hits({}, {});
  EXPECT_EQ(h.l1.objects, 0);
  EXPECT_EQ(h.l2.objects, 0);
  EXPECT_EQ(h.l3.objects, 1);
  EXPECT_EQ(h.miss.objects, 6);
  // Then L1 holds C and L2 B: a read of B is an L2 hit, and L3 is not read.
  r.Access({'B', 100, 1.0}, false);
  EXPECT_EQ(r.Hits({}, {}).l2.objects, 1);
  EXPECT_EQ(r.Hits({}, {}).l3.objects, 1);
}

// One factor over the entry's bytes (kRedisOverheadFactor, 1.100), rounded
// up to a byte; worked by hand.
TEST(RedisChargeTest, EntryBytesTimesTheOverheadFactor) {
  EXPECT_EQ(RedisChargeBytes(100), 110);
  // 560 tokens of Qwen2.5-VL-7B (3584 x bf16): 4,014,080 bytes.
  EXPECT_EQ(RedisChargeBytes(4014080), 4415488);
  EXPECT_EQ(RedisChargeBytes(1), 2);   // 1.1 rounds up
  EXPECT_EQ(RedisChargeBytes(0), 1);   // the tiers hold an empty entry in a byte
  EXPECT_EQ(RedisChargeBytes(-5), 1);  // a negative size counts as 0
  // Saturates at what a cache takes, so that the largest entry a trace may hold is charged, not refused.
  EXPECT_EQ(RedisChargeBytes(std::numeric_limits<std::int64_t>::max()), kMaxCacheBytes);
  EXPECT_EQ(RedisChargeBytes(kMaxCacheBytes - 1000), kMaxCacheBytes);
  // Near the cap, exact: 1.1 x 4,192,441,834,933,989,000 = 4,611,686,018,427,387,900 (2^62 - 1 is ...903).
  EXPECT_EQ(RedisChargeBytes(4192441834933989000), 4611686018427387900);
}

TEST(TierRateTest, RaisedUntilTheSmallerTierHoldsEnoughEntries) {
  EXPECT_EQ(TierRate(0.05, {1e6, 1e7, 0}, 1000), 0.05 * 2);  // 1e6 x 0.05 = 50 entries < 64; x 2: 100
  EXPECT_EQ(TierRate(0.05, {1e9, 1e10, 1}, 1000), 0.05);     // L3 does not count
  EXPECT_EQ(TierRate(0.05, {100, 1e10, 0}, 1000), 1.0);      // capped at 1
  EXPECT_EQ(TierRate(0.05, {0, 0, 1e9}, 1000), 0.05);        // no L1 or L2
}

}  // namespace
}  // namespace epd::plan
