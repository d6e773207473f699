// See tenant_stats.h.
#include "tenant_stats.h"

#include <cstdio>
#include <vector>

namespace epd::internal {
namespace {

// One row of the families' table: name, help, field.
struct Family {
  const char* name;
  const char* help;
  std::uint64_t TenantCounters::*field;
};

constexpr Family kFamilies[] = {
    {"epd_tenant_requests_total", "Requests admitted to the worker, by tenant", &TenantCounters::requests},
    {"epd_tenant_items_total", "Items delivered, by tenant", &TenantCounters::items},
    {"epd_tenant_hits_l1_total", "Items served from L1, by tenant", &TenantCounters::hits_l1},
    {"epd_tenant_hits_l2_total", "Items served from L2, by tenant", &TenantCounters::hits_l2},
    {"epd_tenant_hits_l3_total", "Items served from the shared tier (L3), by tenant", &TenantCounters::hits_l3},
    {"epd_tenant_misses_total", "Items that ran the tower, by tenant", &TenantCounters::misses},
    {"epd_tenant_joins_total", "Items that joined an in-flight encode, by tenant", &TenantCounters::joins},
    {"epd_tenant_refusals_total", "Calls refused by a budget (RESOURCE_EXHAUSTED), by tenant",
     &TenantCounters::refusals},
    {"epd_tenant_failed_items_total", "Items that failed, by tenant", &TenantCounters::failed_items},
};

// Prometheus label value escaping: backslash, double quote.
std::string Escaped(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace

void TenantCounters::Add(const TenantCounters& o) {
  for (const Family& f : kFamilies) this->*f.field += o.*f.field;
}

TenantStats::TenantStats(int max_labels, const std::set<std::string>& first) : labels_(max_labels, first) {
  for (const std::string& t : first) {
    if (exact_.size() >= kMaxRankedTenants) break;
    exact_.emplace(t, TenantCounters{});
  }
}

TenantCounters& TenantStats::Slot(const std::string& tenant) {
  auto it = exact_.find(tenant);
  if (it != exact_.end()) return it->second;
  if (exact_.size() >= kMaxRankedTenants) return untracked_;
  labels_.Of(tenant);  // ranks it at its first count
  return exact_[tenant];
}

void TenantStats::CountRequest(const std::string& tenant) {
  MutexLock lock(mu_);
  ++Slot(tenant).requests;
}

void TenantStats::CountRefusal(const std::string& tenant) {
  MutexLock lock(mu_);
  ++Slot(tenant).refusals;
}

void TenantStats::CountItem(const std::string& tenant, const ItemResult& r) {
  MutexLock lock(mu_);
  TenantCounters& c = Slot(tenant);
  ++c.items;
  if (!r.status.ok()) {
    ++c.failed_items;
    return;
  }
  switch (r.source) {
    case ItemSource::kL1:
      ++c.hits_l1;
      break;
    case ItemSource::kL2:
      ++c.hits_l2;
      break;
    case ItemSource::kL3:
      ++c.hits_l3;
      break;
    case ItemSource::kJoined:
      ++c.joins;
      break;
    case ItemSource::kMiss:
      ++c.misses;
      break;
  }
}

TenantCounters TenantStats::Of(const std::string& tenant) const {
  MutexLock lock(mu_);
  const auto it = exact_.find(tenant);
  return it == exact_.end() ? TenantCounters{} : it->second;
}

std::map<std::string, TenantCounters> TenantStats::Labelled() const {
  MutexLock lock(mu_);
  std::map<std::string, TenantCounters> out;
  for (const auto& [tenant, counts] : exact_) out[labels_.Of(tenant)].Add(counts);
  if (exact_.size() >= kMaxRankedTenants) out[kOtherTenantLabel].Add(untracked_);
  return out;
}

std::string TenantStats::Render() const {
  const std::map<std::string, TenantCounters> rows = Labelled();
  std::string out;
  for (const Family& f : kFamilies) {
    out += std::string("# HELP ") + f.name + " " + f.help + "\n# TYPE " + f.name + " counter\n";
    for (const auto& [label, counts] : rows) {
      out += std::string(f.name) + "{tenant=\"" + Escaped(label) + "\"} " + std::to_string(counts.*f.field) + "\n";
    }
  }
  return out;
}

}  // namespace epd::internal
