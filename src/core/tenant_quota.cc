// TenantLedger, ParseTenantQuota and TenantQuotas (epd/core/tenant_quota.h).
#include "epd/core/tenant_quota.h"

#include <charconv>

namespace epd {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
// 2^40 MiB (1 EiB): far above any tier, and its bytes fit an int64.
constexpr std::int64_t kMaxTenantMiB = std::int64_t{1} << 40;

Status Invalid(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }

// A whole number of MiB, as bytes; nullopt when not one or too large.
std::optional<std::int64_t> ParseMiB(std::string_view s) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 0 || v > kMaxTenantMiB) {
    return std::nullopt;
  }
  return v * kMiB;
}

}  // namespace

TenantLedger::TenantLedger(std::int64_t capacity_bytes) : capacity_(capacity_bytes) {
  if (capacity_bytes < 0) throw Error(Invalid("ledger capacity must be >= 0, got " + std::to_string(capacity_bytes)));
}

Status TenantLedger::CheckReservation(TenantId t, std::int64_t bytes) const {
  if (bytes < 0) return Invalid("reservation of tenant " + std::to_string(t) + " must be >= 0");
  const std::int64_t sum = total_reserved_ - reserved(t) + bytes;
  if (sum > capacity_) {
    return Invalid("reserving " + std::to_string(bytes) + " bytes for tenant " + std::to_string(t) +
                   " makes the reservations " + std::to_string(sum) + " bytes, over the capacity of " +
                   std::to_string(capacity_));
  }
  return Status::Ok();
}

void TenantLedger::SetReservation(TenantId t, std::int64_t bytes) {
  if (Status s = CheckReservation(t, bytes); !s.ok()) throw Error(std::move(s));
  Row& r = RowOf(t);
  total_reserved_ += bytes - r.reserved;
  r.reserved = bytes;
}

TenantLedger::Row& TenantLedger::RowOf(TenantId t) {
  if (t >= rows_.size()) rows_.resize(static_cast<std::size_t>(t) + 1);
  return rows_[t];
}

StatusOr<std::pair<std::string, TierBytes>> ParseTenantQuota(std::string_view flag, std::string_view text, bool named) {
  const std::string what = std::string(flag) + " '" + std::string(text) + "'";
  std::string name;
  std::string_view sizes = text;
  if (named) {
    const std::size_t eq = text.find('=');
    if (eq == std::string_view::npos || eq == 0) return Invalid(what + ": expected NAME=L1MB/L2MB");
    name = std::string(text.substr(0, eq));
    sizes = text.substr(eq + 1);
  }
  const std::size_t slash = sizes.find('/');
  if (slash == std::string_view::npos) return Invalid(what + ": expected L1MB/L2MB (MiB, whole numbers)");
  const std::optional<std::int64_t> l1 = ParseMiB(sizes.substr(0, slash));
  const std::optional<std::int64_t> l2 = ParseMiB(sizes.substr(slash + 1));
  if (!l1 || !l2) return Invalid(what + ": L1MB and L2MB must be whole numbers of MiB >= 0");
  return std::make_pair(std::move(name), TierBytes{*l1, *l2});
}

TenantQuotas::TenantQuotas(Options options) : options_(std::move(options)) {
  names_.emplace_back();
  reserved_.emplace_back();
}

StatusOr<std::shared_ptr<TenantQuotas>> TenantQuotas::Create(Options options, std::string_view flag) {
  if (options.named.size() + 1 >= kMaxQuotaTenants) {
    return Invalid(std::string(flag) + ": at most " + std::to_string(kMaxQuotaTenants - 2) + " named tenants");
  }
  TierBytes sum = options.default_reservation.value_or(TierBytes{});
  std::shared_ptr<TenantQuotas> q(new TenantQuotas(options));
  for (const auto& [name, r] : options.named) {
    if (name.empty()) return Invalid(std::string(flag) + ": a tenant name must not be empty");
    if (q->ids_.count(name) != 0) return Invalid(std::string(flag) + ": tenant '" + name + "' is given twice");
    sum.l1 += r.l1;
    sum.l2 += r.l2;
    q->ids_.emplace(name, static_cast<TenantId>(q->names_.size()));
    q->names_.push_back(name);
    q->reserved_.push_back(r);
  }
  const char* tiers[] = {"L1", "L2"};
  const std::int64_t sums[] = {sum.l1, sum.l2};
  const std::int64_t caps[] = {options.capacity.l1, options.capacity.l2};
  for (int i = 0; i < 2; ++i) {
    if (sums[i] > caps[i]) {
      return Invalid(std::string(flag) + ": the " + tiers[i] + " reservations" +
                     (options.default_reservation ? " (with one --tenant-quota-default)" : "") + " sum to " +
                     std::to_string(sums[i] / kMiB) + " MiB, over the " + tiers[i] + " capacity of " +
                     std::to_string(caps[i] / kMiB) + " MiB");
    }
  }
  q->total_ = TierBytes{sum.l1 - (options.default_reservation ? options.default_reservation->l1 : 0),
                        sum.l2 - (options.default_reservation ? options.default_reservation->l2 : 0)};
  return q;
}

TenantId TenantQuotas::Intern(std::string_view name) {
  if (name.empty()) return kSharedTenant;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = ids_.find(std::string(name)); it != ids_.end()) return it->second;
  if (names_.size() >= kMaxQuotaTenants) return kSharedTenant;
  TierBytes r{};
  if (const auto& d = options_.default_reservation) {
    if (total_.l1 + d->l1 <= options_.capacity.l1 && total_.l2 + d->l2 <= options_.capacity.l2) {
      r = *d;
      total_.l1 += d->l1;
      total_.l2 += d->l2;
    } else {
      ++defaults_denied_;
    }
  }
  const auto id = static_cast<TenantId>(names_.size());
  ids_.emplace(std::string(name), id);
  names_.emplace_back(name);
  reserved_.push_back(r);
  return id;
}

TierBytes TenantQuotas::reservation(TenantId t) const {
  std::lock_guard<std::mutex> lock(mu_);
  return t < reserved_.size() ? reserved_[t] : TierBytes{};
}

std::string TenantQuotas::name(TenantId t) const {
  std::lock_guard<std::mutex> lock(mu_);
  return t < names_.size() ? names_[t] : std::string();
}

std::size_t TenantQuotas::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return names_.size();
}

std::uint64_t TenantQuotas::defaults_denied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return defaults_denied_;
}

}  // namespace epd
