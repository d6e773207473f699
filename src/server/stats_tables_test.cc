// The stats field tables (epd/core/stat_fields.h) against the places they
// drive: the StatsResponse message (its protobuf descriptor, both ways), the
// Stats RPC's conversion (a round trip over the wire of a snapshot whose every
// field holds a distinct value, spot-checked through the generated
// accessors), /metrics (each row's series and value, and every series
// docs/SERVER.md and docs/L3.md name) and the replay report's keys.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "epd/core/encode_types.h"
#include "epd/core/shared_tier.h"
#include "epd/rpc/server_stats.h"
#include "metrics.h"
#include "proto_convert.h"
#include "tenant_cache_series.h"

namespace epd {
namespace {

namespace pb = google::protobuf;

// What a row's StatsResponse field must be called: its table's prefix and
// the member's name (the shared tier's counters: that name as the key of
// l3_counters). Written here, not taken from the tables.
const std::map<std::string, std::string> kPrefix = {
    {"WorkerStats", ""}, {"ServerStats", ""}, {"ShmStats", "shm_"}, {"IpcStats", "ipc_"}, {"SharedTierStats", "l3_"}};
// StatsResponse fields the conversion carries by hand (they are no number).
// (scope, tenant, tenant_stats: the Stats RPC's caller scoping, server_impl.h.)
const std::set<std::string> kByHand = {"server_id", "item_errors", "rpc_errors",   "l3_errors",
                                       "scope",     "tenant",      "tenant_stats", "l3_node_errors"};
// The rows that stay in the process (commit 8aa0e98 for the budget's two).
const std::set<std::string> kNotSent = {"WorkerStats.callback_exceptions", "ServerStats.request_bytes_in_flight",
                                        "ServerStats.admission_waiting"};

template <typename T>
pb::FieldDescriptor::CppType CppTypeOf() {
  if constexpr (std::is_same_v<T, std::uint64_t>) return pb::FieldDescriptor::CPPTYPE_UINT64;
  if constexpr (std::is_same_v<T, std::int64_t>) return pb::FieldDescriptor::CPPTYPE_INT64;
  if constexpr (std::is_same_v<T, double>) return pb::FieldDescriptor::CPPTYPE_DOUBLE;
  return pb::FieldDescriptor::CPPTYPE_BOOL;
}

// One row of any table, with its table's name and its member's proto type.
struct Row {
  std::string table;
  std::string name;
  StatKind kind;
  StatUnit unit;
  std::string help;
  StatProto proto;
  StatMetric metric;
  std::string report;
  pb::FieldDescriptor::CppType cpp_type;
};

template <typename S, typename Table>
void AddRows(const std::string& table_name, const Table& table, std::vector<Row>& out) {
  S probe{};
  for (const auto& f : table) {
    Row r{table_name, std::string(f.name),   f.kind, f.unit, std::string(f.help), f.proto,
          f.metric,   std::string(f.report), {}};
    VisitStat(f, probe, [&](const auto& v) { r.cpp_type = CppTypeOf<std::decay_t<decltype(v)>>(); });
    out.push_back(r);
  }
}

std::vector<Row> AllRows() {
  std::vector<Row> rows;
  AddRows<WorkerStats>("WorkerStats", kWorkerStatsFields, rows);
  AddRows<ServerStats>("ServerStats", kServerStatsFields, rows);
  AddRows<ShmStats>("ShmStats", kShmStatsFields, rows);
  AddRows<IpcStats>("IpcStats", kIpcStatsFields, rows);
  AddRows<SharedTierStats>("SharedTierStats", kSharedTierStatsFields, rows);
  return rows;
}

// Sets every row's member of `s` to its own value: 1000 * n + 3 for the n-th
// number filled (plus 0.25 for a double), true for a flag.
template <typename Table, typename S>
void FillDistinct(const Table& table, S& s, int& n) {
  for (const auto& f : table) {
    VisitStat(f, s, [&](auto& v) {
      using T = std::decay_t<decltype(v)>;
      ++n;
      if constexpr (std::is_same_v<T, bool>) {
        v = true;
      } else if constexpr (std::is_same_v<T, double>) {
        v = 1000.0 * n + 3.25;
      } else {
        v = static_cast<T>(n) * 1000 + 3;
      }
    });
  }
}

ServerStats Filled() {
  ServerStats s;
  s.server_id = "server-7";
  int n = 0;
  FillDistinct(kServerStatsFields, s, n);
  FillDistinct(kWorkerStatsFields, s.worker, n);
  FillDistinct(kShmStatsFields, s.shm, n);
  FillDistinct(kIpcStatsFields, s.ipc, n);
  FillDistinct(kSharedTierStatsFields, s.l3, n);
  s.worker.errors = {{StatusCode::kInvalidArgument, 11}, {StatusCode::kInternal, 12}};
  s.rpc_errors = {{StatusCode::kResourceExhausted, 13}, {StatusCode::kUnauthenticated, 14}};
  for (const char* kind : {"connect", "timeout", "io", "oom", "auth", "reply", "down"}) s.l3.errors[kind] = 20;
  s.l3.node_errors = {{"10.0.0.1:7000/0", 21}, {"10.0.0.2:7001/0", 22}};
  s.worker.tenant_cache = {{"", 1, 2, 3, 4, 5, 6}, {"tenant:a", 7, 8, 9, 10, 11, 12}};
  return s;
}

// Each row of `table`: `back` holds what `sent` held when the row is on the
// wire, and the default (0) when it is not.
template <typename Table, typename S>
void ExpectRowsCameBack(const Table& table, const S& sent, const S& back) {
  for (const auto& f : table) {
    const double want = f.proto.field.empty() ? 0 : StatValue(f, sent);
    EXPECT_EQ(StatValue(f, back), want) << f.name;
  }
}

TEST(StatsTablesTest, EveryRowIsAStatsResponseFieldOfItsTypeAndEveryFieldARowOrByHand) {
  const pb::Descriptor* d = v1::StatsResponse::descriptor();
  std::set<std::string> rows_seen, fields_covered, not_sent;
  std::map<std::string, std::set<std::string>> map_keys;
  for (const Row& r : AllRows()) {
    const std::string id = r.table + "." + r.name;
    EXPECT_TRUE(rows_seen.insert(id).second) << id << " is in its table twice";
    if (r.proto.field.empty()) {
      not_sent.insert(id);
      continue;
    }
    const pb::FieldDescriptor* f = d->FindFieldByName(std::string(r.proto.field));
    ASSERT_NE(f, nullptr) << id << ": StatsResponse has no field " << r.proto.field;
    if (r.proto.key.empty()) {
      EXPECT_EQ(r.proto.field, kPrefix.at(r.table) + r.name) << id;
      EXPECT_FALSE(f->is_repeated()) << id;
      EXPECT_EQ(f->cpp_type(), r.cpp_type) << id << ": " << f->type_name();
      EXPECT_TRUE(fields_covered.insert(f->name()).second) << "two rows send StatsResponse." << f->name();
    } else {
      ASSERT_TRUE(f->is_map()) << id;
      EXPECT_EQ(r.proto.key, r.name) << id;
      EXPECT_EQ(f->message_type()->map_key()->cpp_type(), pb::FieldDescriptor::CPPTYPE_STRING) << id;
      EXPECT_EQ(f->message_type()->map_value()->cpp_type(), r.cpp_type) << id;
      EXPECT_TRUE(map_keys[f->name()].insert(std::string(r.proto.key)).second) << id;
    }
  }
  EXPECT_EQ(not_sent, kNotSent);
  for (int i = 0; i < d->field_count(); ++i) {
    const std::string name = d->field(i)->name();
    EXPECT_TRUE(fields_covered.count(name) + map_keys.count(name) + kByHand.count(name) == 1)
        << "StatsResponse." << name << " is in no table (or in one and carried by hand too)";
  }
  // The L3 tier's 13 counters, the two of the cluster key and the three of
  // Redis Cluster (docs/L3.md).
  EXPECT_EQ(map_keys["l3_counters"].size(), 18u);
  EXPECT_EQ(map_keys["l3_counters"].count("redirects_ask"), 1u);
  EXPECT_EQ(map_keys["l3_counters"].count("auth_failures"), 1u);
  EXPECT_EQ(map_keys["l3_counters"].count("lease_auth_failures"), 1u);
}

TEST(StatsTablesTest, RoundTripOverTheWireKeepsEveryFieldOfADistinctlyFilledSnapshot) {
  const ServerStats s = Filled();
  v1::StatsResponse m;
  internal::ToProto(s, &m);
  v1::StatsResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(m.SerializeAsString()));
  const ServerStats back = internal::FromProto(parsed);

  EXPECT_EQ(back.server_id, "server-7");
  ExpectRowsCameBack(kServerStatsFields, s, back);
  ExpectRowsCameBack(kWorkerStatsFields, s.worker, back.worker);
  ExpectRowsCameBack(kShmStatsFields, s.shm, back.shm);
  ExpectRowsCameBack(kIpcStatsFields, s.ipc, back.ipc);
  ExpectRowsCameBack(kSharedTierStatsFields, s.l3, back.l3);
  EXPECT_EQ(back.worker.errors, s.worker.errors);
  EXPECT_EQ(back.rpc_errors, s.rpc_errors);
  EXPECT_EQ(back.l3.errors, s.l3.errors);
  EXPECT_EQ(back.l3.node_errors, s.l3.node_errors);
  EXPECT_EQ(back.worker.callback_exceptions, 0u);
  EXPECT_EQ(back.request_bytes_in_flight, 0);

  // The irregular names, through the generated accessors.
  EXPECT_EQ(m.hits_l1(), s.worker.hits_l1);
  EXPECT_EQ(m.pending_items(), s.worker.pending_items);
  EXPECT_EQ(m.tower_seconds(), s.worker.tower_seconds);
  EXPECT_EQ(m.l1_capacity_bytes(), s.l1_capacity_bytes);
  EXPECT_EQ(m.shm_items(), s.shm.items);
  EXPECT_EQ(m.shm_session_unknown(), s.shm.session_unknown);
  EXPECT_EQ(m.ipc_session_reclaimed(), s.ipc.session_reclaimed);
  EXPECT_TRUE(m.l3_enabled());
  EXPECT_TRUE(m.l3_degraded());
  EXPECT_EQ(m.l3_counters().size(), 18u);
  EXPECT_EQ(m.l3_counters().at("slot_map_refreshes"), s.l3.slot_map_refreshes);
  EXPECT_EQ(m.l3_node_errors().at("10.0.0.2:7001/0"), 22u);
  EXPECT_EQ(m.l3_counters().at("auth_failures"), s.l3.auth_failures);
  EXPECT_EQ(m.l3_counters().at("lease_wait_timeouts"), s.l3.lease_wait_timeouts);
  EXPECT_EQ(m.item_errors().at("INVALID_ARGUMENT"), 11u);
  EXPECT_EQ(m.rpc_errors().at("UNAUTHENTICATED"), 14u);
  EXPECT_EQ(m.l3_errors().at("oom"), 20u);
}

TEST(StatsTablesTest, WithoutASharedTierNoL3CountersTravel) {
  ServerStats s = Filled();
  s.l3_enabled = false;
  s.l3 = SharedTierStats{};
  v1::StatsResponse m;
  internal::ToProto(s, &m);
  EXPECT_FALSE(m.l3_enabled());
  EXPECT_EQ(m.l3_counters_size(), 0);
  EXPECT_EQ(m.l3_errors_size(), 0);
  EXPECT_EQ(m.l3_node_errors_size(), 0);
  EXPECT_EQ(m.hits_l3(), s.worker.hits_l3);  // a WorkerStats row, sent either way
}

std::string Render(const ServerStats& s) {
  internal::ServerMetrics metrics([s] { return s; });
  return metrics.Render();
}

TEST(StatsTablesTest, EachRowWithASeriesShowsItsValueThereUnderItsFamilysTypeAndHelp) {
  const ServerStats s = Filled();
  const std::string page = Render(s);
  std::map<std::string, double> value;  // "family{label=\"v\"}" -> the row's value
  auto note = [&](const auto& table, const auto& part) {
    for (const auto& f : table) {
      if (f.metric.family.empty()) continue;
      std::string series(f.metric.family);
      if (!f.metric.label_name.empty()) {
        series += "{" + std::string(f.metric.label_name) + "=\"" + std::string(f.metric.label_value) + "\"}";
      }
      value[series] = StatValue(f, part);
    }
  };
  note(kWorkerStatsFields, s.worker);
  note(kServerStatsFields, s);
  note(kShmStatsFields, s.shm);
  note(kIpcStatsFields, s.ipc);
  note(kSharedTierStatsFields, s.l3);
  ASSERT_GT(value.size(), 60u);
  for (const auto& [series, v] : value) {
    // The number as the page prints it, read back (a seconds row is no integer).
    const std::size_t at = page.find("\n" + series + " ");
    ASSERT_NE(at, std::string::npos) << series << page;
    EXPECT_EQ(std::stod(page.substr(at + series.size() + 2)), v) << series;
  }
  for (const Row& r : AllRows()) {
    if (r.metric.family.empty()) continue;
    const std::string family(r.metric.family);
    const std::string type = r.kind == StatKind::kCounter ? "counter" : "gauge";
    EXPECT_NE(page.find(std::string("# TYPE ").append(family).append(" ").append(type).append("\n")), std::string::npos)
        << family;
    EXPECT_NE(page.find("# HELP " + family + " " + r.help + "\n"), std::string::npos) << family;
  }
  // A few by hand: the irregular names and the maps.
  EXPECT_NE(page.find("\nepd_queue_items " + std::to_string(s.worker.pending_items) + "\n"), std::string::npos);
  EXPECT_NE(page.find("\nepd_cache_capacity_bytes{tier=\"l2\"} " + std::to_string(s.l2_capacity_bytes) + "\n"),
            std::string::npos);
  EXPECT_NE(page.find("\nepd_l3_degraded 1\n"), std::string::npos);
  EXPECT_NE(page.find("\nepd_item_errors_total{code=\"INTERNAL\"} 12\n"), std::string::npos);
  EXPECT_NE(page.find("\nepd_l3_errors_total{kind=\"down\"} 20\n"), std::string::npos);
  EXPECT_NE(page.find("\nepd_l3_node_errors_total{node=\"10.0.0.1:7000/0\"} 21\n"), std::string::npos);
  // Without a tier, no L3 family at all.
  ServerStats no_l3 = s;
  no_l3.l3_enabled = false;
  EXPECT_EQ(Render(no_l3).find("epd_l3_"), std::string::npos);
}

TEST(StatsTablesTest, FamiliesAgreeOnKindUnitAndHelpAndAreNamedByKind) {
  std::map<std::string, const Row*> first;
  std::set<std::string> series;
  for (const Row& r : AllRows()) {
    if (r.metric.family.empty()) continue;
    const std::string family(r.metric.family);
    auto [it, added] = first.emplace(family, &r);
    if (!added) {
      EXPECT_EQ(it->second->kind, r.kind) << family;
      EXPECT_EQ(it->second->unit, r.unit) << family;
      EXPECT_EQ(it->second->help, r.help) << family;
      EXPECT_EQ(it->second->metric.label_name, r.metric.label_name) << family;
    }
    EXPECT_TRUE(series.insert(family + "|" + std::string(r.metric.label_value)).second) << family << " twice";
    const bool total = family.ends_with("_total");
    EXPECT_EQ(total, r.kind == StatKind::kCounter) << family << ": counters end in _total, gauges do not";
    if (r.unit == StatUnit::kBytes) {
      EXPECT_NE(family.find("_bytes"), std::string::npos) << family;
    }
  }
}

// `epd_name{label="a"|"b"}`, `epd_name{label}` or `epd_name` in backticks.
TEST(StatsTablesTest, EverySeriesTheDocsNameIsOnThePage) {
  const std::string page = Render(Filled());
  const std::regex span("`(epd_[a-z0-9_]+)(\\{([^`]*)\\})?`");
  int names = 0;
  for (const char* doc : {"docs/SERVER.md", "docs/L3.md"}) {
    std::ifstream in(std::string(EPD_SOURCE_DIR) + "/" + doc);
    ASSERT_TRUE(in) << doc;
    std::stringstream text;
    text << in.rdbuf();
    const std::string body = text.str();
    for (auto m = std::sregex_iterator(body.begin(), body.end(), span); m != std::sregex_iterator(); ++m) {
      const std::string name = (*m)[1];
      ++names;
      EXPECT_NE(page.find("# TYPE " + name + " "), std::string::npos) << doc << " names " << name;
      std::string labels = (*m)[3];
      if (labels.empty()) continue;
      labels = std::regex_replace(labels, std::regex("[\\\\\"]"), "");
      const std::size_t eq = labels.find('=');
      const std::string key = labels.substr(0, eq);
      if (eq == std::string::npos) {
        EXPECT_NE(page.find(std::string(name).append("{").append(key).append("=\"")), std::string::npos)
            << doc << " names " << (*m)[0];
        continue;
      }
      std::stringstream values(labels.substr(eq + 1));
      for (std::string v; std::getline(values, v, '|');) {
        const std::string series = std::string(name).append("{").append(key).append("=\"").append(v).append("\"}");
        EXPECT_NE(page.find(series), std::string::npos) << doc << ": " << (*m)[0];
      }
    }
  }
  EXPECT_GT(names, 40);
}

// Tenant rows past the label cap are summed into tenant="other"; each
// family has one series per (tenant label, tier). The pool's row ("") is
// "shared" and takes no label of the cap; a tenant the labels ranked first
// (the tokens file's) keeps its label wherever its row comes.
TEST(StatsTablesTest, TenantCacheFamiliesFoldPastTheLabelCap) {
  const std::vector<TenantCacheRow> rows = {{"", 1, 2, 0, 0, 0, 0},
                                            {"tenant:a", 10, 20, 1, 0, 4, 0},
                                            {"tenant:b", 100, 200, 2, 0, 8, 0},
                                            {"tenant:c", 1000, 2000, 3, 0, 16, 0},
                                            {"tenant:d", 10000, 20000, 4, 0, 32, 0}};
  internal::TenantLabels labels(2, {"tenant:c"});
  const std::vector<prometheus::MetricFamily> f = internal::TenantCacheFamilies(rows, labels);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].name, "epd_tenant_cache_bytes");
  std::map<std::string, double> bytes, refusals, evictions;
  for (const auto& m : f[0].metric) bytes[m.label[0].value + "/" + m.label[1].value] = m.gauge.value;
  for (const auto& m : f[1].metric) refusals[m.label[0].value + "/" + m.label[1].value] = m.counter.value;
  for (const auto& m : f[2].metric) evictions[m.label[0].value + "/" + m.label[1].value] = m.counter.value;
  EXPECT_EQ(bytes.size(), 8u);  // shared, tenant:c, tenant:a, other x l1, l2
  EXPECT_EQ(bytes["shared/l1"], 1);
  EXPECT_EQ(bytes["tenant:c/l2"], 2000);
  EXPECT_EQ(bytes["tenant:a/l2"], 20);
  EXPECT_EQ(bytes["other/l1"], 10100);  // b + d
  EXPECT_EQ(bytes["other/l2"], 20200);
  EXPECT_EQ(refusals["other/l1"], 6);
  EXPECT_EQ(evictions["other/l1"], 40);
  EXPECT_EQ(bytes.count("tenant:b/l1"), 0u);
  EXPECT_TRUE(internal::TenantCacheFamilies({}, labels).empty());
}

// One rule for both per-tenant views: the names ranked first, then the order
// of first sight; "other" itself and names past the cap fold; "" is the pool.
TEST(StatsTablesTest, TenantLabelsKeepTheFirstRankedNamesAndFoldTheRest) {
  internal::TenantLabels labels(3, {"zed", "amy"});
  EXPECT_EQ(labels.Of("bob"), "bob");  // rank 2 (amy 0, zed 1)
  EXPECT_EQ(labels.Of("cat"), "other");
  EXPECT_EQ(labels.Of("zed"), "zed");
  EXPECT_EQ(labels.Of("other"), "other");
  EXPECT_EQ(labels.Of(""), "shared");
  EXPECT_EQ(labels.Of("bob"), "bob");
  internal::TenantLabels one(0, {});  // < 1 is taken as 1
  EXPECT_EQ(one.Of("x"), "x");
  EXPECT_EQ(one.Of("y"), "other");
}

TEST(StatsTablesTest, ReplayReportsExactlyItsKeys) {
  // `epd-encode replay --json` (docs/REPLAY.md; bench/ and the install test read these).
  std::set<std::string> worker, l3;
  for (const Row& r : AllRows()) {
    if (r.report.empty()) continue;
    (r.table == "SharedTierStats" ? l3 : worker).insert(r.report);
    EXPECT_TRUE(r.table == "WorkerStats" || r.table == "SharedTierStats") << r.name;
  }
  EXPECT_EQ(worker, (std::set<std::string>{"hits_l1",
                                           "hits_l2",
                                           "hits_l3",
                                           "joins",
                                           "misses",
                                           "shape_mismatches",
                                           "cache_errors",
                                           "tower_batches",
                                           "tower_items",
                                           "tower_tokens",
                                           "tower_s",
                                           "l1_bytes",
                                           "l2_bytes",
                                           "l1_lru_victims",
                                           "l2_lru_victims",
                                           "demotions",
                                           "promotions",
                                           "video_items",
                                           "video_decodes",
                                           "chunk_hits",
                                           "chunk_misses",
                                           "chunk_joins",
                                           "hit_bytes_l1",
                                           "hit_bytes_l2",
                                           "hit_bytes_l3",
                                           "miss_bytes",
                                           "hit_seconds_l1",
                                           "hit_seconds_l2",
                                           "hit_seconds_l3",
                                           "miss_seconds",
                                           "encode_seconds_saved",
                                           "l1_write_bytes",
                                           "l2_write_bytes",
                                           "l1_admission_rejections",
                                           "adopt_rejections"}));
  EXPECT_EQ(l3, (std::set<std::string>{"hits", "misses", "corrupt", "writes", "write_drops", "lease_waits",
                                       "lease_takeovers", "degraded"}));
}

}  // namespace
}  // namespace epd
