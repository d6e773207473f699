// src/server/tenant_cache_series.h (internal): the per-tenant cache families
// of /metrics (metrics.h), from WorkerStats::tenant_cache (tenant quotas,
// epd/core/tenant_quota.h; docs/SERVER.md, "Tenant quotas"):
//   epd_tenant_cache_bytes{tenant, tier}            gauge, bytes held now
//   epd_tenant_cache_refusals_total{tenant, tier}   counter, puts refused
//   epd_tenant_cache_evictions_total{tenant, tier}  counter, entries evicted
//                                                   (always over the reservation)
// tier is l1 or l2. No rows (no quotas): no families.
//
// Tenant names are capped by `labels` (tenant_labels.h, --max-tenant-labels):
// rows are ranked in the order given (the quota's tenant ids) where `labels`
// has not ranked them yet, the pool's row ("") is labelled "shared", and
// every tenant past the cap is summed into tenant="other".
//
// Thread safety: as `labels` (thread-safe). Complexity: O(rows log tenants).
#pragma once

#include <prometheus/metric_family.h>

#include <vector>

#include "epd/core/tenant_quota.h"
#include "tenant_labels.h"

namespace epd::internal {

std::vector<prometheus::MetricFamily> TenantCacheFamilies(const std::vector<TenantCacheRow>& rows,
                                                          TenantLabels& labels);

}  // namespace epd::internal
