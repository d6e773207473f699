#include "stats_series.h"

#include <string>
#include <unordered_map>
#include <utility>

#include "proto_convert.h"
#include "tenant_cache_series.h"

namespace epd::internal {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Families by name, in the order they were first asked for.
class Families {
 public:
  MetricFamily& Get(std::string_view name, std::string_view help, MetricType type) {
    auto [it, added] = index_.try_emplace(std::string(name), out_.size());
    if (added) out_.push_back(MetricFamily{std::string(name), std::string(help), type, {}});
    return out_[it->second];
  }

  // One series per row of `table` that has a family.
  template <typename Table, typename S>
  void AddRows(const Table& table, const S& s) {
    for (const auto& row : table) {
      if (row.metric.family.empty()) continue;
      MetricFamily& f =
          Get(row.metric.family, row.help, row.kind == StatKind::kCounter ? MetricType::Counter : MetricType::Gauge);
      std::vector<ClientMetric::Label> labels;
      if (!row.metric.label_name.empty()) {
        labels.push_back({std::string(row.metric.label_name), std::string(row.metric.label_value)});
      }
      Add(f, StatValue(row, s), std::move(labels));
    }
  }

  // One series per map entry, labelled `label` = the entry's key as `name_of` gives it.
  template <typename Map, typename NameOf>
  void AddMap(std::string_view family, std::string_view help, const char* label, const Map& m, NameOf name_of) {
    MetricFamily& f = Get(family, help, MetricType::Counter);
    for (const auto& [k, n] : m) Add(f, static_cast<double>(n), {{label, name_of(k)}});
  }

  std::vector<MetricFamily> Take() { return std::move(out_); }

 private:
  static void Add(MetricFamily& f, double value, std::vector<ClientMetric::Label> labels) {
    ClientMetric m;
    m.label = std::move(labels);
    if (f.type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    f.metric.push_back(std::move(m));
  }

  std::vector<MetricFamily> out_;
  std::unordered_map<std::string, std::size_t> index_;
};

std::string CodeName(StatusCode code) { return GrpcCodeName(static_cast<int>(code)); }

}  // namespace

std::vector<MetricFamily> StatsFamilies(const ServerStats& s, TenantLabels& tenant_labels) {
  Families f;
  f.AddRows(kWorkerStatsFields, s.worker);
  f.AddRows(kServerStatsFields, s);
  f.AddRows(kShmStatsFields, s.shm);
  f.AddRows(kIpcStatsFields, s.ipc);
  if (s.l3_enabled) {
    f.AddRows(kSharedTierStatsFields, s.l3);
    f.AddMap("epd_l3_errors_total", "Failed L3 operations, by kind", "kind", s.l3.errors,
             [](const std::string& kind) { return kind; });
    f.AddMap("epd_l3_node_errors_total", "Failed L3 operations, by Redis node", "node", s.l3.node_errors,
             [](const std::string& node) { return node; });
  }
  f.AddMap("epd_item_errors_total", "Failed items, by status code", "code", s.worker.errors, CodeName);
  f.AddMap("epd_rpc_errors_total", "Calls (any service) that ended with an error, by status code", "code", s.rpc_errors,
           CodeName);
  std::vector<MetricFamily> out = f.Take();
  for (MetricFamily& t : TenantCacheFamilies(s.worker.tenant_cache, tenant_labels)) out.push_back(std::move(t));
  return out;
}

}  // namespace epd::internal
