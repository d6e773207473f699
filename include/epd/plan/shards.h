// epd/plan/shards.h: SHARDS, spatially hashed sampling for miss-ratio curves
// in bounded memory (Waldspurger, Park, Garthwaite, Ahmad, "Efficient MRC
// Construction with SHARDS", FAST 2015), fixed-size variant.
//
// A key is sampled iff mix(key) < T, where mix is the SplitMix64 finaliser
// (a bijection on 64 bits) and T / 2^64 = R is the sampling rate. Sampling
// by key, not by access, keeps every access of a sampled key, so the sampled
// keys' stack distances (epd/plan/stack_distance.h) scaled by 1 / R estimate
// the full trace's. Each sampled access is recorded with weight w / R in a
// bucketed ReuseHistogram; every access adds w to the true total.
//
// Estimator: the tail's recorded weight is rescaled so that it sums to the
// tail's true weight (total minus the head's, both known exactly), a ratio
// estimator over the post-stratified sample: this cancels the noise in how
// many accesses the sampled keys happen to carry, the main error of the plain
// SHARDS_adj correction (which adds the shortfall as hits at distance 0) on
// traces whose keys are all warm. Without a head the ratio is over the whole
// sample, plain SHARDS's normalisation.
//
// Fixed size: with max_keys > 0, when more than max_keys keys are sampled
// the one with the largest mix(key) leaves the sample, T drops to that value
// and the key's bytes leave the stack, so memory stays bounded whatever the
// trace; later accesses are scaled by the new, lower rate (a Horvitz-Thompson
// weight per access, in place of the paper's rescaling of the histogram;
// both keep the estimate unbiased for the current sample).
//
// Head: keys listed in ShardsOptions::exact_keys (HeavyHitters finds them in
// a first pass) are tracked at rate 1, weight 1, in a stack class of their
// own; the sampled tail's bytes above an access are scaled by 1 / R and the
// head's are not. Sampling error comes from which keys land in the sample,
// weighted by their accesses, so a Zipf-like trace's few hottest keys
// dominate it; tracking them exactly removes that part (stratified
// sampling), at ~80 bytes per head key.
//
// Memory: about 80 bytes per sampled key (stack index, Fenwick positions,
// the max-heap of sampled hashes) plus the histogram's ~130 KB;
// memory_bytes() reports it. The MAE against the exact curve is tested in
// src/plan/mrc_test.cc and measured in docs/BENCHMARKS.md.
// Complexity: O(1) per unsampled access, O(log s) per sampled one.
// Thread safety: thread-compatible.
//
// Example:
//   ShardsSampler s({.rate = 0.01, .max_keys = 100000});
//   for (const CacheAccess& a : trace) s.Access(a);
//   s.histogram().MissRatioAt(8LL << 30);
#pragma once

#include <cstdint>
#include <queue>
#include <span>
#include <unordered_set>
#include <utility>
#include <vector>

#include "epd/plan/miss_ratio_curve.h"
#include "epd/plan/stack_distance.h"

namespace epd {

struct ShardsOptions {
  double rate = 0.01;                          // initial sampling rate, in (0, 1]
  std::size_t max_keys = 0;                    // sampled tail keys kept at most; 0 = fixed rate, unbounded
  std::vector<std::uint64_t> exact_keys = {};  // the head, tracked at rate 1
};

// The keys of `trace` requested more than n / (k + 1) times, and perhaps a
// few less frequent ones (at most k keys), most frequent first by their
// Misra-Gries counts (so a prefix is a smaller head): Misra and Gries, "Finding repeated
// elements", Science of Computer Programming 1982. O(n) amortised, k
// counters of memory.
std::vector<std::uint64_t> HeavyHitters(std::span<const CacheAccess> trace, std::size_t k);

class ShardsSampler {
 public:
  // Throws epd::Error(kInvalidArgument) unless 0 < rate <= 1.
  explicit ShardsSampler(const ShardsOptions& options);

  void Access(const CacheAccess& a);

  // The estimated histogram (head + rescaled tail); built on each call, O(buckets).
  ReuseHistogram histogram() const;
  double rate() const;  // the current rate
  std::size_t sampled_keys() const { return stack_.keys(); }
  std::size_t head_keys() const { return head_.size(); }
  std::uint64_t sampled_accesses() const { return sampled_; }
  std::uint64_t accesses() const { return accesses_; }
  // Bytes held by the sampler: the stack, the heap and the histogram.
  std::size_t memory_bytes() const;
  // The mixed hash the sampler compares with its threshold.
  static std::uint64_t Mix(std::uint64_t key);

 private:
  ShardsOptions options_;
  std::uint64_t threshold_;  // sample iff Mix(key) < threshold_ (or always when full_rate_)
  bool full_rate_;
  std::unordered_set<std::uint64_t> head_;
  std::size_t tail_keys_ = 0;
  ByteStackDistance stack_;
  std::priority_queue<std::pair<std::uint64_t, std::uint64_t>> heap_;  // (Mix(key), key), largest first
  ReuseHistogram head_hist_{ReuseHistogram::Mode::kBucketed};
  ReuseHistogram tail_hist_{ReuseHistogram::Mode::kBucketed};
  Weights total_;
  std::uint64_t sampled_ = 0;
  std::uint64_t accesses_ = 0;
};

}  // namespace epd
