// The plan's phases, in order: a pass over the trace for its keys and
// working set; the LRU curve (exact, or SHARDS with a Misra-Gries head) and
// the MiniSim curves, side by side; the sizing rows off the curve; a
// miniature of the tiers per row, side by side, each moving its row where it
// misses the target (Refine); a pass over the rows in target order; then
// (with options.replay) a replay per row, side by side. Each phase reports
// through options.progress.
#include "epd/plan/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include "epd/plan/mini_sim.h"
#include "epd/plan/plan_serve_args.h"
#include "epd/plan/plan_tiers.h"
#include "epd/plan/shards.h"

namespace epd::plan {
namespace {

using Clock = std::chrono::steady_clock;

// Each key's latest size: open addressing with linear probing over keys
// that are already 64-bit hashes (fewer cache misses than an unordered_map
// node per key); grows at half full.
class LastSizes {
 public:
  // True when `key` is new.
  bool Set(std::uint64_t key, std::int64_t bytes) {
    if (2 * (size_ + 1) > slots_.size()) Grow();
    Slot& s = Probe(slots_, key);
    const bool fresh = s.bytes < 0;
    if (fresh) ++size_;
    s = {key, bytes};
    return fresh;
  }
  std::size_t size() const { return size_; }
  // Whether the keys' bytes sum past kMaxCacheBytes, summed exactly (each is at most kMaxCacheBytes).
  bool SumPastMax() const {
    std::int64_t total = 0;
    for (const Slot& s : slots_) {
      if (s.bytes > 0 && (total += s.bytes) > kMaxCacheBytes) return true;
    }
    return false;
  }
  double SumBytes() const {
    double total = 0;
    for (const Slot& s : slots_) total += s.bytes > 0 ? static_cast<double>(s.bytes) : 0.0;
    return total;
  }
  // What Redis would charge to hold every key (RedisChargeBytes).
  double SumRedisCharge() const {
    double total = 0;
    for (const Slot& s : slots_) total += s.bytes >= 0 ? static_cast<double>(RedisChargeBytes(s.bytes)) : 0.0;
    return total;
  }

 private:
  struct Slot {
    std::uint64_t key = 0;
    std::int64_t bytes = -1;  // -1: empty
  };
  static Slot& Probe(std::vector<Slot>& t, std::uint64_t key) {
    const std::size_t mask = t.size() - 1;
    for (std::size_t i = key & mask;; i = (i + 1) & mask) {
      if (t[i].bytes < 0 || t[i].key == key) return t[i];
    }
  }
  void Grow() {
    std::vector<Slot> bigger(std::max<std::size_t>(1024, 2 * slots_.size()));
    for (const Slot& s : slots_) {
      if (s.bytes >= 0) Probe(bigger, s.key) = s;
    }
    slots_.swap(bigger);
  }
  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Runs every task, at most `threads` at once (this thread is one of them),
// and returns when all are done; the first exception a task threw is
// rethrown here, after the others finished.
void RunTasks(std::vector<std::function<void()>>& tasks, unsigned threads) {
  std::atomic<std::size_t> next{0};
  std::vector<std::exception_ptr> failed(tasks.size());
  auto work = [&] {
    for (std::size_t i = next++; i < tasks.size(); i = next++) {
      try {
        tasks[i]();
      } catch (...) {
        failed[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::min<std::size_t>(threads, tasks.size()); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : failed) {
    if (e) std::rethrow_exception(e);
  }
}

// The three tiers for a total: L1 up to l1_max_bytes, then L2 up to
// l2_max_bytes, then L3.
// Whole bytes: the total rounded up, L1 and L2 down, L3 the rest. L1 first,
// up to its limit; with the doorkeeper at most half the total, since every
// first request goes into L2 (with no L2 it would be dropped).
void Split(SizingRow& row, double total, const PlanOptions& o) {
  total = std::ceil(total);
  row.total_bytes = total;
  const double l1_max =
      o.l1_admission == L1Admission::kDoorkeeper ? std::min(o.l1_max_bytes, total / 2) : o.l1_max_bytes;
  row.l1_bytes = std::floor(std::min(total, l1_max));
  row.l2_bytes = std::floor(std::min(total - row.l1_bytes, o.l2_max_bytes));
  row.l3_bytes = total - row.l1_bytes - row.l2_bytes;
}

// The row's predicted hit ratios: a miniature of the tiers at its sizes.
void Predict(SizingRow& row, const TierSample& sample, const PlanOptions& o) {
  const TierHits mini = SimulateTiers(sample, {row.l1_bytes, row.l2_bytes, row.l3_bytes}, o);
  row.predicted_l1 = mini.Ratio(mini.l1, Weighting::kSeconds);
  row.predicted_l12 = row.predicted_l1 + mini.Ratio(mini.l2, Weighting::kSeconds);
  row.predicted_all = row.predicted_l12 + mini.Ratio(mini.l3, Weighting::kSeconds);
  ++row.miniatures;
}

// Moves a row whose miniature misses its target by more than kRefineTolerance
// (either way) to the smallest total whose miniature reaches it: doublings
// (up to `ceiling`) or halvings (down to `floor`) from the curve's total
// until the target is bracketed, at most kRefineBracket, then kRefineBisect
// bisections in log space (to within a factor of 2^(1/64) for a bracket of
// one doubling). Unbracketed while shrinking (every halving still reached
// it), the last halving stays; while growing (none reached it below the
// ceiling), the largest total tried stays and row.reached is false. The
// miniature is not exactly monotone in capacity; bisection still ends on a
// total whose miniature reached the target.
constexpr double kRefineTolerance = 0.005;
// How far the sampled LRU curve's end may sit from the counted infinite-cache
// hit ratio before plan warns: SHARDS's published error bound (MAE < 0.01,
// Waldspurger et al., FAST 2015), which a sample of usual size keeps.
constexpr double kSampleWarnGap = 0.01;
constexpr int kRefineBracket = 20;
constexpr int kRefineBisect = 6;
void Refine(SizingRow& row, const TierSample& sample, double floor, double ceiling, const PlanOptions& o) {
  if (row.total_bytes <= 0 || std::abs(row.predicted_all - row.hit_ratio) <= kRefineTolerance) return;
  const bool grow = row.predicted_all < row.hit_ratio;
  SizingRow probe = row;
  SizingRow best = row;  // shrinking: the smallest total seen to reach the target; growing: the largest tried
  double lo = row.total_bytes, hi = row.total_bytes;  // lo: short of the target; hi: reaching it
  bool bracketed = false;
  auto reaches = [&](double total) {
    Split(probe, total, o);
    Predict(probe, sample, o);
    return probe.predicted_all >= row.hit_ratio;
  };
  for (int i = 0; i < kRefineBracket && !bracketed; ++i) {
    const double next = grow ? std::min(hi * 2, ceiling) : std::max(lo / 2, floor);
    if (next == (grow ? hi : lo)) break;  // at the ceiling or the floor
    const bool reached = reaches(next);
    if (grow || reached) best = probe;
    if (grow) {
      lo = reached ? lo : next;
      hi = next;
    } else {
      hi = reached ? next : hi;
      lo = next;
    }
    bracketed = grow ? reached : !reached;
  }
  if (bracketed) {
    for (int i = 0; i < kRefineBisect; ++i) {
      const double mid = std::sqrt(lo * hi);
      if (reaches(mid)) {
        hi = mid;
        best = probe;
      } else {
        lo = mid;
      }
    }
  }
  best.miniatures = probe.miniatures;
  row = best;
}

}  // namespace

double TierHits::Ratio(const Weights& w, Weighting by) const {
  const double total = Pick(Total(), by);
  return total > 0 ? Pick(w, by) / total : 0;
}

Weights TierHits::Total() const {
  Weights t = l1;
  t += l2;
  t += l3;
  t += miss;
  return t;
}

TierHits ReplayTiers(std::span<const CacheAccess> trace, double l1, double l2, double l3, const PlanOptions& o) {
  TierReplayer r({l1, l2, l3}, 1.0, o);
  for (const CacheAccess& a : trace) r.Access(a, false);
  return r.Hits({}, {});
}

namespace {

// RunPlan's phases over what they share: the trace, the options, the
// capacities the curves are evaluated at, the LRU histogram, the miniatures'
// samples. Each phase fills its part of the result.
class Planner {
 public:
  Planner(std::span<const CacheAccess> trace, const PlanOptions& o, PlanResult& r)
      : trace_(trace),
        o_(o),
        r_(r),
        threads_(o.threads != 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency())) {}

  void CountKeys();
  void BuildCurves();
  void SizeRows();
  void RefineRows();
  void ReplayRows();

 private:
  void Progress(const char* phase, std::size_t done, std::size_t total) {
    const std::lock_guard<std::mutex> lock(progress_mu_);  // the tasks report from their threads
    if (o_.progress) o_.progress(phase, done, total);
  }
  void LruCurve();
  void WarnSampledCurves();
  SizingRow SizeRow(double target) const;
  void FinishRow(SizingRow& row);
  void WarnIdleL1();
  const TierSample& Sample(double rate) {
    if (!samples_.count(rate)) samples_.emplace(rate, SampleTrace(trace_, rate, m_.exact_keys));
    return samples_.at(rate);
  }

  std::span<const CacheAccess> trace_;
  const PlanOptions& o_;
  PlanResult& r_;
  const unsigned threads_;
  std::mutex progress_mu_;
  double mean_ = 1, hi_ = 1;         // an entry's mean bytes; the curves' largest capacity
  double redis_charge_ = 1;          // L3's bytes per byte of entry (the working set's)
  std::vector<double> caps_;         // the curves' capacities
  std::vector<std::uint64_t> head_;  // the hottest keys (SHARDS and MiniSim keep them at rate 1)
  MiniSimOptions m_;
  std::optional<ReuseHistogram> lru_;
  // Exact traces: LRU stack distances in the bytes Redis charges too, where
  // L3 (an LRU) starts; sampled ones scale the LRU curve by the charge ratio.
  std::optional<ReuseHistogram> l3_lru_charged_;
  std::map<double, TierSample> samples_;  // the miniatures' samples, by rate
};

// One pass: the keys, the working set, and the infinite cache's hit ratio,
// counted exactly (every access but a key's first); the sampled curve only
// estimates it. Then the capacities the curves are evaluated at.
void Planner::CountKeys() {
  LastSizes sizes;
  Weights total, repeats;
  for (std::size_t i = 0; i < trace_.size(); ++i) {
    const CacheAccess& a = trace_[i];
    if (!sizes.Set(a.key, a.bytes)) repeats += Weights::Of(a);
    total += Weights::Of(a);
    r_.total_seconds += a.seconds;
    r_.largest_entry = std::max(r_.largest_entry, static_cast<double>(a.bytes));
    if ((i & 0xfffff) == 0) Progress("keys", i, trace_.size());
  }
  r_.requests = trace_.size();
  r_.distinct_keys = sizes.size();
  r_.working_set_bytes = sizes.SumBytes();
  r_.working_set_redis_bytes = sizes.SumRedisCharge();
  // The stack distances sum the distinct keys' bytes in int64 (a sum past it would wrap).
  if (sizes.SumPastMax()) {
    throw std::invalid_argument(
        fmt::format("the trace's distinct keys hold {:.4g} bytes, over the 2^62 - 1 that the "
                    "caches and the stack distances count",
                    r_.working_set_bytes));
  }
  auto ratio = [](double part, double all) { return all > 0 ? part / all : 0.0; };  // 0: nothing to save
  r_.max_hit_ratio = {ratio(repeats.objects, total.objects), ratio(repeats.bytes, total.bytes),
                      ratio(repeats.seconds, total.seconds)};
  mean_ = trace_.empty() ? 1 : r_.working_set_bytes / std::max(1.0, static_cast<double>(r_.distinct_keys));
  // Capacities stay below kMaxCacheBytes (2^62 - 1, which a double rounds up to 2^62: one ulp under it).
  const double max_capacity = LargestCapacity();
  const double lo =
      std::min(std::max({r_.largest_entry, 8 * mean_, r_.working_set_bytes / 1e4, 1.0}), max_capacity / 2);
  hi_ = std::min(std::max(lo * 2, r_.working_set_bytes * 1.25), max_capacity);
  redis_charge_ = r_.working_set_bytes > 0 ? r_.working_set_redis_bytes / r_.working_set_bytes : 1.0;
  caps_ = LogCapacities(lo, hi_, o_.points);
}

// The LRU curve: exact stack distances, or SHARDS with the head exact.
void Planner::LruCurve() {
  if (r_.exact) {
    Progress("lru (exact)", 0, 1);
    lru_ = ExactReuseHistogram(trace_);
    r_.curves[0] = EvaluateCurve(*lru_, caps_, "lru (exact)");
    std::vector<CacheAccess> charged(trace_.begin(), trace_.end());
    for (CacheAccess& a : charged) a.bytes = RedisChargeBytes(a.bytes);
    l3_lru_charged_ = ExactReuseHistogram(charged);
    return;
  }
  ShardsSampler s({o_.shards_rate, o_.shards_max_keys, head_});
  for (std::size_t i = 0; i < trace_.size(); ++i) {
    s.Access(trace_[i]);
    if ((i & 0xfffff) == 0) Progress("lru (shards)", i, trace_.size());
  }
  lru_ = s.histogram();
  r_.shards_rate = s.rate();
  r_.shards_head = s.head_keys();
  r_.shards_sampled_keys = s.sampled_keys();
  r_.sampled_fraction = static_cast<double>(s.sampled_accesses()) / std::max(1.0, static_cast<double>(trace_.size()));
  r_.sampler_bytes = s.memory_bytes();
  r_.curves[0] =
      EvaluateCurve(*lru_, caps_, fmt::format("lru (shards {:g}% + {} head keys)", 100 * o_.shards_rate, head_.size()));
}

// The four curves as four tasks: LRU (exact or SHARDS), GDSF, GDSF +
// doorkeeper and adaptive (MiniSim; the whole trace when it is small).
void Planner::BuildCurves() {
  r_.exact = trace_.size() <= o_.exact_max;
  m_.rate = trace_.size() <= 200'000 ? 1.0 : o_.minisim_rate;
  m_.doorkeeper_window = o_.doorkeeper_window;
  if (!r_.exact || m_.rate < 1) head_ = HeavyHitters(trace_, o_.shards_head);
  if (m_.rate < 1) {
    m_.exact_keys.assign(head_.begin(),
                         head_.begin() + static_cast<std::ptrdiff_t>(std::min(head_.size(), o_.minisim_head)));
  }
  r_.curves.resize(4);
  std::vector<std::function<void()>> tasks;
  tasks.emplace_back([this] { LruCurve(); });
  static const SimPolicy kSimulated[] = {
      {EvictionPolicy::kGdsf, false}, {EvictionPolicy::kGdsf, true}, {EvictionPolicy::kAdaptive, false}};
  for (std::size_t i = 0; i < std::size(kSimulated); ++i) {
    tasks.emplace_back([this, i] {
      const SimPolicy p = kSimulated[i];
      Progress(p.Name().c_str(), 0, 1);
      MissRatioCurve c = SimulateCurve(trace_, p, caps_, m_);
      c.label = p.Name() + (m_.rate >= 1 ? " (simulated)" : fmt::format(" (minisim {:g}%)", 100 * m_.rate));
      r_.curves[i + 1] = std::move(c);
    });
  }
  RunTasks(tasks, threads_);
  WarnSampledCurves();
}

// A sample too small for the trace shows first at the curve's end: SHARDS's
// LRU curve, and GDSF's MiniSim curve where its largest capacity holds the
// working set (it ends at the infinite cache then).
void Planner::WarnSampledCurves() {
  if (const double sampled = lru_->MaxHitRatio().seconds;
      !r_.exact && std::abs(sampled - r_.max_hit_ratio.seconds) > kSampleWarnGap) {
    r_.warnings.push_back(fmt::format(
        "the SHARDS sample ({} keys, tail rate {:.3g}%) puts the infinite cache's encode-seconds hit ratio at "
        "{:.3f}, the trace's is {:.3f}: its curve is off by as much; raise --shards-max-keys or --shards-rate",
        r_.shards_sampled_keys, 100 * r_.shards_rate, sampled, r_.max_hit_ratio.seconds));
  }
  if (m_.rate < 1 && caps_.back() >= r_.working_set_bytes && !r_.curves[1].points.empty()) {
    const double sampled = 1 - r_.curves[1].points.back().miss_ratio.seconds;
    if (std::abs(sampled - r_.max_hit_ratio.seconds) > kSampleWarnGap) {
      r_.warnings.push_back(fmt::format(
          "the MiniSim sample (rate {:.3g}%, {} head keys) puts the infinite cache's encode-seconds hit ratio at "
          "{:.3f}, the trace's is {:.3f}: the gdsf, gdsf+doorkeeper and adaptive curves are off by about as much; "
          "raise --minisim-rate",
          100 * m_.rate, m_.exact_keys.size(), sampled, r_.max_hit_ratio.seconds));
    }
  }
}

// Sizing off the policy's curve. The doorkeeper gates L1 alone (a first
// request goes into L2), so the tiers' total reads the policy's own curve;
// the GDSF + doorkeeper curve, one cache that never takes a first request,
// ends well short of what the tiers reach.
void Planner::SizeRows() {
  r_.policy = SimPolicy{o_.eviction, o_.l1_admission == L1Admission::kDoorkeeper}.Name();
  for (double target : o_.targets) r_.rows.push_back(SizeRow(target));
}

SizingRow Planner::SizeRow(double target) const {
  const bool simulated_policy = o_.eviction != EvictionPolicy::kLru;  // sized off a MiniSim curve
  const MissRatioCurve& curve = r_.curves[o_.eviction == EvictionPolicy::kAdaptive ? 3 : !simulated_policy ? 0 : 1];
  SizingRow row;
  row.target = target;
  row.hit_ratio = target * r_.max_hit_ratio.seconds;
  // Nothing to save (no key repeats): no cache at all.
  row.total_bytes = row.hit_ratio <= 0              ? 0
                    : !simulated_policy && r_.exact ? lru_->CapacityFor(Weighting::kSeconds, row.hit_ratio)
                                                    : curve.CapacityFor(Weighting::kSeconds, row.hit_ratio);
  // A sampled or simulated curve can end a little short of the trace's own
  // maximum: such a row starts where the curve comes within 0.1 % of its
  // end, and the miniature moves it from there. A curve flat at 0 (no
  // sampled key repeats) starts at its largest capacity.
  if (row.total_bytes < 0 && row.hit_ratio > 0 && (simulated_policy || !r_.exact)) {
    const double top = 1 - curve.MissRatioAt(hi_).seconds;
    row.total_bytes = top > 0 ? curve.CapacityFor(Weighting::kSeconds, top * (1 - 1e-3)) : hi_;
    if (row.total_bytes <= 0) row.total_bytes = hi_;
  }
  if (row.total_bytes < 0) return row;
  Split(row, row.total_bytes, o_);
  // L3 is an LRU that holds copies of what L1 and L2 hold: where the split
  // leaves it a share, it needs about what one LRU cache needs for the
  // target on its own, whatever the tiers' policy (GDSF's curve can sit far
  // below), in the bytes Redis charges for them.
  const double l3_lru = row.l3_bytes <= 0 ? -1
                        : r_.exact        ? l3_lru_charged_->CapacityFor(Weighting::kSeconds, row.hit_ratio)
                                   : r_.curves[0].CapacityFor(Weighting::kSeconds, row.hit_ratio) * redis_charge_;
  if (l3_lru > row.l3_bytes) Split(row, row.l1_bytes + row.l2_bytes + l3_lru, o_);
  // Entries of 0 bytes give a curve that needs 0 bytes, but the tiers hold
  // each in a byte and Redis charges each at least a byte: start from the
  // target's share of the working set as Redis charges it, and let the
  // miniature move it.
  if (row.total_bytes <= 0 && row.hit_ratio > 0) Split(row, row.target * r_.working_set_redis_bytes, o_);
  row.tiers_rate = TierRate(m_.rate, {row.l1_bytes, row.l2_bytes, row.l3_bytes}, mean_);
  return row;
}

// The hit ratios by a miniature of the tiered cache itself (plan_tiers.h),
// one sample per distinct rate, each row moved to the total its miniature
// says reaches the target where the curve's misses it (Refine); then a pass
// in target order (FinishRow) and the idle-L1 warning.
void Planner::RefineRows() {
  for (const SizingRow& row : r_.rows) {
    if (row.total_bytes >= 0) Sample(row.tiers_rate);
  }
  // L3 is written through and holds copies of what L1 and L2 hold, so the
  // tiers' total may need the curve's largest capacity in L3 alone.
  const double ceiling = std::min(std::max(hi_, 1.25 * r_.working_set_redis_bytes) + std::min(hi_, o_.l1_max_bytes) +
                                      std::min(hi_, o_.l2_max_bytes),
                                  LargestCapacity());
  std::vector<std::function<void()>> tasks;
  for (std::size_t i = 0; i < r_.rows.size(); ++i) {
    if (r_.rows[i].total_bytes < 0) continue;
    tasks.emplace_back([this, i, ceiling] {
      Progress("tiers (minisim)", i, r_.rows.size());
      SizingRow& row = r_.rows[i];
      const TierSample& sample = samples_.at(row.tiers_rate);
      Predict(row, sample, o_);
      Refine(row, sample, 1.0, ceiling, o_);
    });
  }
  RunTasks(tasks, threads_);
  for (SizingRow& row : r_.rows) {
    if (row.total_bytes >= 0) FinishRow(row);
  }
  WarnIdleL1();
}

// A higher target never gets a smaller total than a lower one (within
// Refine's tolerance it could); the miniature's rate for the final sizes (a
// moved row can need a higher one), predicting again where either changed;
// the curve at the final total; whether the target is met.
void Planner::FinishRow(SizingRow& row) {
  bool again = false;
  for (const SizingRow& lower : r_.rows) {
    if (lower.target < row.target && lower.total_bytes > row.total_bytes) {
      Split(row, lower.total_bytes, o_);
      again = true;
    }
  }
  const double rate = TierRate(m_.rate, {row.l1_bytes, row.l2_bytes, row.l3_bytes}, mean_);
  if (rate != row.tiers_rate) {
    row.tiers_rate = rate;
    again = true;
  }
  if (again) Predict(row, Sample(row.tiers_rate), o_);
  const bool simulated_policy = o_.eviction != EvictionPolicy::kLru;
  const MissRatioCurve& curve = r_.curves[o_.eviction == EvictionPolicy::kAdaptive ? 3 : !simulated_policy ? 0 : 1];
  const double total = row.l1_bytes + row.l2_bytes + row.l3_bytes / redis_charge_;  // the curve is in entry bytes
  row.curve_all = 1 - (!simulated_policy && r_.exact ? lru_->MissRatioAt(total) : curve.MissRatioAt(total)).seconds;
  row.reached = row.predicted_all >= row.hit_ratio - kRefineTolerance;
}

// An L1 the tiers fill first but that serves nothing: say so once, with the
// likeliest cause when the doorkeeper guards it.
void Planner::WarnIdleL1() {
  for (const SizingRow& row : r_.rows) {
    if (row.total_bytes > 0 && row.l1_bytes > 0 && row.predicted_all > 0 && row.predicted_l1 < 0.001) {
      r_.warnings.push_back(fmt::format(
          "L1 ({} at {:.0f}% of encode seconds saved) is predicted to serve {:.2f}% of encode seconds{}",
          Gb(row.l1_bytes), 100 * row.target, 100 * row.predicted_l1,
          o_.l1_admission == L1Admission::kDoorkeeper
              ? fmt::format(": under the doorkeeper a key enters L1 on its second request within {} requests, and "
                            "no key is requested from L1 after that (a window too short for keys to repeat in it, "
                            "or keys not requested again after their second time)",
                            o_.doorkeeper_window)
              : ""));
      return;
    }
  }
}

// The worker flags per row, then (with options.replay) a replay per row,
// side by side.
void Planner::ReplayRows() {
  r_.replayed = o_.replay;
  std::vector<std::function<void()>> tasks;
  for (std::size_t i = 0; i < r_.rows.size(); ++i) {
    SizingRow& row = r_.rows[i];
    if (row.total_bytes >= 0) {
      row.serve_args = ServeArgs(row.l1_bytes, row.l2_bytes, o_.eviction, o_.l1_admission,
                                 o_.worker_window != 0 ? o_.worker_window : o_.doorkeeper_window);
    }
    if (row.total_bytes < 0 || !o_.replay) continue;
    tasks.emplace_back([this, i] {
      Progress("replay", i, r_.rows.size());
      SizingRow& row = r_.rows[i];
      row.replayed = ReplayTiers(trace_, row.l1_bytes, row.l2_bytes, row.l3_bytes, o_);
    });
  }
  RunTasks(tasks, threads_);
}

}  // namespace

PlanResult RunPlan(std::span<const CacheAccess> trace, const PlanOptions& o) {
  PlanResult r;
  Planner p(trace, o, r);
  const Clock::time_point t0 = Clock::now();
  p.CountKeys();
  p.BuildCurves();
  r.curves_s = Seconds(t0);
  const Clock::time_point t1 = Clock::now();
  p.SizeRows();
  p.RefineRows();
  p.ReplayRows();
  r.replay_s = Seconds(t1);
  return r;
}

}  // namespace epd::plan
