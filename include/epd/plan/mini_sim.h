// epd/plan/mini_sim.h: miss-ratio curves of policies that stack distances do
// not describe (GDSF, an admission filter), by miniature simulation
// (Waldspurger, Saemundsson, Ahmad, Park, "Cache Modeling and Optimization
// using Miniature Simulations", USENIX ATC 2017).
//
// For a capacity C, the trace is sampled spatially at rate R (the keys with
// ShardsSampler::Mix(key) < R x 2^64, every access of each) and replayed
// through a real EmbeddingCache of C x R bytes under the policy, with the
// doorkeeper's window scaled by the share of the trace's requests replayed
// (R, or more with the exactly kept hot keys); the sampled trace's miss ratio by
// objects, bytes and seconds estimates the full cache's. R is the base rate,
// raised (in doublings, up to 1) for small capacities until the scaled cache
// holds at least min_entries entries of the trace's mean size: a miniature
// cache of a handful of entries is too coarse. R = 1 replays the whole trace.
//
// The doorkeeper policy here is a single cache guarded by an AdmissionFilter
// (epd/core/admission_filter.h): an entry is put only on its second request
// within a window. In TieredEmbeddingCache such an entry goes to L2 instead,
// so this is L1's curve; L1 + L2 together are nearer the policy without it.
//
// Complexity: O(sum over capacities of R x n x log) cache operations.
// Thread safety: pure function; thread-safe.
//
// Example:
//   SimPolicy gdsf{EvictionPolicy::kGdsf, false};
//   MissRatioCurve c = SimulateCurve(trace, gdsf, LogCapacities(1e9, 1e12, 24), {});
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "epd/core/embedding_cache.h"
#include "epd/plan/miss_ratio_curve.h"

namespace epd {

struct SimPolicy {
  EvictionPolicy eviction = EvictionPolicy::kLru;
  bool doorkeeper = false;
  // "lru", "gdsf", "gdsf+doorkeeper", ...
  std::string Name() const;
};

struct MiniSimOptions {
  double rate = 0.05;                          // base sampling rate, in (0, 1]
  double min_entries = 64;                     // the scaled cache holds at least this many mean-size entries
  std::uint64_t doorkeeper_window = 1 << 16;   // requests, at full scale
  std::vector<std::uint64_t> exact_keys = {};  // the head, kept at rate 1 (HeavyHitters)
};

// What one simulated cache did.
struct SimResult {
  double capacity_bytes = 0;     // the full-scale capacity simulated
  double rate = 1;               // the sampling rate used
  Weights total;                 // the trace's weight
  Weights hits;                  // estimated weight that hits at full scale
  std::int64_t write_bytes = 0;  // bytes put into the miniature cache (sampled, unscaled; stops at INT64_MAX)
  std::uint64_t simulated = 0;   // accesses the miniature saw
  Weights MissRatio() const;     // (total - hits) / total per weighting, in [0, 1]; 1 where total is 0
};

// Simulates one capacity (see above). REQUIRES: 0 < options.rate <= 1.
SimResult SimulateCapacity(std::span<const CacheAccess> trace, const SimPolicy& policy, double capacity_bytes,
                           const MiniSimOptions& options);

// SimulateCapacity at each capacity, as a curve labelled with the policy and rate.
MissRatioCurve SimulateCurve(std::span<const CacheAccess> trace, const SimPolicy& policy,
                             std::span<const double> capacities, const MiniSimOptions& options);

}  // namespace epd
