// See epd/plan/miss_ratio_curve.h. Bucket 0 holds distances below 1 byte;
// bucket b >= 1 holds [2^((b-1)/64), 2^(b/64)); the last bucket holds cold
// and everything at or beyond 2^64, which no capacity reaches.
#include "epd/plan/miss_ratio_curve.h"

#include <algorithm>
#include <cmath>

#include "epd/plan/stack_distance.h"

namespace epd {

double Pick(const Weights& w, Weighting by) {
  switch (by) {
    case Weighting::kObjects:
      return w.objects;
    case Weighting::kBytes:
      return w.bytes;
    case Weighting::kSeconds:
      return w.seconds;
  }
  return 0;
}

int ReuseHistogram::BucketOf(double distance) {
  if (!(distance >= 1)) return 0;
  const double b = std::floor(std::log2(distance) * kPerDoubling) + 1;
  return static_cast<int>(std::min<double>(b, kBuckets - 1));
}

double ReuseHistogram::BucketLow(int b) { return b == 0 ? 0 : std::exp2(static_cast<double>(b - 1) / kPerDoubling); }

void ReuseHistogram::RecordScaled(double distance, const Weights& w, std::int64_t exact) {
  recorded_ += w;
  if (exact == ByteStackDistance::kCold || std::isinf(distance)) return;
  if (mode_ == Mode::kExact) {
    records_.push_back(Rec{distance, w});
    sorted_ = false;
    return;
  }
  if (buckets_.empty()) buckets_.assign(kBuckets, Weights{});
  buckets_[BucketOf(distance)] += w;
}

void ReuseHistogram::Merge(const ReuseHistogram& other, const Weights& f) {
  auto scale = [&f](const Weights& w) {
    return Weights{w.objects * f.objects, w.bytes * f.bytes, w.seconds * f.seconds};
  };
  recorded_ += scale(other.recorded_);
  if (other.buckets_.empty()) return;
  if (buckets_.empty()) buckets_.assign(kBuckets, Weights{});
  for (int b = 0; b < kBuckets; ++b) buckets_[b] += scale(other.buckets_[b]);
}

void ReuseHistogram::Sort() const {
  if (sorted_) return;
  std::sort(records_.begin(), records_.end(), [](const Rec& a, const Rec& b) { return a.distance < b.distance; });
  prefix_.resize(records_.size());
  Weights run;
  for (std::size_t i = 0; i < records_.size(); ++i) prefix_[i] = run += records_[i].w;
  sorted_ = true;
}

Weights ReuseHistogram::HitsAt(double capacity_bytes) const {
  if (mode_ == Mode::kExact) {
    Sort();
    auto it = std::upper_bound(records_.begin(), records_.end(), capacity_bytes,
                               [](double c, const Rec& r) { return c < r.distance; });
    if (it == records_.begin()) return {};
    return prefix_[static_cast<std::size_t>(it - records_.begin()) - 1];
  }
  Weights hits;
  if (buckets_.empty() || capacity_bytes < 0) return hits;
  for (int b = 0; b < kBuckets - 1; ++b) {
    const double lo = BucketLow(b), hi = BucketLow(b + 1);
    if (hi <= capacity_bytes) {
      hits += buckets_[b];
    } else {
      // The part of the bucket below the capacity, by log width.
      if (capacity_bytes > lo && lo > 0) hits += buckets_[b].Scaled(std::log(capacity_bytes / lo) / std::log(hi / lo));
      break;
    }
  }
  return hits;
}

Weights ReuseHistogram::MissRatioAt(double capacity_bytes) const {
  const Weights hits = HitsAt(capacity_bytes);
  auto ratio = [](double recorded, double hit, double total) {
    if (total <= 0) return 1.0;  // no weight to save: nothing is saved, as on a trace with no repeats
    return std::clamp((recorded - hit) / total, 0.0, 1.0);
  };
  return {ratio(recorded_.objects, hits.objects, total_.objects), ratio(recorded_.bytes, hits.bytes, total_.bytes),
          ratio(recorded_.seconds, hits.seconds, total_.seconds)};
}

Weights ReuseHistogram::MaxHitRatio() const {
  const Weights m = MissRatioAt(1e300);
  return {1 - m.objects, 1 - m.bytes, 1 - m.seconds};
}

double ReuseHistogram::CapacityFor(Weighting by, double hit_ratio) const {
  const double total = Pick(total_, by);
  if (total <= 0) return -1;
  // Hits needed so that (recorded - hits) / total <= 1 - hit_ratio.
  const double need = Pick(recorded_, by) - (1 - hit_ratio) * total;
  if (need <= 0) return 0;
  if (mode_ == Mode::kExact) {
    Sort();
    auto it = std::lower_bound(prefix_.begin(), prefix_.end(), need * (1 - 1e-12),
                               [by](const Weights& w, double n) { return Pick(w, by) < n; });
    if (it == prefix_.end()) return -1;
    return records_[static_cast<std::size_t>(it - prefix_.begin())].distance;
  }
  double run = 0;
  for (int b = 0; b < kBuckets - 1 && !buckets_.empty(); ++b) {
    const double w = Pick(buckets_[b], by);
    if (run + w >= need * (1 - 1e-12) && w > 0) {
      const double lo = std::max(BucketLow(b), 1.0), hi = BucketLow(b + 1);
      return lo * std::pow(hi / lo, std::clamp((need - run) / w, 0.0, 1.0));
    }
    run += w;
  }
  return -1;
}

std::size_t ReuseHistogram::memory_bytes() const {
  return records_.capacity() * sizeof(Rec) + prefix_.capacity() * sizeof(Weights) +
         buckets_.capacity() * sizeof(Weights);
}

Weights MissRatioCurve::MissRatioAt(double c) const {
  if (points.empty()) return {};
  if (c <= points.front().capacity_bytes) return points.front().miss_ratio;
  if (c >= points.back().capacity_bytes) return points.back().miss_ratio;
  auto it = std::upper_bound(points.begin(), points.end(), c,
                             [](double x, const CurvePoint& p) { return x < p.capacity_bytes; });
  const CurvePoint& hi = *it;
  const CurvePoint& lo = *(it - 1);
  const double f = std::log(c / lo.capacity_bytes) / std::log(hi.capacity_bytes / lo.capacity_bytes);
  auto mix = [f](double a, double b) { return a + (b - a) * f; };
  return {mix(lo.miss_ratio.objects, hi.miss_ratio.objects), mix(lo.miss_ratio.bytes, hi.miss_ratio.bytes),
          mix(lo.miss_ratio.seconds, hi.miss_ratio.seconds)};
}

double MissRatioCurve::CapacityFor(Weighting by, double hit_ratio) const {
  const double miss = 1 - hit_ratio;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const double m = Pick(points[i].miss_ratio, by);
    if (m > miss + 1e-12) continue;
    if (i == 0) return points[0].capacity_bytes;
    const double m0 = Pick(points[i - 1].miss_ratio, by);
    const double f = m0 == m ? 1 : std::clamp((m0 - miss) / (m0 - m), 0.0, 1.0);
    return points[i - 1].capacity_bytes * std::pow(points[i].capacity_bytes / points[i - 1].capacity_bytes, f);
  }
  return -1;
}

MissRatioCurve EvaluateCurve(const ReuseHistogram& h, std::span<const double> capacities, std::string label) {
  MissRatioCurve c{std::move(label), {}};
  c.points.reserve(capacities.size());
  for (double cap : capacities) c.points.push_back({cap, h.MissRatioAt(cap)});
  return c;
}

std::vector<double> LogCapacities(double lo, double hi, int n) {
  std::vector<double> out;
  if (n <= 1 || !(lo > 0) || !(hi > lo)) return {lo};
  out.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out.push_back(lo * std::pow(hi / lo, static_cast<double>(i) / (n - 1)));
  return out;
}

ReuseHistogram ExactReuseHistogram(std::span<const CacheAccess> trace) {
  ReuseHistogram h(ReuseHistogram::Mode::kExact);
  ByteStackDistance s(trace.size() + 1);
  for (const CacheAccess& a : trace) {
    const Weights w = Weights::Of(a);
    h.Record(s.Access(a.key, a.bytes), w);
    h.AddTotal(w);
  }
  return h;
}

}  // namespace epd
