// epd/core/stat_fields.h: the shape of a stats struct's field table. Each
// stats struct (WorkerStats in epd/core/encode_types.h, SharedTierStats in
// epd/core/shared_tier.h, ServerStats, ShmStats and IpcStats in
// epd/rpc/server_stats.h) has one table beside it, listing each of its
// numeric fields once: its member, what kind of number it is, and the exact
// name it has in each place it leaves the process. The Stats RPC's
// conversion (src/server/proto_convert.cc), the Prometheus page
// (src/server/stats_series.cc) and `epd-encode replay --json`
// (tools/replay_command.cc) all walk the tables, so a new field is one row
// (plus its line in proto/epd/v1/encoder.proto, which stats_tables_test checks
// against the tables both ways).
//
// Names are carried exactly, not derived, because several are irregular
// (WorkerStats::pending_items is the metric epd_queue_items and the proto
// field pending_items; ShmStats::items is the proto field shm_items).
// Fields that are no number (a map by status code, a string) are not in the
// tables; the conversions handle them by hand.
//
// Thread safety: the tables are constexpr data; VisitStat is a pure function.
//
// Example:
//   for (const epd::StatField<epd::WorkerStats>& f : epd::kWorkerStatsFields) {
//     std::printf("%s = %g\n", std::string(f.name).c_str(), epd::StatValue(f, stats));
//   }
#pragma once

#include <cstdint>
#include <string_view>
#include <variant>

namespace epd {

// Prometheus' two kinds: a counter only grows (since start), a gauge is a
// level now.
enum class StatKind : std::uint8_t { kCounter, kGauge };

// What one unit of the number is.
enum class StatUnit : std::uint8_t {
  kCount,    // events, items, requests, entries
  kBytes,    // bytes
  kTokens,   // post-merge tokens
  kSeconds,  // seconds of wall time
  kFlag,     // a bool: 1 (true) or 0
};

// Where a field travels in StatsResponse (proto/epd/v1/encoder.proto): the
// message field `field`, or, when `key` is set, the entry `key` of the
// map<string, uint64> field `field`. Empty `field`: not on the wire.
struct StatProto {
  std::string_view field;
  std::string_view key = {};
};

// Where a field appears on /metrics: one series of the family `family`, with
// the label `label_name`="`label_value`" when the family is split by one (the
// fields of one family share its kind, unit and help). Empty `family`: not
// exported.
struct StatMetric {
  std::string_view family;
  std::string_view label_name = {};
  std::string_view label_value = {};
};

// A pointer to one numeric member of S.
template <typename S>
using StatMember = std::variant<std::uint64_t S::*, std::int64_t S::*, double S::*, bool S::*>;

template <typename S>
struct StatField {
  std::string_view name;  // the member's name in S
  StatMember<S> member;
  StatKind kind;
  StatUnit unit;
  std::string_view help;    // one line; on /metrics, the family's HELP
  StatProto proto;          // StatsResponse field (or map entry)
  StatMetric metric;        // Prometheus series
  std::string_view report;  // key in `epd-encode replay --json`; empty: not reported
};

// Calls f with a reference to the field's member of `s`, typed as declared
// (std::uint64_t&, std::int64_t&, double& or bool&; const when `s` is).
template <typename S, typename T, typename F>
decltype(auto) VisitStat(const StatField<S>& field, T& s, F&& f) {
  return std::visit([&](auto member) -> decltype(auto) { return f(s.*member); }, field.member);
}

// The field's value in `s` as a double (a flag is 0 or 1). Exact up to 2^53.
template <typename S>
double StatValue(const StatField<S>& field, const S& s) {
  return VisitStat(field, s, [](const auto& v) { return static_cast<double>(v); });
}

}  // namespace epd
