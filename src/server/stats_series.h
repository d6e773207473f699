// src/server/stats_series.h (internal): the Prometheus counter and gauge
// families of one ServerStats snapshot, built from the stats field tables
// (epd/core/stat_fields.h) for /metrics (metrics.h).
//
// Families, in this order: each table row with a series, grouped by family in
// the order the families first appear (WorkerStats, ServerStats, ShmStats,
// IpcStats, then SharedTierStats only when l3_enabled), a labelled family's
// series in row order; then by hand, from the maps, epd_l3_errors_total{kind}
// (with a tier), epd_item_errors_total{code} and epd_rpc_errors_total{code}
// (present even when empty); last, with tenant quotas, the per-tenant cache
// families (tenant_cache_series.h), their tenant labels capped by
// `tenant_labels` (--max-tenant-labels). A family takes its type and HELP
// from its first row.
//
// Thread safety: as `tenant_labels` (thread-safe). Complexity: O(rows + map
// entries).
#pragma once

#include <prometheus/metric_family.h>

#include <vector>

#include "epd/rpc/server_stats.h"
#include "tenant_labels.h"

namespace epd::internal {

std::vector<prometheus::MetricFamily> StatsFamilies(const ServerStats& s, TenantLabels& tenant_labels);

}  // namespace epd::internal
