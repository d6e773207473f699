// src/server/tenant_cache_series.h (internal): the per-tenant cache families
// of /metrics (metrics.h), from WorkerStats::tenant_cache (tenant quotas,
// epd/core/tenant_quota.h; docs/SERVER.md, "Tenant quotas"):
//   epd_tenant_cache_bytes{tenant, tier}            gauge, bytes held now
//   epd_tenant_cache_refusals_total{tenant, tier}   counter, puts refused
//   epd_tenant_cache_evictions_total{tenant, tier}  counter, entries evicted
//                                                   (always over the reservation)
// tier is l1 or l2. No rows (no quotas): no families.
//
// Tenant names are capped: the first `max_labels` tenants in id order (the
// named ones first, kSharedTenant as "shared") keep their names, the rest are
// summed into tenant="other" (TenantLabel). The `--max-tenant-labels` flag
// and a shared folding unit belong to the per-tenant stats work
// (src/server/tenant_stats.*, not on main yet); until they land the cap is
// kDefaultMaxTenantLabels and TenantLabel is the one function to switch.
//
// Thread safety: pure functions. Complexity: O(rows).
#pragma once

#include <prometheus/metric_family.h>

#include <cstddef>
#include <string>
#include <vector>

#include "epd/core/tenant_quota.h"

namespace epd::internal {

inline constexpr std::size_t kDefaultMaxTenantLabels = 32;

// The label of the tenant at `rank` (its row's index) named `name`.
std::string TenantLabel(const std::string& name, std::size_t rank, std::size_t max_labels);

std::vector<prometheus::MetricFamily> TenantCacheFamilies(const std::vector<TenantCacheRow>& rows,
                                                          std::size_t max_labels = kDefaultMaxTenantLabels);

}  // namespace epd::internal
