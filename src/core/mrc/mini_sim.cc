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

double RateFor(std::span<const CacheAccess> trace, double capacity, const MiniSimOptions& o) {
  double total = 0;
  for (const CacheAccess& a : trace) total += static_cast<double>(a.bytes);
  const double mean = trace.empty() ? 0 : total / static_cast<double>(trace.size());
  double r = o.rate;
  while (r < 1 && capacity * r < o.min_entries * mean) r *= 2;
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

SimResult SimulateCapacity(std::span<const CacheAccess> trace, const SimPolicy& policy, double capacity_bytes,
                           const MiniSimOptions& options) {
  SimResult out;
  out.capacity_bytes = capacity_bytes;
  out.rate = RateFor(trace, capacity_bytes, options);
  const bool all = out.rate >= 1;
  const std::uint64_t threshold = all ? 0 : static_cast<std::uint64_t>(std::ldexp(out.rate, 64));
  const auto scaled =
      static_cast<std::int64_t>(std::min(capacity_bytes * out.rate, static_cast<double>(kMaxCacheBytes)));
  const std::unordered_set<std::uint64_t> head(options.exact_keys.begin(), options.exact_keys.end());
  EmbeddingCache<std::uint64_t, char, IdentityHash> cache(scaled, CacheOptions{policy.eviction});
  std::vector<AdmissionFilter> filter;
  if (policy.doorkeeper) {
    const auto window = static_cast<std::uint64_t>(std::max(1.0, std::round(options.doorkeeper_window * out.rate)));
    filter.emplace_back(AdmissionFilterOptions{window});
  }
  Weights head_total, head_hits, tail_total, tail_hits;
  for (const CacheAccess& a : trace) {
    const Weights w = Weights::Of(a);
    out.total += w;
    const bool is_head = !head.empty() && head.count(a.key) != 0;
    if (!all && !is_head && ShardsSampler::Mix(a.key) >= threshold) continue;
    ++out.simulated;
    (is_head ? head_total : tail_total) += w;
    const std::uint32_t requests = filter.empty() ? 2 : filter[0].Record(a.key);
    if (cache.Get(a.key).has_value()) {
      (is_head ? head_hits : tail_hits) += w;
      continue;
    }
    const std::int64_t charge = is_head && !all ? std::llround(static_cast<double>(a.bytes) * out.rate) : a.bytes;
    if (requests < 2 || charge > scaled) continue;
    cache.Put(a.key, 0, charge, {a.seconds});
    out.write_bytes += charge;
  }
  auto scale = [](double truth, double sampled) { return sampled > 0 ? truth / sampled : 0.0; };
  const Weights tail_truth{out.total.objects - head_total.objects, out.total.bytes - head_total.bytes,
                           out.total.seconds - head_total.seconds};
  out.hits = head_hits;
  out.hits += Weights{tail_hits.objects * scale(tail_truth.objects, tail_total.objects),
                      tail_hits.bytes * scale(tail_truth.bytes, tail_total.bytes),
                      tail_hits.seconds * scale(tail_truth.seconds, tail_total.seconds)};
  return out;
}

MissRatioCurve SimulateCurve(std::span<const CacheAccess> trace, const SimPolicy& policy,
                             std::span<const double> capacities, const MiniSimOptions& options) {
  MissRatioCurve c;
  c.label = policy.Name() + " (minisim " + std::to_string(static_cast<int>(std::round(options.rate * 100))) + "%)";
  for (double cap : capacities) {
    const SimResult r = SimulateCapacity(trace, policy, cap, options);
    c.points.push_back({cap, r.MissRatio()});
  }
  return c;
}

}  // namespace epd
