// src/server/tenant_labels.h (internal): the one rule that caps the `tenant`
// label of every per-tenant metric family (--max-tenant-labels, issue 25
// section 3), so that made-up tenant names cannot grow /metrics without
// bound:
//   epd_tenant_*_total{tenant}        (tenant_stats.h, by tenant name)
//   epd_tenant_cache_*{tenant, tier}  (tenant_cache_series.h, by the quota's
//                                      tenant: "tenant:<name>" or a share)
//
// Each name gets a rank the first time it is seen (the `first` names, in
// name order, before any other); the first max_labels ranks keep their name
// as the label and every later name is labelled "other", so a family's
// "other" series is the sum of the folded tenants. A tenant named "other"
// is folded too. Ranks are kept for at most kMaxRankedTenants names; past
// that every new name is "other". The empty name (the cache's shared pool,
// no tenant) is labelled "shared" and takes no rank: it is not a tenant.
//
// Thread safety: thread-safe (one mutex). Cost: O(log names) per Of().
#pragma once

#include <cstddef>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "epd/core/mutex.h"

namespace epd::internal {

inline constexpr std::size_t kMaxRankedTenants = 10000;
// ServerOptions::max_tenant_labels' default (epd/server/server.h).
inline constexpr int kDefaultMaxTenantLabels = 32;
inline constexpr char kOtherTenantLabel[] = "other";
inline constexpr char kSharedPoolLabel[] = "shared";

class TenantLabels {
 public:
  // max_labels < 1 is taken as 1 (TenantDirectory refuses it first).
  TenantLabels(int max_labels, const std::set<std::string>& first)
      : max_labels_(static_cast<std::size_t>(max_labels < 1 ? 1 : max_labels)) {
    for (const std::string& t : first) Rank(t);
  }

  // The label `tenant`'s series goes under (see the header comment); ranks
  // `tenant` if it is new.
  std::string Of(const std::string& tenant) {
    if (tenant.empty()) return kSharedPoolLabel;
    if (tenant == kOtherTenantLabel) return kOtherTenantLabel;
    MutexLock lock(mu_);
    return Rank(tenant) < max_labels_ ? tenant : kOtherTenantLabel;
  }

  std::size_t max_labels() const { return max_labels_; }

 private:
  // Held mu_, or the constructor. The largest size_t = unranked.
  std::size_t Rank(const std::string& tenant) EPD_REQUIRES(mu_) {
    const auto it = rank_.find(tenant);
    if (it != rank_.end()) return it->second;
    if (rank_.size() >= kMaxRankedTenants) return std::numeric_limits<std::size_t>::max();
    const std::size_t r = rank_.size();
    rank_.emplace(tenant, r);
    return r;
  }

  const std::size_t max_labels_;
  Mutex mu_;
  std::map<std::string, std::size_t> rank_ EPD_GUARDED_BY(mu_);
};

}  // namespace epd::internal
