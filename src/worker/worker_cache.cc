// WorkerCache (worker_cache.h).
#include "worker_cache.h"

#include <cmath>
#include <utility>

namespace epd::internal {
namespace {

TieredOptions TiersOf(const WorkerOptions& o) {
  TieredOptions t;
  t.eviction = o.eviction;
  t.l1_admission = o.l1_admission;
  t.admission.window = o.l1_admission_window;
  t.promote_seconds_per_byte = o.promote_seconds_per_byte;
  t.keep_oversize_in_l2 = true;  // the L2-only rule (worker_cache.h)
  return t;
}

}  // namespace

WorkerCache::WorkerCache(const WorkerOptions& options, const VisionTower& tower, WorkerStats& stats)
    : options_(options),
      tower_(tower),
      stats_(stats),
      cache_(options.l1_capacity_bytes, options.l2_capacity_bytes, TiersOf(options), FencedToHost(),
             options.to_device) {
  if (!options.tenant_quotas) return;
  // The named tenants hold their ids from the start, so their reservations
  // are kept before their first request.
  const std::size_t known = options.tenant_quotas->size();
  for (std::size_t t = 0; t < known; ++t) Reserve(static_cast<TenantId>(t));
}

void WorkerCache::Reserve(TenantId t) {
  if (t < reserved_.size() && reserved_[t]) return;
  if (reserved_.size() <= t) reserved_.resize(static_cast<std::size_t>(t) + 1, false);
  const TierBytes r = options_.tenant_quotas->reservation(t);
  // The registry keeps every sum within its capacities; a worker of smaller
  // capacities than the registry's keeps the tenant on the shared pool.
  try {
    cache_.SetTenantReservation(t, r.l1, r.l2);
  } catch (const Error&) {
    cache_.SetTenantReservation(t, 0, 0);
  }
  reserved_[t] = true;
}

TenantId WorkerCache::TenantOf(std::string_view name) {
  if (!options_.tenant_quotas) return kSharedTenant;
  const TenantId t = options_.tenant_quotas->Intern(name);
  Reserve(t);
  return t;
}

double WorkerCache::Seconds(const EntryCost& cost, std::int64_t nbytes) const {
  return cost.seconds == EntryCost::kUnmeasured
             ? static_cast<double>(nbytes) * cache_.options().default_seconds_per_byte
             : cost.seconds;
}

std::optional<EntryCost> WorkerCache::CostOf(const ContentKey& key) const {
  if (std::optional<EntryCost> c = cache_.l1().CostOf(key)) return c;
  return cache_.l2().CostOf(key);
}

void WorkerCache::CountHit(ItemSource source, std::int64_t nbytes, double seconds) {
  const auto bytes = static_cast<std::uint64_t>(nbytes);
  switch (source) {
    case ItemSource::kL1:
      stats_.hit_bytes_l1 += bytes;
      stats_.hit_seconds_l1 += seconds;
      break;
    case ItemSource::kL2:
      stats_.hit_bytes_l2 += bytes;
      stats_.hit_seconds_l2 += seconds;
      break;
    default:
      stats_.hit_bytes_l3 += bytes;
      stats_.hit_seconds_l3 += seconds;
      break;
  }
  stats_.encode_seconds_saved += seconds;
}

bool WorkerCache::Fits(const Embedding& e, std::int64_t tokens) const {
  return e.shape() == tower_.OutputShape(tokens == 0 ? e.tokens : tokens) && e.nbytes() == e.ExpectedBytes();
}

// The demotion copy: one that throws is counted and returns null, which drops
// that victim (epd/core/tiered_cache.h).
WorkerCache::Cache::CopyFn WorkerCache::FencedToHost() {
  if (!options_.to_host) return nullptr;
  return [this](const EmbeddingPtr& e) { return HostCopy(e); };
}

EmbeddingPtr WorkerCache::HostCopy(const EmbeddingPtr& e) {
  if (!options_.to_host) return e;
  try {
    return options_.to_host(e);
  } catch (...) {
    ++stats_.cache_errors;
    return nullptr;
  }
}

EmbeddingPtr WorkerCache::OnDevice(EmbeddingPtr host) {
  if (!options_.to_device) return host;
  try {
    if (EmbeddingPtr d = options_.to_device(host); d != nullptr) return d;
  } catch (...) {
    ++stats_.cache_errors;
  }
  return host;
}

// The tiered cache has already left itself consistent when a promotion copy
// throws (epd/core/tiered_cache.h); the throw becomes a miss here, never an
// exception out of Submit.
std::optional<EmbeddingPtr> WorkerCache::Get(const ContentKey& key, CacheTier* tier) {
  try {
    return cache_.Get(key, tier);
  } catch (...) {
    ++stats_.cache_errors;
    *tier = CacheTier::kMiss;
    return std::nullopt;
  }
}

std::optional<WorkerCache::Hit> WorkerCache::Lookup(const ContentKey& key, std::int64_t tokens) {
  CacheTier tier = CacheTier::kMiss;
  std::optional<EmbeddingPtr> hit = Get(key, &tier);
  if (!hit.has_value()) return std::nullopt;
  if (!Fits(**hit, tokens)) {
    ++stats_.shape_mismatches;
    return std::nullopt;
  }
  const ItemSource source = tier == CacheTier::kL1 ? ItemSource::kL1 : ItemSource::kL2;
  const auto nbytes = static_cast<std::int64_t>((*hit)->nbytes());
  const std::optional<EntryCost> cost = CostOf(key);
  CountHit(source, nbytes, cost.has_value() ? cost->seconds : 0);
  return Hit{std::move(*hit), source};
}

bool WorkerCache::ServeHit(const ContentKey& key, std::int64_t tokens, ItemResult& res) {
  std::optional<Hit> hit = Lookup(key, tokens);
  if (!hit.has_value()) return false;
  hit->source == ItemSource::kL1 ? ++stats_.hits_l1 : ++stats_.hits_l2;
  res.source = hit->source;
  res.embedding = std::move(hit->embedding);
  return true;
}

std::optional<EmbeddingPtr> WorkerCache::Adopt(const ContentKey& key, EmbeddingPtr ready, const AdoptExpectation& want,
                                               EntryCost cost) {
  // A cost from outside the process that the cache would refuse counts as
  // not measured.
  if (!(std::isfinite(cost.seconds) && cost.seconds >= 0)) cost.seconds = EntryCost::kUnmeasured;
  if (Status s = CheckAdoptedValue(*ready, want, tower_, options_.preprocess.merge_size); !s.ok()) {
    ++stats_.adopt_rejections;
    if (!Fits(*ready, want.tokens)) ++stats_.shape_mismatches;
    refused_.push_back({key, s.message()});
    return std::nullopt;
  }
  if (options_.to_device) {
    try {
      ready = options_.to_device(ready);
    } catch (...) {
      ++stats_.cache_errors;
      return std::nullopt;
    }
  }
  Put(key, ready, cost);
  ++stats_.hits_l3;
  const auto nbytes = static_cast<std::int64_t>(ready->nbytes());
  CountHit(ItemSource::kL3, nbytes, Seconds(cost, nbytes));
  return ready;
}

// A put cannot throw from a tier copy: its only copies are demotions and the
// L2-only placement, both fenced by HostCopy (FencedToHost).
void WorkerCache::Put(const ContentKey& key, const EmbeddingPtr& e, const EntryCost& cost) {
  cache_.Put(key, e, static_cast<std::int64_t>(e->nbytes()), cost);
}

void WorkerCache::PutEncoded(const ContentKey& key, const EmbeddingPtr& e, const EntryCost& cost) {
  Put(key, e, cost);
  stats_.miss_bytes += e->nbytes();
  if (cost.seconds != EntryCost::kUnmeasured) stats_.miss_seconds += cost.seconds;
}

void WorkerCache::Report(WorkerStats& s) const {
  s.l1_evictions = cache_.l1().evictions();
  s.l2_evictions = cache_.l2().evictions();
  s.l1_lru_victims = cache_.l1().lru_victims();
  s.l2_lru_victims = cache_.l2().lru_victims();
  s.demotions = cache_.demotions();
  s.promotions = cache_.promotions();
  s.l1_used_bytes = cache_.l1().current_bytes();
  s.l2_used_bytes = cache_.l2().current_bytes();
  s.l1_entries = static_cast<std::int64_t>(cache_.l1().size());
  s.l2_entries = static_cast<std::int64_t>(cache_.l2().size());
  s.tenant_cache.clear();
  const TenantLedger* l1 = cache_.l1().tenants();
  const TenantLedger* l2 = cache_.l2().tenants();
  s.l1_write_bytes = static_cast<std::uint64_t>(cache_.l1_write_bytes());
  s.l2_write_bytes = static_cast<std::uint64_t>(cache_.l2_write_bytes());
  s.l1_admission_rejections = cache_.admission_rejections();
  if (l1 == nullptr || l2 == nullptr) return;
  for (std::size_t i = 0; i < reserved_.size(); ++i) {
    const auto t = static_cast<TenantId>(i);
    const TenantLedger::Row a = l1->row(t);
    const TenantLedger::Row b = l2->row(t);
    s.tenant_cache.push_back(
        {options_.tenant_quotas->name(t), a.bytes, b.bytes, a.refusals, b.refusals, a.evictions, b.evictions});
  }
}

}  // namespace epd::internal
