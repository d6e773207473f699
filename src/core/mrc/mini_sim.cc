// See epd/core/mini_sim.h. Keys are already 64-bit hashes, so the simulated
// cache hashes them with the identity; the doorkeeper remixes its own.
#include "epd/core/mini_sim.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>
#include <vector>

#include "epd/core/admission_filter.h"
#include "epd/core/shards.h"

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
  auto r = [](double t, double h) { return t <= 0 ? 0.0 : std::clamp((t - h) / t, 0.0, 1.0); };
  return {r(total.objects, hits.objects), r(total.bytes, hits.bytes), r(total.seconds, hits.seconds)};
}

namespace {

// The accesses a miniature at `rate` replays (the head always), in order.
std::vector<const CacheAccess*> Sample(std::span<const CacheAccess> trace, double rate,
                                       const std::unordered_set<std::uint64_t>& head) {
  std::vector<const CacheAccess*> out;
  const bool all = rate >= 1;
  const std::uint64_t threshold = all ? 0 : static_cast<std::uint64_t>(std::ldexp(rate, 64));
  for (const CacheAccess& a : trace) {
    if (all || ShardsSampler::Mix(a.key) < threshold || (!head.empty() && head.count(a.key) != 0)) out.push_back(&a);
  }
  return out;
}

SimResult Replay(const std::vector<const CacheAccess*>& sampled, const Weights& total, double rate,
                 const std::unordered_set<std::uint64_t>& head, const SimPolicy& policy, double capacity_bytes,
                 const MiniSimOptions& options) {
  SimResult out;
  out.capacity_bytes = capacity_bytes;
  out.rate = rate;
  out.total = total;
  const bool all = rate >= 1;
  const auto scaled = static_cast<std::int64_t>(std::min(capacity_bytes * rate, static_cast<double>(kMaxCacheBytes)));
  EmbeddingCache<std::uint64_t, char, IdentityHash> cache(scaled, CacheOptions{policy.eviction});
  std::vector<AdmissionFilter> filter;
  if (policy.doorkeeper) {
    const auto window =
        static_cast<std::uint64_t>(std::max(1.0, std::round(static_cast<double>(options.doorkeeper_window) * rate)));
    filter.emplace_back(AdmissionFilterOptions{window});
  }
  Weights head_total, head_hits, tail_total, tail_hits;
  for (const CacheAccess* p : sampled) {
    const CacheAccess& a = *p;
    const Weights w = Weights::Of(a);
    const bool is_head = !all && !head.empty() && head.count(a.key) != 0;
    ++out.simulated;
    (is_head ? head_total : tail_total) += w;
    const std::uint32_t requests = filter.empty() ? 2 : filter[0].Record(a.key);
    if (cache.Get(a.key).has_value()) {
      (is_head ? head_hits : tail_hits) += w;
      continue;
    }
    const std::int64_t charge = is_head ? std::llround(static_cast<double>(a.bytes) * rate) : a.bytes;
    if (requests < 2 || charge > scaled) continue;
    cache.Put(a.key, 0, charge, {a.seconds});
    out.write_bytes += charge;
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
  return Replay(Sample(trace, rate, head), TotalOf(trace), rate, head, policy, capacity_bytes, options);
}

MissRatioCurve SimulateCurve(std::span<const CacheAccess> trace, const SimPolicy& policy,
                             std::span<const double> capacities, const MiniSimOptions& options) {
  MissRatioCurve c;
  c.label = policy.Name() + " (minisim " + std::to_string(static_cast<int>(std::round(options.rate * 100))) + "%)";
  const std::unordered_set<std::uint64_t> head(options.exact_keys.begin(), options.exact_keys.end());
  const Weights total = TotalOf(trace);
  const double mean = MeanBytes(trace);
  // One sample per distinct rate, shared by the capacities that use it.
  double sampled_rate = -1;
  std::vector<const CacheAccess*> sampled;
  for (double cap : capacities) {
    const double rate = RateFor(mean, cap, options);
    if (rate != sampled_rate) {
      sampled = Sample(trace, rate, head);
      sampled_rate = rate;
    }
    c.points.push_back({cap, Replay(sampled, total, rate, head, policy, cap, options).MissRatio()});
  }
  return c;
}

}  // namespace epd
