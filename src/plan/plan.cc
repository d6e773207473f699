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

PlanResult RunPlan(std::span<const CacheAccess> trace, const PlanOptions& o) {
  std::mutex progress_mu;  // the tasks report from their threads
  auto progress = [&o, &progress_mu](const char* phase, std::size_t done, std::size_t total) {
    const std::lock_guard<std::mutex> lock(progress_mu);
    if (o.progress) o.progress(phase, done, total);
  };
  const unsigned threads = o.threads != 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  PlanResult r;
  r.requests = trace.size();
  const Clock::time_point t0 = Clock::now();
  {
    // The infinite cache's hit ratio is counted here, exactly: every access
    // but a key's first. The sampled curve only estimates it.
    LastSizes sizes;
    Weights total, repeats;
    for (std::size_t i = 0; i < trace.size(); ++i) {
      const CacheAccess& a = trace[i];
      if (!sizes.Set(a.key, a.bytes)) repeats += Weights::Of(a);
      total += Weights::Of(a);
      r.total_seconds += a.seconds;
      r.largest_entry = std::max(r.largest_entry, static_cast<double>(a.bytes));
      if ((i & 0xfffff) == 0) progress("keys", i, trace.size());
    }
    r.distinct_keys = sizes.size();
    r.working_set_bytes = sizes.SumBytes();
    r.working_set_redis_bytes = sizes.SumRedisCharge();
    // The stack distances sum the distinct keys' bytes in int64 (a sum past it would wrap).
    if (sizes.SumPastMax()) {
      throw std::invalid_argument(
          fmt::format("the trace's distinct keys hold {:.4g} bytes, over the 2^62 - 1 that the "
                      "caches and the stack distances count",
                      r.working_set_bytes));
    }
    auto ratio = [](double part, double all) { return all > 0 ? part / all : 0.0; };  // 0: nothing to save
    r.max_hit_ratio = {ratio(repeats.objects, total.objects), ratio(repeats.bytes, total.bytes),
                       ratio(repeats.seconds, total.seconds)};
  }
  const double mean = trace.empty() ? 1 : r.working_set_bytes / std::max(1.0, static_cast<double>(r.distinct_keys));
  // Capacities stay below kMaxCacheBytes (2^62 - 1, which a double rounds up to 2^62: one ulp under it).
  const double max_capacity = LargestCapacity();
  const double lo = std::min(std::max({r.largest_entry, 8 * mean, r.working_set_bytes / 1e4, 1.0}), max_capacity / 2);
  const double hi = std::min(std::max(lo * 2, r.working_set_bytes * 1.25), max_capacity);
  // L3's bytes per byte of entry: what Redis charges for the working set over its bytes.
  const double redis_charge = r.working_set_bytes > 0 ? r.working_set_redis_bytes / r.working_set_bytes : 1.0;
  const std::vector<double> caps = LogCapacities(lo, hi, o.points);

  // The head (SHARDS and MiniSim keep it at rate 1), then the four curves
  // as four tasks: LRU (exact or SHARDS), GDSF, GDSF + doorkeeper and adaptive
  // (MiniSim; the whole trace when it is small).
  r.exact = trace.size() <= o.exact_max;
  MiniSimOptions m;
  m.rate = trace.size() <= 200'000 ? 1.0 : o.minisim_rate;
  m.doorkeeper_window = o.doorkeeper_window;
  const std::vector<std::uint64_t> head =
      !r.exact || m.rate < 1 ? HeavyHitters(trace, o.shards_head) : std::vector<std::uint64_t>{};
  if (m.rate < 1) {
    m.exact_keys.assign(head.begin(),
                        head.begin() + static_cast<std::ptrdiff_t>(std::min(head.size(), o.minisim_head)));
  }
  std::optional<ReuseHistogram> lru;
  // Exact traces: LRU stack distances in the bytes Redis charges too, where
  // L3 (an LRU) starts; sampled ones scale the LRU curve by the charge ratio.
  std::optional<ReuseHistogram> l3_lru_charged;
  r.curves.resize(4);
  std::vector<std::function<void()>> curve_tasks;
  curve_tasks.emplace_back([&] {
    if (r.exact) {
      progress("lru (exact)", 0, 1);
      lru = ExactReuseHistogram(trace);
      r.curves[0] = EvaluateCurve(*lru, caps, "lru (exact)");
      std::vector<CacheAccess> charged(trace.begin(), trace.end());
      for (CacheAccess& a : charged) a.bytes = RedisChargeBytes(a.bytes);
      l3_lru_charged = ExactReuseHistogram(charged);
      return;
    }
    ShardsSampler s({o.shards_rate, o.shards_max_keys, head});
    for (std::size_t i = 0; i < trace.size(); ++i) {
      s.Access(trace[i]);
      if ((i & 0xfffff) == 0) progress("lru (shards)", i, trace.size());
    }
    lru = s.histogram();
    r.shards_rate = s.rate();
    r.shards_head = s.head_keys();
    r.shards_sampled_keys = s.sampled_keys();
    r.sampled_fraction = static_cast<double>(s.sampled_accesses()) / std::max(1.0, static_cast<double>(trace.size()));
    r.sampler_bytes = s.memory_bytes();
    r.curves[0] =
        EvaluateCurve(*lru, caps, fmt::format("lru (shards {:g}% + {} head keys)", 100 * o.shards_rate, head.size()));
  });
  const SimPolicy simulated[] = {
      {EvictionPolicy::kGdsf, false}, {EvictionPolicy::kGdsf, true}, {EvictionPolicy::kAdaptive, false}};
  for (std::size_t i = 0; i < std::size(simulated); ++i) {
    curve_tasks.emplace_back([&, i] {
      const SimPolicy p = simulated[i];
      progress(p.Name().c_str(), 0, 1);
      MissRatioCurve c = SimulateCurve(trace, p, caps, m);
      c.label = p.Name() + (m.rate >= 1 ? " (simulated)" : fmt::format(" (minisim {:g}%)", 100 * m.rate));
      r.curves[i + 1] = std::move(c);
    });
  }
  RunTasks(curve_tasks, threads);
  r.curves_s = Seconds(t0);
  // A sample too small for the trace shows first at the curve's end.
  if (const double sampled = lru->MaxHitRatio().seconds;
      !r.exact && std::abs(sampled - r.max_hit_ratio.seconds) > kSampleWarnGap) {
    r.warnings.push_back(fmt::format(
        "the SHARDS sample ({} keys, tail rate {:.3g}%) puts the infinite cache's encode-seconds hit ratio at "
        "{:.3f}, the trace's is {:.3f}: its curve is off by as much; raise --shards-max-keys or --shards-rate",
        r.shards_sampled_keys, 100 * r.shards_rate, sampled, r.max_hit_ratio.seconds));
  }
  // The same check for MiniSim: GDSF's curve ends at the infinite cache when
  // its largest capacity holds the working set.
  if (m.rate < 1 && caps.back() >= r.working_set_bytes && !r.curves[1].points.empty()) {
    const double sampled = 1 - r.curves[1].points.back().miss_ratio.seconds;
    if (std::abs(sampled - r.max_hit_ratio.seconds) > kSampleWarnGap) {
      r.warnings.push_back(fmt::format(
          "the MiniSim sample (rate {:.3g}%, {} head keys) puts the infinite cache's encode-seconds hit ratio at "
          "{:.3f}, the trace's is {:.3f}: the gdsf, gdsf+doorkeeper and adaptive curves are off by about as much; "
          "raise --minisim-rate",
          100 * m.rate, m.exact_keys.size(), sampled, r.max_hit_ratio.seconds));
    }
  }

  // Sizing off the policy's curve. The doorkeeper gates L1 alone (a first
  // request goes into L2), so the tiers' total reads the policy's own curve;
  // the GDSF + doorkeeper curve, one cache that never takes a first request,
  // ends well short of what the tiers reach.
  const bool simulated_policy = o.eviction != EvictionPolicy::kLru;  // sized off a MiniSim curve
  const bool dk = o.l1_admission == L1Admission::kDoorkeeper;
  r.policy = SimPolicy{o.eviction, dk}.Name();
  const std::size_t sized = o.eviction == EvictionPolicy::kAdaptive ? 3 : !simulated_policy ? 0 : 1;
  const MissRatioCurve& curve = r.curves[sized];
  auto hit = [](const MissRatioCurve& c, double bytes) { return 1 - c.MissRatioAt(bytes).seconds; };
  auto at = [&](double b) { return !simulated_policy && r.exact ? 1 - lru->MissRatioAt(b).seconds : hit(curve, b); };
  const Clock::time_point t1 = Clock::now();
  for (double target : o.targets) {
    SizingRow row;
    row.target = target;
    row.hit_ratio = target * r.max_hit_ratio.seconds;
    // Nothing to save (no key repeats): no cache at all.
    row.total_bytes = row.hit_ratio <= 0             ? 0
                      : !simulated_policy && r.exact ? lru->CapacityFor(Weighting::kSeconds, row.hit_ratio)
                                                     : curve.CapacityFor(Weighting::kSeconds, row.hit_ratio);
    // A sampled or simulated curve can end a little short of the trace's own
    // maximum: such a row starts where the curve comes within 0.1 % of its
    // end, and the miniature moves it from there.
    // A curve flat at 0 (no sampled key repeats) starts at its largest capacity.
    if (row.total_bytes < 0 && row.hit_ratio > 0 && (simulated_policy || !r.exact)) {
      const double top = hit(curve, hi);
      row.total_bytes = top > 0 ? curve.CapacityFor(Weighting::kSeconds, top * (1 - 1e-3)) : hi;
      if (row.total_bytes <= 0) row.total_bytes = hi;
    }
    if (row.total_bytes >= 0) {
      Split(row, row.total_bytes, o);
      // L3 is an LRU that holds copies of what L1 and L2 hold: where the
      // split leaves it a share, it needs about what one LRU cache needs for
      // the target on its own, whatever the tiers' policy (GDSF's curve can
      // sit far below), in the bytes Redis charges for them.
      const double l3_lru = row.l3_bytes <= 0 ? -1
                            : r.exact         ? l3_lru_charged->CapacityFor(Weighting::kSeconds, row.hit_ratio)
                                      : r.curves[0].CapacityFor(Weighting::kSeconds, row.hit_ratio) * redis_charge;
      if (l3_lru > row.l3_bytes) Split(row, row.l1_bytes + row.l2_bytes + l3_lru, o);
      // Entries of 0 bytes give a curve that needs 0 bytes, but the tiers hold
      // each in a byte and Redis charges it a value: start from the target's
      // share of the working set as Redis charges it, and let the miniature move it.
      if (row.total_bytes <= 0 && row.hit_ratio > 0) Split(row, row.target * r.working_set_redis_bytes, o);
      row.tiers_rate = TierRate(m.rate, {row.l1_bytes, row.l2_bytes, row.l3_bytes}, mean);
    }
    r.rows.push_back(row);
  }
  // The hit ratios by a miniature of the tiered cache itself (plan_tiers.h),
  // one sample per distinct rate, each row moved to the total its miniature
  // says reaches the target where the curve's misses it (Refine); then the
  // replays at the final sizes.
  r.replayed = o.replay;
  std::map<double, TierSample> samples;
  for (const SizingRow& row : r.rows) {
    if (row.total_bytes >= 0 && !samples.count(row.tiers_rate)) {
      samples.emplace(row.tiers_rate, SampleTrace(trace, row.tiers_rate, m.exact_keys));
    }
  }
  // L3 is written through and holds copies of what L1 and L2 hold, so the
  // tiers' total may need the curve's largest capacity in L3 alone.
  const double ceiling = std::min(
      std::max(hi, 1.25 * r.working_set_redis_bytes) + std::min(hi, o.l1_max_bytes) + std::min(hi, o.l2_max_bytes),
      max_capacity);
  std::vector<std::function<void()>> row_tasks;
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    SizingRow& row = r.rows[i];
    if (row.total_bytes < 0) continue;
    row_tasks.emplace_back([&, i] {
      progress("tiers (minisim)", i, r.rows.size());
      const TierSample& sample = samples.at(row.tiers_rate);
      Predict(row, sample, o);
      Refine(row, sample, 1.0, ceiling, o);
    });
  }
  RunTasks(row_tasks, threads);
  // In target order: a higher target never gets a smaller total than a lower
  // one (within Refine's tolerance it could); the miniature's rate for the
  // final sizes (a moved row can need a higher one), predicting again where
  // either changed; the curve at the final total; whether the target is met.
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    SizingRow& row = r.rows[i];
    if (row.total_bytes < 0) continue;
    bool again = false;
    for (const SizingRow& lower : r.rows) {
      if (lower.target < row.target && lower.total_bytes > row.total_bytes) {
        Split(row, lower.total_bytes, o);
        again = true;
      }
    }
    const double rate = TierRate(m.rate, {row.l1_bytes, row.l2_bytes, row.l3_bytes}, mean);
    if (rate != row.tiers_rate) {
      row.tiers_rate = rate;
      if (!samples.count(rate)) samples.emplace(rate, SampleTrace(trace, rate, m.exact_keys));
      again = true;
    }
    if (again) Predict(row, samples.at(row.tiers_rate), o);
    row.curve_all = at(row.l1_bytes + row.l2_bytes + row.l3_bytes / redis_charge);  // the curve is in entry bytes
    row.reached = row.predicted_all >= row.hit_ratio - kRefineTolerance;
  }
  // An L1 the tiers fill first but that serves nothing: say so once, with
  // the likeliest cause when the doorkeeper guards it.
  for (const SizingRow& row : r.rows) {
    if (row.total_bytes > 0 && row.l1_bytes > 0 && row.predicted_all > 0 && row.predicted_l1 < 0.001) {
      r.warnings.push_back(fmt::format(
          "L1 ({} at {:.0f}% of encode seconds saved) is predicted to serve {:.2f}% of encode seconds{}",
          Gb(row.l1_bytes), 100 * row.target, 100 * row.predicted_l1,
          dk ? fmt::format(": under the doorkeeper a key enters L1 on its second request within {} requests, and "
                           "no key is requested from L1 after that (a window too short for keys to repeat in it, "
                           "or keys not requested again after their second time)",
                           o.doorkeeper_window)
             : ""));
      break;
    }
  }
  row_tasks.clear();
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    SizingRow& row = r.rows[i];
    if (row.total_bytes >= 0) {
      row.serve_args = ServeArgs(row.l1_bytes, row.l2_bytes, o.eviction, o.l1_admission,
                                 o.worker_window != 0 ? o.worker_window : o.doorkeeper_window);
    }
    if (row.total_bytes < 0 || !o.replay) continue;
    row_tasks.emplace_back([&, i] {
      progress("replay", i, r.rows.size());
      row.replayed = ReplayTiers(trace, row.l1_bytes, row.l2_bytes, row.l3_bytes, o);
    });
  }
  RunTasks(row_tasks, threads);
  r.replay_s = Seconds(t1);
  return r;
}

}  // namespace epd::plan
