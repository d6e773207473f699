// epd/plan/plan_tiers.h: a cache trace replayed through the tiers `epd-encode
// plan` recommends, in full (the check) or in miniature (the per-tier
// prediction), through the same code, modelled on what a server runs
// (docs/L3.md): a TieredEmbeddingCache (L1, L2; exclusive: L2 takes L1's
// victims, an L2 hit moves up) with the plan's policy, and an L3 that is
// Redis under `maxmemory-policy allkeys-lru`: an LRU EmbeddingCache written
// through with every tower result (a miss), read on each L1/L2 miss (a GET
// makes the key most recent; a hit keeps it there and copies the value into
// the tiers, as the worker adopts it), and never fed L2's victims (they are
// dropped: L3 has them already, unless it evicted them). So L3 holds copies
// of what L1 and L2 hold, and its size is what Redis itself needs. An entry
// goes where the worker puts it (src/worker/worker_cache.h): into L1;
// straight into L2 when L1 is too small for it (the L2-only rule, served
// from L2 thereafter: TieredOptions::keep_oversize_in_l2); into L3 alone
// when L2 is too small as well. L3 charges each entry what Redis charges
// against `maxmemory` for its value (RedisChargeBytes below: one measured
// factor over the entry's bytes), so the L3 size is the `maxmemory` to set; it is exact LRU, where Redis samples keys
// for its LRU (maxmemory-samples).
//
// The miniature (MiniSim, Waldspurger et al., USENIX ATC 2017, applied to
// the whole tiered cache rather than to one cache): the keys with
// ShardsSampler::Mix(key) < R x 2^64, every access of each, are replayed
// through tiers of R x (L1, L2, L3) bytes, with the doorkeeper's window
// scaled by the share of the trace's requests replayed. The head (the hottest keys, HeavyHitters) is replayed at rate
// 1 with its charge and its cost both scaled by R, so that it takes its
// share of the scaled capacity and GDSF ranks it by the same cost per byte
// as at full scale. Estimates: the head's weights as they are, the sampled
// tail's scaled to the tail's true weight (post-stratified, as MiniSim and
// SHARDS do here: epd/plan/mini_sim.h).
//
// Units: capacities and charges in bytes, costs in encode seconds.
// Complexity: O(log n) per replayed access (the caches' GDSF heaps).
// Thread safety: thread-compatible.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <unordered_set>
#include <vector>

#include "epd/core/embedding_cache.h"
#include "epd/core/tiered_cache.h"
#include "epd/plan/plan.h"
#include "epd/plan/shards.h"

namespace epd::plan {

// The largest capacity the caches take, as a double: kMaxCacheBytes
// (2^62 - 1) rounds up to 2^62, which they refuse, so one ulp under it
// (2^62 - 512).
inline double LargestCapacity() { return std::nextafter(static_cast<double>(kMaxCacheBytes), 0.0); }

// L3's bytes in Redis per byte of entry: what a Redis holding L3 values
// adds to `used_memory` (the figure `maxmemory` bounds) over the entries'
// bytes. Measured, not modelled: docs/PLAN.md, "What Redis charges a value", gives
// the population, the Redis version and the tolerance, and
// src/plan/plan_redis_test.cc measures it against a real redis-server.
// In thousandths, so that a charge is exact integer arithmetic.
inline constexpr std::int64_t kRedisOverheadPerMille = 1100;
inline constexpr double kRedisOverheadFactor = static_cast<double>(kRedisOverheadPerMille) / 1000;

// What Redis charges an entry of `entry_bytes` bytes, bytes: entry_bytes x
// kRedisOverheadFactor rounded up, at least 1 (the tiers hold an empty entry
// in a byte too), at most kMaxCacheBytes (what a cache takes). A negative
// size counts as 0. O(1); thread-safe.
std::int64_t RedisChargeBytes(std::int64_t entry_bytes);

// The full-scale sizes of the three tiers, bytes.
struct TierSizes {
  double l1 = 0, l2 = 0, l3 = 0;
};

// The caches' hash. Trace keys are already 64-bit hashes (KeyHash: FNV-1a
// and the SplitMix64 finaliser), but the miniature picks its keys by
// ShardsSampler::Mix(key) < R x 2^64, and the adaptive policy's duel and
// the doorkeeper's sketch would pick and index by the same Mix of this
// hash: all of a miniature's keys would fall into a corner of theirs (the
// duel at rate 1/32 would see every sampled key, or a share of 1/(32 R)).
// A multiply by an odd constant (the golden ratio's, Knuth's multiplicative
// hashing) and a rotation decorrelate it, and stay a bijection.
struct TierKeyHash {
  std::size_t operator()(std::uint64_t k) const {
    const std::uint64_t x = k * 0x9e3779b97f4a7c15ULL;
    return static_cast<std::size_t>((x << 29) | (x >> 35));
  }
};

class TierReplayer {
 public:
  // Tiers of rate x sizes bytes, the doorkeeper's window scaled by `share`
  // (the share of the trace's requests this replay sees; <= 0: `rate`).
  // REQUIRES: 0 < rate <= 1.
  TierReplayer(const TierSizes& sizes, double rate, const PlanOptions& options, double share = 0);
  TierReplayer(const TierReplayer&) = delete;
  TierReplayer& operator=(const TierReplayer&) = delete;

  // One request; `head`: a head key, charged x rate (see above).
  void Access(const CacheAccess& a, bool head);

  // The weights served per tier, at full scale, for a trace whose accesses
  // weigh `total` and whose head accesses weigh `head_total`. At rate 1
  // (the full replay) the sums as counted. l1_write_bytes is the
  // miniature's divided by the rate.
  TierHits Hits(const Weights& total, const Weights& head_total) const;

  // Entries L3 holds now.
  std::size_t l3_entries() const { return bottom_.size(); }

 private:
  // Puts a miss, or an L3 hit copied up, into the tiers where the worker would (above).
  void PlaceInTiers(std::uint64_t key, std::int64_t nbytes, const EntryCost& cost);

  double rate_;
  TieredEmbeddingCache<std::uint64_t, char, TierKeyHash> tiers_;
  EmbeddingCache<std::uint64_t, char, TierKeyHash> bottom_;
  TierHits head_, tail_;
};

// The accesses a miniature at `rate` replays, in trace order, with whether
// each is a head key; and the whole trace's and the head's weights.
struct TierSample {
  double rate = 1;
  std::vector<const CacheAccess*> accesses;
  std::vector<bool> head;
  Weights total, head_total;
};

// One pass over the trace. REQUIRES: 0 < rate <= 1; `trace` outlives the result.
TierSample SampleTrace(std::span<const CacheAccess> trace, double rate, std::span<const std::uint64_t> head_keys);

// The miniature's estimate of the full replay at `sizes` (see above).
TierHits SimulateTiers(const TierSample& sample, const TierSizes& sizes, const PlanOptions& options);

// The rate for a miniature of these sizes: `base`, raised in doublings up
// to 1 until R x the smaller of L1 and L2 (of those not 0) holds
// `min_entries` entries of `mean_bytes` (L3 is left out: a small L3 serves
// little, and would raise the rate for all).
double TierRate(double base, const TierSizes& sizes, double mean_bytes, double min_entries = 64);

}  // namespace epd::plan
