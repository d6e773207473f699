// See plan_tiers.h. The full replay is the miniature at rate 1 with no
// head, so the check and the prediction run the same policy code.
#include "epd/plan/plan_tiers.h"

#include <algorithm>
#include <cmath>

namespace epd::plan {
namespace {

std::int64_t Scaled(double bytes, double rate) {
  return static_cast<std::int64_t>(std::clamp(bytes * rate, 0.0, LargestCapacity()));
}

// `share`: the share of the trace's requests the replay sees, which scales
// the doorkeeper's window so that it spans as much of the trace.
TieredOptions TiersFor(const PlanOptions& o, double share) {
  TieredOptions to;
  to.eviction = o.eviction;
  to.l1_admission = o.l1_admission;
  to.admission.window = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(std::llround(static_cast<double>(o.doorkeeper_window) * share)));
  to.keep_oversize_in_l2 = true;  // as the worker's tiers (src/worker/worker_cache.cc)
  return to;
}

// Component-wise truth / sampled (0 where nothing was sampled).
Weights Ratio(const Weights& truth, const Weights& sampled) {
  auto r = [](double t, double s) { return s > 0 ? t / s : 0.0; };
  return {r(truth.objects, sampled.objects), r(truth.bytes, sampled.bytes), r(truth.seconds, sampled.seconds)};
}

Weights Times(const Weights& w, const Weights& f) {
  return {w.objects * f.objects, w.bytes * f.bytes, w.seconds * f.seconds};
}

}  // namespace

std::int64_t RedisChargeBytes(std::int64_t entry_bytes) {
  const std::int64_t bytes = std::max<std::int64_t>(entry_bytes, 0);
  // Past this the product would pass kMaxCacheBytes (and, far past, overflow).
  if (bytes > kMaxCacheBytes / kRedisOverheadPerMille * 1000) return kMaxCacheBytes;
  // ceil(bytes x per-mille / 1000) by thousands and the rest: bytes x per-mille would overflow near the cap.
  const std::int64_t thousands = bytes / 1000, rest = bytes % 1000;
  return std::max<std::int64_t>(1, thousands * kRedisOverheadPerMille + (rest * kRedisOverheadPerMille + 999) / 1000);
}

TierReplayer::TierReplayer(const TierSizes& sizes, double rate, const PlanOptions& o, double share)
    : rate_(rate),
      tiers_(Scaled(sizes.l1, rate), Scaled(sizes.l2, rate), TiersFor(o, share > 0 ? share : rate)),
      bottom_(Scaled(sizes.l3, rate), CacheOptions{EvictionPolicy::kLru}) {
  if (!(rate > 0 && rate <= 1)) throw Error(Status(StatusCode::kInvalidArgument, "tier replay rate must be in (0, 1]"));
}

void TierReplayer::Access(const CacheAccess& a, bool head) {
  TierHits& h = head ? head_ : tail_;
  const Weights w = Weights::Of(a);
  CacheTier tier;
  if (tiers_.Get(a.key, &tier).has_value()) {
    (tier == CacheTier::kL1 ? h.l1 : h.l2) += w;
    return;
  }
  const std::int64_t nbytes = head ? std::llround(static_cast<double>(a.bytes) * rate_) : a.bytes;
  const EntryCost cost{head ? a.seconds * rate_ : a.seconds};
  // L3 keeps its copy on a hit (Redis serves a GET and keeps the key, which
  // the GET makes most recent); the worker adopts the value into its tiers.
  if (bottom_.Get(a.key).has_value()) {
    h.l3 += w;
    PlaceInTiers(a.key, nbytes, cost);
    return;
  }
  h.miss += w;
  PlaceInTiers(a.key, nbytes, cost);
  // The worker writes every tower result to L3, which charges what Redis does.
  const std::int64_t charge = RedisChargeBytes(a.bytes);
  bottom_.Put(a.key, 0, head ? Scaled(static_cast<double>(charge), rate_) : charge, cost);
}

// The tiers place an entry too large for L1 in L2 themselves
// (keep_oversize_in_l2); one too large for both stays in L3 alone.
// An entry takes at least a byte there, so that a tier of 0 bytes holds
// nothing, as a tier the plan leaves out must (the caches would keep 0-byte
// entries forever in 0 bytes; the worker's embeddings are never empty).
void TierReplayer::PlaceInTiers(std::uint64_t key, std::int64_t nbytes, const EntryCost& cost) {
  nbytes = std::max<std::int64_t>(nbytes, 1);
  if (nbytes <= std::max(tiers_.l1().capacity_bytes(), tiers_.l2().capacity_bytes())) tiers_.Put(key, 0, nbytes, cost);
}

TierHits TierReplayer::Hits(const Weights& total, const Weights& head_total) const {
  TierHits out = tail_;
  if (rate_ < 1) {
    Weights tail_truth = total;
    tail_truth += head_total.Scaled(-1);
    const Weights f = Ratio(tail_truth, tail_.Total());
    out.l1 = Times(tail_.l1, f);
    out.l2 = Times(tail_.l2, f);
    out.l3 = Times(tail_.l3, f);
    out.miss = Times(tail_.miss, f);
  }
  out.l1 += head_.l1;
  out.l2 += head_.l2;
  out.l3 += head_.l3;
  out.miss += head_.miss;
  out.l1_write_bytes = std::llround(static_cast<double>(tiers_.l1_write_bytes()) / rate_);
  return out;
}

TierSample SampleTrace(std::span<const CacheAccess> trace, double rate, std::span<const std::uint64_t> head_keys) {
  TierSample s;
  s.rate = rate;
  const std::unordered_set<std::uint64_t> head(head_keys.begin(), head_keys.end());
  const bool all = rate >= 1;
  const auto threshold = all ? 0 : static_cast<std::uint64_t>(std::ldexp(rate, 64));
  for (const CacheAccess& a : trace) {
    const Weights w = Weights::Of(a);
    s.total += w;
    const bool is_head = !all && !head.empty() && head.count(a.key) != 0;
    if (is_head) s.head_total += w;
    if (all || is_head || ShardsSampler::Mix(a.key) < threshold) {
      s.accesses.push_back(&a);
      s.head.push_back(is_head);
    }
  }
  return s;
}

TierHits SimulateTiers(const TierSample& sample, const TierSizes& sizes, const PlanOptions& options) {
  // The share of the trace's requests the sample holds (the head at rate 1).
  const double share = static_cast<double>(sample.accesses.size()) / std::max(1.0, sample.total.objects);
  TierReplayer r(sizes, sample.rate, options, share);
  for (std::size_t i = 0; i < sample.accesses.size(); ++i) r.Access(*sample.accesses[i], sample.head[i]);
  return r.Hits(sample.total, sample.head_total);
}

double TierRate(double base, const TierSizes& sizes, double mean_bytes, double min_entries) {
  double smallest = 0;
  for (double b : {sizes.l1, sizes.l2}) {
    if (b > 0 && (smallest == 0 || b < smallest)) smallest = b;
  }
  double r = base;
  while (r < 1 && smallest > 0 && smallest * r < min_entries * mean_bytes) r *= 2;
  return std::min(r, 1.0);
}

}  // namespace epd::plan
