// epd/plan/miss_ratio_curve.h: miss-ratio curves of a cache trace, weighted
// by objects, bytes and encode seconds.
//
// A trace is a sequence of CacheAccess: one per item request, with the key's
// 64-bit hash, its entry's size in bytes and the encode seconds a miss costs.
// A ReuseHistogram collects, for each access, its reuse distance in bytes
// (epd/plan/stack_distance.h; the smallest LRU cache that hits it) and its
// three weights; the hit ratio of an LRU cache of C bytes is the weight at
// distances <= C over the total weight, and the miss ratio one minus that.
//   - Exact mode keeps every (distance, weights) record: HitsAt is exact for
//     any C (24 + 8 bytes per access, sorted once).
//   - Bucketed mode sums records into 64 log-spaced buckets per doubling
//     (each 1.1% wide; 4,100 buckets, ~130 KB whatever the trace): HitsAt
//     counts a bucket by the fraction of its log-width below C, so it errs
//     by at most one bucket's weight. SHARDS (epd/plan/shards.h) uses it.
// Totals: Record adds to the recorded weight; AddTotal adds to the true
// total (every access, sampled or not). MissRatioAt is (recorded - hits) /
// true total, clamped to [0, 1]: for an exact histogram the two totals are
// equal; for a sampled one this is SHARDS_adj's correction (the shortfall
// of sampled weight is counted as hits at distance 0; Waldspurger, Park,
// Garthwaite, Ahmad, "Efficient MRC Construction with SHARDS", FAST 2015).
//
// Exclusive tiers: with L1 demoting into L2 and L2 into L3, the tiers
// together hold about what one LRU cache of L1 + L2 (+ L3) bytes holds, so
// L1's hit ratio is the curve at L1, L1+L2's at L1 + L2, and so on.
//
// Thread safety: thread-compatible. Complexity: Record O(1) (exact mode
// appends); the first query after records sorts them, O(n log n); HitsAt and
// CapacityFor O(log n) (exact) or O(buckets) (bucketed).
//
// Example:
//   ReuseHistogram h(ReuseHistogram::Mode::kExact);
//   ByteStackDistance s;
//   for (const CacheAccess& a : trace) {
//     h.Record(s.Access(a.key, a.bytes), Weights::Of(a));
//     h.AddTotal(Weights::Of(a));
//   }
//   h.MissRatioAt(8LL << 30).seconds;  // encode seconds missed by an 8 GB LRU
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace epd {

// One item request of a trace.
struct CacheAccess {
  std::uint64_t key = 0;   // 64-bit hash of the content key
  std::int64_t bytes = 0;  // the entry's charge, >= 0
  double seconds = 0;      // encode seconds a miss costs, >= 0
};

// An access's weights, and sums of them.
struct Weights {
  double objects = 0;
  double bytes = 0;
  double seconds = 0;
  static Weights Of(const CacheAccess& a) { return {1.0, static_cast<double>(a.bytes), a.seconds}; }
  Weights& operator+=(const Weights& o) {
    objects += o.objects;
    bytes += o.bytes;
    seconds += o.seconds;
    return *this;
  }
  Weights Scaled(double f) const { return {objects * f, bytes * f, seconds * f}; }
};

// Which weight a curve or a sizing reads.
enum class Weighting : std::uint8_t { kObjects, kBytes, kSeconds };
double Pick(const Weights& w, Weighting by);

class ReuseHistogram {
 public:
  enum class Mode : std::uint8_t { kExact, kBucketed };
  explicit ReuseHistogram(Mode mode) : mode_(mode) {}

  // One access of reuse distance `distance` bytes (ByteStackDistance::kCold
  // for a first access, which no cache hits), weighing `w`.
  void Record(std::int64_t distance, const Weights& w) { RecordScaled(static_cast<double>(distance), w, distance); }
  // The same for an estimated distance (SHARDS scales by the sampling rate).
  void Record(double distance, const Weights& w) { RecordScaled(distance, w, 0); }
  void RecordCold(const Weights& w) { recorded_ += w; }
  void AddTotal(const Weights& w) { total_ += w; }
  // Adds `other`'s records (and recorded weight, not its total), each
  // weighting scaled by the matching component of `f`. REQUIRES: both
  // bucketed.
  void Merge(const ReuseHistogram& other, const Weights& f);

  // Weight of the recorded accesses with distance <= capacity_bytes.
  Weights HitsAt(double capacity_bytes) const;
  // (recorded - HitsAt) / total, per weighting, each clamped to [0, 1]; 1
  // for a weighting whose total is 0 (an empty trace, or every cost 0):
  // nothing to save is nothing saved, as on a trace with no repeats.
  Weights MissRatioAt(double capacity_bytes) const;
  // The smallest capacity whose hit ratio (1 - MissRatioAt) by `by` reaches
  // `hit_ratio`; -1 when no capacity does (cold misses cap it).
  double CapacityFor(Weighting by, double hit_ratio) const;
  // The hit ratio of an infinite cache: everything but cold misses.
  Weights MaxHitRatio() const;

  const Weights& recorded() const { return recorded_; }
  const Weights& total() const { return total_; }
  Mode mode() const { return mode_; }
  std::size_t memory_bytes() const;

 private:
  static constexpr int kPerDoubling = 64;
  static constexpr int kBuckets = 64 * kPerDoubling + 2;
  struct Rec {
    double distance;
    Weights w;
  };

  void RecordScaled(double distance, const Weights& w, std::int64_t exact);
  static int BucketOf(double distance);
  static double BucketLow(int b);
  void Sort() const;

  Mode mode_;
  Weights recorded_, total_;
  mutable std::vector<Rec> records_;     // exact: sorted by distance on demand
  mutable std::vector<Weights> prefix_;  // exact: prefix sums of records_
  mutable bool sorted_ = true;
  std::vector<Weights> buckets_;  // bucketed
};

// A curve sampled at capacities: miss ratios per weighting.
struct CurvePoint {
  double capacity_bytes = 0;
  Weights miss_ratio;
};
struct MissRatioCurve {
  std::string label;  // "lru (exact)", "lru (shards 1%)", "gdsf (minisim 5%)", ...
  std::vector<CurvePoint> points;
  // Linear interpolation between the points in log capacity; the first
  // point's value below it, the last's above.
  Weights MissRatioAt(double capacity_bytes) const;
  // Smallest capacity, by the same interpolation, whose hit ratio by `by`
  // reaches `hit_ratio`; -1 when no point does.
  double CapacityFor(Weighting by, double hit_ratio) const;
};

// The curve of `h` at each capacity.
MissRatioCurve EvaluateCurve(const ReuseHistogram& h, std::span<const double> capacities, std::string label);

// `n` capacities spaced evenly in log from `lo` to `hi` (both > 0, lo < hi).
std::vector<double> LogCapacities(double lo, double hi, int n);

// The exact LRU histogram of a whole trace (ByteStackDistance over every
// access). O(n log n); about 40 bytes per access while it runs.
ReuseHistogram ExactReuseHistogram(std::span<const CacheAccess> trace);

}  // namespace epd
