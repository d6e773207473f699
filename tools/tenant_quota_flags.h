// tools/tenant_quota_flags.h: the per-tenant cache reservation flags of
// every subcommand that runs an EncodeWorker (serve, replay, bench-server),
// and their check against the cache capacities at start.
//
// Flags:
//   --tenant-quota NAME=L1MB/L2MB   reserve L1MB MiB of L1 and L2MB MiB of L2
//                                   for tenant NAME (repeatable)
//   --tenant-quota-default L1MB/L2MB
//                                   the reservation of every other tenant,
//                                   granted on first sight while the sums stay
//                                   within the capacities (then none)
// Without either, there are no quotas and the cache is the reference's.
// NAME is the tenant a client names in the x-epd-tenant metadata: the server
// calls that tenant "tenant:NAME" (ServerOptions::tenant_metadata), so the
// registry holds "tenant:NAME" (kHeaderTenantPrefix), which /metrics shows.
// A client that names no tenant is its address and gets the default.
// The model: epd/core/tenant_quota.h; docs/SERVER.md, "Tenant quotas".
//
// Thread safety: not thread-safe (parse-time helpers).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "epd/core/status.h"
#include "epd/core/tenant_quota.h"

namespace epd::cli {

// What the server prefixes to a tenant named by metadata (src/server/admission.cc).
inline constexpr const char* kHeaderTenantPrefix = "tenant:";

struct TenantQuotaFlags {
  std::vector<std::string> named;  // each NAME=L1MB/L2MB
  std::string default_quota;       // L1MB/L2MB, or empty
};

// Adds the flags above to `cmd`, writing into `flags` (which must outlive it).
void AddTenantQuotaFlags(CLI::App& cmd, TenantQuotaFlags& flags);

// The registry for the flags, checked against the tier capacities (bytes):
// null when no quota flag is given; kInvalidArgument naming the flag when a
// value does not parse, a name repeats, or the reservations (with one
// default) sum past a tier's capacity.
StatusOr<std::shared_ptr<TenantQuotas>> MakeTenantQuotas(const TenantQuotaFlags& flags, std::int64_t l1_capacity_bytes,
                                                         std::int64_t l2_capacity_bytes);

}  // namespace epd::cli
