// src/server/tenant_stats.h (internal): per-tenant counters at the server
// layer (issue 25): calls, items, hits by tier, misses, in-flight joins and
// refusals, counted from each item's ItemResult::source as it is delivered.
//
// Two views, one table:
//   * Of(tenant): the tenant's own counts, exact, for the Stats reply a
//     tenant credential gets (never another tenant's, never a folded total).
//   * Render(): the Prometheus families epd_tenant_*_total{tenant="..."}.
//     At most max_labels tenants get a label of their own (the tenants the
//     tokens file names first, then others in the order they first call);
//     every later tenant is folded into tenant="other" (summed at render
//     time). The rule is TenantLabels (tenant_labels.h), the same one the
//     per-tenant cache families use.
// The exact table itself is capped at kMaxRankedTenants names; a tenant
// beyond that is counted only under "other" (and its Of() reads zeros).
//
// Thread safety: thread-safe (one mutex; each count holds it for a map
// lookup). Cost: O(log tenants) per count, O(tenants) per render.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "epd/core/encode_types.h"
#include "epd/core/mutex.h"
#include "tenant_labels.h"

namespace epd::internal {

struct TenantCounters {
  std::uint64_t requests = 0;  // Encode calls (gRPC) or HTTP requests admitted to the worker
  std::uint64_t items = 0;     // items delivered (ok or failed)
  std::uint64_t hits_l1 = 0, hits_l2 = 0, hits_l3 = 0;
  std::uint64_t misses = 0;    // items that ran the tower (or failed before it)
  std::uint64_t joins = 0;     // items that joined an in-flight encode
  std::uint64_t refusals = 0;  // calls refused for a budget (RESOURCE_EXHAUSTED)
  std::uint64_t failed_items = 0;

  void Add(const TenantCounters& o);
};

class TenantStats {
 public:
  // `first` get labels first (in name order), up to max_labels >= 1.
  TenantStats(int max_labels, const std::set<std::string>& first);

  void CountRequest(const std::string& tenant);
  void CountItem(const std::string& tenant, const ItemResult& r);
  void CountRefusal(const std::string& tenant);

  TenantCounters Of(const std::string& tenant) const;
  // Label -> counts, with every tenant past max_labels summed under "other".
  std::map<std::string, TenantCounters> Labelled() const;
  // Prometheus text exposition of Labelled().
  std::string Render() const;

 private:
  TenantCounters& Slot(const std::string& tenant) EPD_REQUIRES(mu_);

  mutable TenantLabels labels_;  // ranks tenants in the order they are first counted
  mutable Mutex mu_;
  std::map<std::string, TenantCounters> exact_ EPD_GUARDED_BY(mu_);
  TenantCounters untracked_ EPD_GUARDED_BY(mu_);  // past kMaxRankedTenants
};

}  // namespace epd::internal
