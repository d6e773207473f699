// epd/core/tenant_quota.h: per-tenant cache reservations. A tenant is an
// interned small id (TenantId); each cache tier keeps a TenantLedger of what
// every tenant holds and has reserved; TenantQuotas is the server-wide
// registry that turns tenant names into ids and reservations.
//
// The model (docs/SERVER.md, "Tenant quotas"): a tier of capacity C gives
// tenant t a reservation R_t (bytes, sum R_t <= C) plus access to the shared
// pool S = C - sum R_t. With a ledger on, EmbeddingCache
// (epd/core/embedding_cache.h) evicts only entries of tenants holding more
// than their reservation (B_t > R_t), in that tenant's own LRU or GDSF order;
// among several such tenants it takes the globally next victim (the oldest
// touch under LRU, the lowest priority under GDSF). A put of n bytes by
// tenant t is refused (counted) when n > R_t + S: the only put that cannot be
// made room for without taking a tenant below its reservation. Any other put
// fits: while the tier is over C, some tenant other than the newcomer's entry
// is over its reservation (sum B_t > C >= sum R_t + S).
//
// Tenant 0 (kSharedTenant) holds entries put without a tenant and, in
// TenantQuotas, names past the registry's cap; it reserves nothing unless a
// caller reserves for it.
//
// Thread safety: TenantLedger is thread-compatible (its cache's owner);
// TenantQuotas is thread-safe (a mutex around interning; reservations are
// fixed once an id is handed out).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "epd/core/status.h"

namespace epd {

// An interned tenant: a dense small integer, never a string per entry.
using TenantId = std::uint16_t;
// Entries put without a tenant, and tenants past TenantQuotas' cap.
inline constexpr TenantId kSharedTenant = 0;
// The most ids TenantQuotas hands out (ids 1..kMaxQuotaTenants-1 are named
// tenants). Victim selection scans the tenants of a tier, so this bounds it.
inline constexpr std::size_t kMaxQuotaTenants = 256;

// Bytes per tier: a reservation, or a tier's capacity.
struct TierBytes {
  std::int64_t l1 = 0;
  std::int64_t l2 = 0;
};

// What one tier holds and has reserved, per tenant. Rows appear when a
// tenant is first charged or reserved; an unknown tenant reads as zeros.
// Every call is O(1) (amortised for a new row). Thread-compatible.
class TenantLedger {
 public:
  struct Row {
    std::int64_t reserved = 0;    // bytes guaranteed to the tenant
    std::int64_t bytes = 0;       // bytes of its entries held now
    std::uint64_t refusals = 0;   // puts refused (n > reserved + shared pool)
    std::uint64_t evictions = 0;  // its entries evicted (always while over its reservation)
  };

  // Throws epd::Error(kInvalidArgument) unless 0 <= capacity_bytes.
  explicit TenantLedger(std::int64_t capacity_bytes);

  // kInvalidArgument naming the tenant id and the sums when reserving
  // `bytes` for `t` (replacing its previous reservation) would make the sum
  // of reservations exceed the capacity, or when bytes < 0; OK otherwise.
  Status CheckReservation(TenantId t, std::int64_t bytes) const;
  // Sets t's reservation; throws epd::Error with CheckReservation's status.
  void SetReservation(TenantId t, std::int64_t bytes);

  std::int64_t capacity_bytes() const { return capacity_; }
  std::int64_t total_reserved() const { return total_reserved_; }
  // Capacity less every reservation: what tenants share above theirs.
  std::int64_t shared_pool() const { return capacity_ - total_reserved_; }
  std::int64_t reserved(TenantId t) const { return t < rows_.size() ? rows_[t].reserved : 0; }
  std::int64_t bytes(TenantId t) const { return t < rows_.size() ? rows_[t].bytes : 0; }
  // Whether t holds more than its reservation (its entries are evictable).
  bool Over(TenantId t) const { return t < rows_.size() && rows_[t].bytes > rows_[t].reserved; }
  // Whether a put of `nbytes` by t can be made room for (see the header).
  bool Admits(TenantId t, std::int64_t nbytes) const { return nbytes <= reserved(t) + shared_pool(); }

  void Charge(TenantId t, std::int64_t nbytes) { RowOf(t).bytes += nbytes; }
  void Discharge(TenantId t, std::int64_t nbytes) { RowOf(t).bytes -= nbytes; }
  void CountRefusal(TenantId t) { ++RowOf(t).refusals; }
  void CountEviction(TenantId t) { ++RowOf(t).evictions; }

  // Ids 0..size()-1 have rows (some may be all zeros).
  std::size_t size() const { return rows_.size(); }
  Row row(TenantId t) const { return t < rows_.size() ? rows_[t] : Row{}; }

 private:
  Row& RowOf(TenantId t);

  std::int64_t capacity_;
  std::int64_t total_reserved_ = 0;
  std::vector<Row> rows_;
};

// One tenant's share of a two-tier cache, for stats and /metrics: bytes held
// per tier, puts refused per tier, and its entries evicted per tier (an L1
// victim is demoted to L2 when it fits there).
struct TenantCacheRow {
  std::string tenant;  // its name ("" for kSharedTenant)
  std::int64_t l1_bytes = 0;
  std::int64_t l2_bytes = 0;
  std::uint64_t l1_refusals = 0;
  std::uint64_t l2_refusals = 0;
  std::uint64_t l1_evictions = 0;
  std::uint64_t l2_evictions = 0;
};

// "NAME=L1MB/L2MB" (a named reservation) or "L1MB/L2MB" (the default), in
// MiB (2^20 bytes), each a whole number >= 0. kInvalidArgument naming `flag`
// and the text otherwise.
StatusOr<std::pair<std::string, TierBytes>> ParseTenantQuota(std::string_view flag, std::string_view text, bool named);

// The registry: tenant names to ids and each id's reservation per tier.
//   - A named tenant (Options::named) gets its configured reservation.
//   - Any other name gets Options::default_reservation while the sums of
//     reservations stay within the capacities, and none past that (it then
//     uses the shared pool only; counted in defaults_denied()).
//   - Past kMaxQuotaTenants ids, and for the empty name, Intern returns
//     kSharedTenant, which reserves nothing.
// Thread safety: thread-safe. Intern is O(1) expected under a mutex;
// reservation() and name() take the same mutex.
class TenantQuotas {
 public:
  struct Options {
    TierBytes capacity;                                    // each tier's capacity, bytes
    std::vector<std::pair<std::string, TierBytes>> named;  // name -> reservation
    std::optional<TierBytes> default_reservation;          // for every other name
  };

  // kInvalidArgument when the named reservations plus one default exceed a
  // tier's capacity (naming the tier, the sum and `flag`), when a name is
  // repeated or empty, or when there are more names than ids.
  static StatusOr<std::shared_ptr<TenantQuotas>> Create(Options options, std::string_view flag = "--tenant-quota");

  TenantId Intern(std::string_view name);
  TierBytes reservation(TenantId t) const;
  std::string name(TenantId t) const;
  // Ids handed out so far (kSharedTenant included).
  std::size_t size() const;
  std::uint64_t defaults_denied() const;
  const Options& options() const { return options_; }

 private:
  explicit TenantQuotas(Options options);

  Options options_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, TenantId> ids_;
  std::vector<std::string> names_;
  std::vector<TierBytes> reserved_;
  TierBytes total_;
  std::uint64_t defaults_denied_ = 0;
};

}  // namespace epd
