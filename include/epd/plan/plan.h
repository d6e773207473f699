// epd/plan/plan.h: what `epd-encode plan` computes from a cache trace: the
// miss-ratio curves, the tier sizes for a share of the encode seconds an
// infinite cache would save, the hit ratios those sizes are predicted to
// give, and the hit ratios a replay of the trace through the real caches at
// those sizes gives (docs/PLAN.md).
//
// Curves (epd/plan/miss_ratio_curve.h and friends):
//   - LRU: exact stack distances for traces up to exact_max requests,
//     SHARDS above (shards_rate on the tail, the shards_head hottest keys
//     exactly, at most shards_max_keys tail keys);
//   - GDSF and GDSF + doorkeeper: MiniSim at minisim_rate.
// Sizing: for each target t (0.8, 0.9, 0.95), the smallest total capacity
// whose encode-seconds hit ratio on the policy's curve (GDSF's also with the
// doorkeeper, which gates L1 alone) is t x the trace's maximum (an infinite
// cache: everything but cold misses, counted from the trace). The total
// fills L1 up to l1_max_bytes, then L2 up to l2_max_bytes, then L3. L1 and
// L2 are exclusive; L3 is Redis, written through with every tower result
// and LRU, so it holds copies of what L1 and L2 hold (plan_tiers.h); where
// the split leaves L3 a share, L3 starts at no less than the LRU curve's
// capacity for the target in the bytes Redis charges (RedisChargeBytes:
// the entry's bytes times one measured overhead factor, at least a byte;
// exact stack distances over the charged sizes up to exact_max requests,
// the sampled curve times the working set's charge ratio above). The
// predicted hit ratios (L1, L1 + L2, all tiers) come from a miniature of the
// tiers at those sizes (plan_tiers.h: the keys sampled at the MiniSim rate
// plus the head, through the real tiers scaled down), since the tiered L1
// ranks by promotion cost and keeps other entries than one cache on the
// curve would, L3 duplicates, and the curve is interpolated between its
// capacities (at a steep knee the two differ by points). Where the
// miniature at the curve's total misses t x the maximum by more than half a
// point either way, the total moves to the smallest one whose miniature
// reaches it (doublings or halvings to bracket it, at most 20, then 6
// bisections in log space; src/plan/plan.cc, Refine), so the sizes printed give the
// share asked for by the same estimate that predicts them. A row past the
// curve's end starts where the curve comes within 0.1 % of its end.
// Replay (plan_tiers.h; only with PlanOptions::replay): the same tiers at
// full scale, every request. It is the check of the prediction, not part
// of it: each replay runs every request through the
// real caches (on a 10^7-request trace about 35 s of CPU per row, where the
// rest of the plan takes about 40 s).
//
// Parallelism: the four curves run as four tasks, then the miniatures and
// replays one task per row each, on up to PlanOptions::threads threads.
// Each task owns its caches and writes its own slot of the result, so the
// result does not depend on the thread count or the schedule.
//
// Thread safety: pure functions; thread-safe. options.progress is called
// from the tasks' threads, one call at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "epd/core/embedding_cache.h"
#include "epd/core/tiered_cache.h"
#include "epd/plan/miss_ratio_curve.h"

namespace epd::plan {

struct PlanOptions {
  EvictionPolicy eviction = EvictionPolicy::kGdsf;
  L1Admission l1_admission = L1Admission::kNone;
  std::vector<double> targets = {0.8, 0.9, 0.95};
  double l1_max_bytes = 16e9;   // device memory the cache may take
  double l2_max_bytes = 256e9;  // host memory the cache may take
  std::size_t exact_max = 1'000'000;
  double shards_rate = 0.05;
  std::size_t shards_max_keys = 131072;
  std::size_t shards_head = 8192;
  double minisim_rate = 0.05;
  std::size_t minisim_head = 2048;
  std::uint64_t doorkeeper_window = 1 << 16;
  // The window the worker is to run (SizingRow::serve_args; 0: doorkeeper_window).
  // A caller that caps doorkeeper_window at the trace's length, where a
  // longer one never ends, gives the uncapped one here: a server runs on
  // past the trace.
  std::uint64_t worker_window = 0;
  int points = 24;
  bool replay = true;    // replay the trace through the real tiers at each row's sizes
  unsigned threads = 0;  // tasks run at once; 0: std::thread::hardware_concurrency()
  // (phase, done, total) at most every few percent, for a progress bar.
  std::function<void(const char*, std::size_t, std::size_t)> progress;
};

struct TierHits {
  Weights l1, l2, l3, miss;  // weight served by each, or missed
  std::int64_t l1_write_bytes = 0;
  double Ratio(const Weights& w, Weighting by) const;  // w / total by `by`
  Weights Total() const;
};

struct SizingRow {
  double target = 0;        // share of the maximum encode-seconds hit ratio
  double hit_ratio = 0;     // target x maximum: the encode-seconds hit ratio asked for
  double total_bytes = -1;  // -1: not reachable on the curve
  double l1_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  // Encode-seconds hit ratios from a miniature of the three tiers
  // (plan_tiers.h) at tiers_rate: L1, L1 + L2 and all tiers.
  double predicted_l1 = 0, predicted_l12 = 0, predicted_all = 0;
  // The policy's curve at total_bytes, L3's share in the entries' bytes
  // (over the trace's Redis charge ratio): what the sizing read (one cache
  // of that size, interpolated between the curve's capacities).
  double curve_all = 0;
  // Miniatures run for the row: 1, or more where the curve's total missed
  // the target in the miniature by over half a point and the total was
  // moved to the smallest one whose miniature reaches it (bisection).
  int miniatures = 0;
  // The miniature at the final sizes gives the target, to within half a
  // point; false where no total up to 1.25 x the working set plus the L1 and
  // L2 limits did (the tiers' limits can cap it: an L1 or L2 smaller than the
  // entries, the doorkeeper).
  bool reached = true;
  double tiers_rate = 1;
  TierHits replayed;  // empty unless PlanResult::replayed
  // The worker flags that run this row's L1 and L2 (plan_serve_args.h);
  // empty where the row is unreachable.
  std::string serve_args;
};

struct PlanResult {
  std::size_t requests = 0;
  std::size_t distinct_keys = 0;
  double working_set_bytes = 0;  // bytes of the distinct keys
  // ... as a Redis holding them all charges them (plan_tiers.h,
  // RedisChargeBytes): what L3's sizes are in.
  double working_set_redis_bytes = 0;
  double largest_entry = 0;
  double total_seconds = 0;
  // An infinite cache's: every access but a key's first, counted from the
  // trace (exact also when the curves are sampled).
  Weights max_hit_ratio;
  bool exact = true;
  double shards_rate = 1;               // final tail rate (SHARDS only)
  std::size_t shards_sampled_keys = 0;  // keys in the sample at the end (head and tail)
  std::size_t shards_head = 0;
  double sampled_fraction = 1;  // accesses the stack processed
  std::size_t sampler_bytes = 0;
  std::vector<MissRatioCurve> curves;  // [0] LRU, then gdsf, gdsf+doorkeeper, adaptive
  std::string policy;                  // the sized policy's name
  std::vector<SizingRow> rows;
  bool replayed = false;  // rows carry a replay (PlanOptions::replay)
  // What the user should know about the result's accuracy (a SHARDS sample
  // whose curve ends over 0.01 from max_hit_ratio): one sentence each.
  std::vector<std::string> warnings;
  // Wall seconds: the curves (from the first pass over the trace), the
  // sizing rows' miniatures and replays.
  double curves_s = 0, replay_s = 0;
};

// Throws std::invalid_argument, naming the sum, when the trace's distinct
// keys hold more than kMaxCacheBytes (2^62 - 1) bytes in all.
PlanResult RunPlan(std::span<const CacheAccess> trace, const PlanOptions& options);

// Replays the trace through exclusive L1/L2/L3 caches (see above).
TierHits ReplayTiers(std::span<const CacheAccess> trace, double l1, double l2, double l3, const PlanOptions& options);

// The report as text tables, and as one JSON object (docs/PLAN.md, "What it
// prints"); plan_report.cc. Pure.
std::string PlanText(const PlanResult& r);
std::string PlanJson(const PlanResult& r);

// Bytes in decimal units, about three significant figures ("3.57 GB",
// "512 B"); "-" for a negative count (an unreachable row). plan_report.cc.
std::string Gb(double bytes);

}  // namespace epd::plan
