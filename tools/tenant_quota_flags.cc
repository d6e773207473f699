// The tenant quota flags (tenant_quota_flags.h).
#include "tenant_quota_flags.h"

#include <utility>

namespace epd::cli {

void AddTenantQuotaFlags(CLI::App& cmd, TenantQuotaFlags& f) {
  cmd.add_option("--tenant-quota", f.named,
                 "reserve cache bytes for a tenant, NAME=L1MB/L2MB in MiB (repeatable); eviction takes from tenants "
                 "over their reservation first");
  cmd.add_option("--tenant-quota-default", f.default_quota,
                 "the L1MB/L2MB reservation of every tenant not named by --tenant-quota, while room remains");
}

StatusOr<std::shared_ptr<TenantQuotas>> MakeTenantQuotas(const TenantQuotaFlags& f, std::int64_t l1_capacity_bytes,
                                                         std::int64_t l2_capacity_bytes) {
  if (f.named.empty() && f.default_quota.empty()) return std::shared_ptr<TenantQuotas>();
  TenantQuotas::Options o;
  o.capacity = {l1_capacity_bytes, l2_capacity_bytes};
  for (const std::string& text : f.named) {
    auto q = ParseTenantQuota("--tenant-quota", text, true);
    if (!q.ok()) return q.status();
    q->first = kHeaderTenantPrefix + q->first;
    o.named.push_back(std::move(*q));
  }
  if (!f.default_quota.empty()) {
    auto q = ParseTenantQuota("--tenant-quota-default", f.default_quota, false);
    if (!q.ok()) return q.status();
    o.default_reservation = q->second;
  }
  return TenantQuotas::Create(std::move(o),
                              f.default_quota.empty() ? "--tenant-quota" : "--tenant-quota / --tenant-quota-default");
}

}  // namespace epd::cli
