// See epd/plan/mini_sim.h. Keys are already 64-bit hashes, so the simulated
// cache hashes them with the identity; the doorkeeper remixes its own.
#include "epd/plan/mini_sim.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>
#include <vector>

#include "epd/core/admission_filter.h"
#include "epd/core/cache_options.h"
#include "epd/plan/shards.h"

namespace epd {
namespace {

struct IdentityHash {
  std::size_t operator()(std::uint64_t k) const { return static_cast<std::size_t>(ShardsSampler::Mix(k)); }
};

double MeanBytes(std::span<const CacheAccess> trace) {
  double total = 0;
  for (const CacheAccess& a : trace) total += static_cast<double>(a.bytes);
  return trace.empty() ? 0 : total / static_cast<double>(trace.size());
}

double RateFor(double mean_bytes, double capacity, const MiniSimOptions& o) {
  double r = o.rate;
  while (r < 1 && capacity * r < o.min_entries * mean_bytes) r *= 2;
  return std::min(r, 1.0);
}

}  // namespace

std::string SimPolicy::Name() const {
  return std::string(EvictionPolicyName(eviction)) + (doorkeeper ? "+doorkeeper" : "");
}

Weights SimResult::MissRatio() const {
  auto r = [](double t, double h) { return t <= 0 ? 1.0 : std::clamp((t - h) / t, 0.0, 1.0); };  // as MissRatioAt
  return {r(total.objects, hits.objects), r(total.bytes, hits.bytes), r(total.seconds, hits.seconds)};
}

namespace {

// An access a miniature replays, and whether its key is in the head.
struct Sampled {
  const CacheAccess* access;
  bool head;
};

std::uint64_t Threshold(double rate) { return rate >= 1 ? 0 : static_cast<std::uint64_t>(std::ldexp(rate, 64)); }

// The accesses a miniature at `rate` replays (the head always), in order:
// one pass over the trace, the head looked up once per access.
std::vector<Sampled> Sample(std::span<const CacheAccess> trace, double rate,
                            const std::unordered_set<std::uint64_t>& head) {
  std::vector<Sampled> out;
  const bool all = rate >= 1;
  const std::uint64_t threshold = Threshold(rate);
  for (const CacheAccess& a : trace) {
    const bool is_head = !all && !head.empty() && head.count(a.key) != 0;
    if (all || is_head || ShardsSampler::Mix(a.key) < threshold) out.push_back({&a, is_head});
  }
  return out;
}

// The sample at a lower rate, from one at a higher one (sampled keys nest:
// Mix(key) below a smaller threshold is below the larger one).
std::vector<Sampled> Thin(const std::vector<Sampled>& from, double rate) {
  std::vector<Sampled> out;
  const std::uint64_t threshold = Threshold(rate);
  for (const Sampled& s : from) {
    if (s.head || ShardsSampler::Mix(s.access->key) < threshold) out.push_back(s);
  }
  return out;
}

SimResult Replay(const std::vector<Sampled>& sampled, const Weights& total, double rate, const SimPolicy& policy,
                 double capacity_bytes, const MiniSimOptions& options) {
  SimResult out;
  out.capacity_bytes = capacity_bytes;
  out.rate = rate;
  out.total = total;
  const auto scaled = static_cast<std::int64_t>(std::min(capacity_bytes * rate, static_cast<double>(kMaxCacheBytes)));
  EmbeddingCache<std::uint64_t, char, IdentityHash> cache(scaled, CacheOptions{policy.eviction});
  std::vector<AdmissionFilter> filter;
  if (policy.doorkeeper) {
    // The window spans as much of the trace as at full scale: the share of
    // its requests the miniature replays (the head at rate 1 and the tail at
    // `rate`), not `rate` alone, which would shorten it where the head is hot.
    const double share = static_cast<double>(sampled.size()) / std::max(1.0, total.objects);
    const auto window =
        static_cast<std::uint64_t>(std::max(1.0, std::round(static_cast<double>(options.doorkeeper_window) * share)));
    filter.emplace_back(AdmissionFilterOptions{window});
  }
  Weights head_total, head_hits, tail_total, tail_hits;
  for (const Sampled& s : sampled) {
    const CacheAccess& a = *s.access;
    const Weights w = Weights::Of(a);
    const bool is_head = s.head;
    ++out.simulated;
    (is_head ? head_total : tail_total) += w;
    // The filter remixes what it is given with the Mix that picked the sample
    // (every sampled key's Mix is below R x 2^64): it is given the cache's
    // hash, Mix(key), so that its probes are not drawn from that corner.
    const std::uint32_t requests = filter.empty() ? 2 : filter[0].Record(IdentityHash{}(a.key));
    if (cache.Get(a.key).has_value()) {
      (is_head ? head_hits : tail_hits) += w;
      continue;
    }
    const std::int64_t charge = is_head ? std::llround(static_cast<double>(a.bytes) * rate) : a.bytes;
    if (requests < 2 || charge > scaled) continue;
    // A head key's cost is scaled with its charge, so that GDSF ranks it by
    // the same cost per byte as at full scale.
    cache.Put(a.key, 0, charge, {is_head ? a.seconds * rate : a.seconds});
    out.write_bytes = AddBytesSaturating(out.write_bytes, charge);
  }
  auto scale = [](double truth, double sampled) { return sampled > 0 ? truth / sampled : 0.0; };
  const Weights tail_truth{total.objects - head_total.objects, total.bytes - head_total.bytes,
                           total.seconds - head_total.seconds};
  out.hits = head_hits;
  out.hits += Weights{tail_hits.objects * scale(tail_truth.objects, tail_total.objects),
                      tail_hits.bytes * scale(tail_truth.bytes, tail_total.bytes),
                      tail_hits.seconds * scale(tail_truth.seconds, tail_total.seconds)};
  return out;
}

Weights TotalOf(std::span<const CacheAccess> trace) {
  Weights t;
  for (const CacheAccess& a : trace) t += Weights::Of(a);
  return t;
}

}  // namespace

SimResult SimulateCapacity(std::span<const CacheAccess> trace, const SimPolicy& policy, double capacity_bytes,
                           const MiniSimOptions& options) {
  const std::unordered_set<std::uint64_t> head(options.exact_keys.begin(), options.exact_keys.end());
  const double rate = RateFor(MeanBytes(trace), capacity_bytes, options);
  return Replay(Sample(trace, rate, head), TotalOf(trace), rate, policy, capacity_bytes, options);
}

MissRatioCurve SimulateCurve(std::span<const CacheAccess> trace, const SimPolicy& policy,
                             std::span<const double> capacities, const MiniSimOptions& options) {
  MissRatioCurve c;
  c.label = policy.Name() + " (minisim " + std::to_string(static_cast<int>(std::round(options.rate * 100))) + "%)";
  const std::unordered_set<std::uint64_t> head(options.exact_keys.begin(), options.exact_keys.end());
  const Weights total = TotalOf(trace);
  const double mean = MeanBytes(trace);
  // One sample per distinct rate, shared by the capacities that use it.
  // A lower rate thins the last sample rather than scanning the trace again.
  double sampled_rate = -1;
  std::vector<Sampled> sampled;
  for (double cap : capacities) {
    const double rate = RateFor(mean, cap, options);
    if (rate != sampled_rate) {
      sampled = sampled_rate > rate && sampled_rate < 1 ? Thin(sampled, rate) : Sample(trace, rate, head);
      sampled_rate = rate;
    }
    c.points.push_back({cap, Replay(sampled, total, rate, policy, cap, options).MissRatio()});
  }
  return c;
}

}  // namespace epd
