// The per-tenant cache families (tenant_cache_series.h).
#include "tenant_cache_series.h"

#include <map>
#include <utility>

namespace epd::internal {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// One family's values by (label, tier), in first-seen label order.
struct Folded {
  std::vector<std::string> order;
  std::map<std::string, std::pair<double, double>> by_label;  // label -> (l1, l2)
  void Add(const std::string& label, double l1, double l2) {
    auto [it, added] = by_label.try_emplace(label, 0.0, 0.0);
    if (added) order.push_back(label);
    it->second.first += l1;
    it->second.second += l2;
  }
};

MetricFamily Family(const char* name, const char* help, MetricType type, const Folded& v) {
  MetricFamily f{name, help, type, {}};
  for (const std::string& label : v.order) {
    const auto& [l1, l2] = v.by_label.at(label);
    for (const auto& [tier, value] : {std::pair{"l1", l1}, std::pair{"l2", l2}}) {
      ClientMetric m;
      m.label = {{"tenant", label}, {"tier", tier}};
      (type == MetricType::Counter ? m.counter.value : m.gauge.value) = value;
      f.metric.push_back(std::move(m));
    }
  }
  return f;
}

}  // namespace

std::vector<MetricFamily> TenantCacheFamilies(const std::vector<TenantCacheRow>& rows, TenantLabels& labels) {
  if (rows.empty()) return {};
  Folded bytes, refusals, evictions;
  for (const TenantCacheRow& r : rows) {
    const std::string label = labels.Of(r.tenant);
    bytes.Add(label, static_cast<double>(r.l1_bytes), static_cast<double>(r.l2_bytes));
    refusals.Add(label, static_cast<double>(r.l1_refusals), static_cast<double>(r.l2_refusals));
    evictions.Add(label, static_cast<double>(r.l1_evictions), static_cast<double>(r.l2_evictions));
  }
  std::vector<MetricFamily> out;
  out.push_back(
      Family("epd_tenant_cache_bytes", "Bytes a tenant holds in the cache, by tier", MetricType::Gauge, bytes));
  out.push_back(Family("epd_tenant_cache_refusals_total",
                       "Cache puts refused because the tenant's reservation plus the shared pool could not hold them",
                       MetricType::Counter, refusals));
  out.push_back(Family("epd_tenant_cache_evictions_total",
                       "A tenant's cache entries evicted while it held more than its reservation, by tier",
                       MetricType::Counter, evictions));
  return out;
}

}  // namespace epd::internal
