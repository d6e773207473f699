// src/plan/plan_report.cc: plan's report, as text tables and as JSON (the
// declarations and the fields: plan.h; what each column means: docs/PLAN.md,
// "What it prints").
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "epd/plan/plan.h"

namespace epd::plan {
namespace {

nlohmann::json WeightsJson(const Weights& w) {
  return {{"objects", w.objects}, {"bytes", w.bytes}, {"seconds", w.seconds}};
}

}  // namespace

// Decimal units, three significant figures or so.
std::string Gb(double bytes) {
  if (bytes < 0) return "-";
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (u < 5 && bytes >= 1000) {
    bytes /= 1000;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

namespace {

// The trace's figures, the sampler's and the warnings.
std::string SummaryText(const PlanResult& r) {
  std::string o;
  o += fmt::format("plan: {} requests, {} distinct keys, working set {}, largest entry {:.1f} MB, encode {:.1f} s\n",
                   r.requests, r.distinct_keys, Gb(r.working_set_bytes), r.largest_entry / 1e6, r.total_seconds);
  o += fmt::format("  infinite cache hit ratio: {:.3f} of objects, {:.3f} of bytes, {:.3f} of encode seconds\n",
                   r.max_hit_ratio.objects, r.max_hit_ratio.bytes, r.max_hit_ratio.seconds);
  if (!r.exact) {
    o += fmt::format("  sampler: tail rate {:.3g}%, {} head keys, {:.1f}% of accesses tracked, {:.1f} MB\n",
                     100 * r.shards_rate, r.shards_head, 100 * r.sampled_fraction,
                     static_cast<double>(r.sampler_bytes) / 1e6);
  }
  for (const std::string& w : r.warnings) o += "  warning: " + w + "\n";
  return o;
}

// The curves side by side: about a dozen of their capacities, and the last.
std::string CurvesText(const PlanResult& r) {
  std::string o = "\nmiss ratio curves (miss ratio by objects / bytes / encode seconds):\n";
  o += fmt::format("  {:>12}", "capacity");
  for (const MissRatioCurve& c : r.curves) o += fmt::format("  {:>28}", c.label.substr(0, 28));
  o += "\n";
  const std::size_t n = r.curves.empty() ? 0 : r.curves[0].points.size();
  const std::size_t step = std::max<std::size_t>(1, n / 12);
  std::vector<std::size_t> rows;  // every step-th point, and the last
  for (std::size_t i = 0; i < n; i = (i + step < n || i + 1 == n) ? i + step : n - 1) rows.push_back(i);
  auto label = [&r](std::size_t i) { return Gb(r.curves[0].points[i].capacity_bytes); };
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const std::size_t i = rows[k];
    // A tiny working set's capacities round alike: the last of each run is shown.
    if (k + 1 < rows.size() && label(rows[k + 1]) == label(i)) continue;
    o += fmt::format("  {:>12}", label(i));
    for (const MissRatioCurve& c : r.curves) {
      const Weights& m = c.points[i].miss_ratio;
      o += fmt::format("  {:>28}", fmt::format("{:.3f} / {:.3f} / {:.3f}", m.objects, m.bytes, m.seconds));
    }
    o += "\n";
  }
  return o;
}

// One sizing row: its sizes, predicted and replayed hit ratios.
std::string SizingRowText(const SizingRow& row, bool replayed) {
  const std::string what = fmt::format("{:.0f}% of max ({:.3f})", 100 * row.target, row.hit_ratio);
  if (row.total_bytes < 0) return fmt::format("  {:>22} unreachable on the curve\n", what);
  const TierHits& h = row.replayed;
  const double l1 = h.Ratio(h.l1, Weighting::kSeconds), l2 = h.Ratio(h.l2, Weighting::kSeconds);
  const double l3 = h.Ratio(h.l3, Weighting::kSeconds);
  std::string o =
      fmt::format("  {:>22} {:>10} {:>10} {:>10} {:>10}   {:>22}   {:>22}\n", what, Gb(row.total_bytes),
                  Gb(row.l1_bytes), Gb(row.l2_bytes), Gb(row.l3_bytes),
                  fmt::format("{:.3f}/{:.3f}/{:.3f}", row.predicted_l1, row.predicted_l12, row.predicted_all),
                  replayed ? fmt::format("{:.3f}/{:.3f}/{:.3f}", l1, l1 + l2, l1 + l2 + l3) : "");
  if (!row.reached) {
    o += fmt::format(
        "  {:>22} (short: no total up to {} gave it in the miniature; the tiers' limits or the "
        "admission filter cap it)\n",
        "", Gb(row.total_bytes));
  }
  return o;
}

std::string SizingText(const PlanResult& r) {
  std::string o = fmt::format(
      "\nsizing ({}; the total off its curve, moved where a miniature of the tiers misses the target; the hit "
      "ratios predicted by that miniature; by encode seconds; L3 is Redis under allkeys-lru, written through with "
      "every tower result, so it holds copies of what L1 and L2 hold, and its column is the maxmemory to set: "
      "what Redis charges for the values, the entries' bytes times the overhead factor measured in docs/PLAN.md):\n",
      r.policy);
  o += fmt::format("  {:>22} {:>10} {:>10} {:>10} {:>10}   {:>22}   {:>22}\n", "encode seconds saved", "total", "L1",
                   "L2", "L3", "predicted L1/L1+2/all", r.replayed ? "replayed L1/L1+2/all" : "");
  for (const SizingRow& row : r.rows) o += SizingRowText(row, r.replayed);
  if (!r.replayed) o += "  (not replayed: --replay on checks the prediction against the real tiers)\n";
  if (r.max_hit_ratio.seconds <= 0) o += "  (nothing to save: no key repeats, or every repeat costs 0 s)\n";
  return o;
}

// The worker flags per row, and the sizes on one line.
std::string FlagsText(const PlanResult& r) {
  auto join = [&r](const char* sep, auto&& item) {
    std::string s;
    for (const SizingRow& row : r.rows) {
      if (!s.empty()) s += sep;
      s += item(row);
    }
    return s;
  };
  std::string o = "  worker flags for each row's L1 and L2 (MiB; L3 is Redis's maxmemory, docs/L3.md):\n";
  for (const SizingRow& row : r.rows) {
    if (!row.serve_args.empty())
      o += fmt::format("  {:>22} {}\n", fmt::format("{:.0f}%", 100 * row.target), row.serve_args);
  }
  o += fmt::format("  for {} % of encode seconds saved: L1 {}, L2 {}, L3 {}\n",
                   join("/", [](const SizingRow& x) { return fmt::format("{:.0f}", 100 * x.target); }),
                   join(" / ", [](const SizingRow& x) { return Gb(x.total_bytes < 0 ? -1 : x.l1_bytes); }),
                   join(" / ", [](const SizingRow& x) { return Gb(x.total_bytes < 0 ? -1 : x.l2_bytes); }),
                   join(" / ", [](const SizingRow& x) { return Gb(x.total_bytes < 0 ? -1 : x.l3_bytes); }));
  return o;
}

}  // namespace

std::string PlanText(const PlanResult& r) { return SummaryText(r) + CurvesText(r) + SizingText(r) + FlagsText(r); }

std::string PlanJson(const PlanResult& r) {
  nlohmann::json j = {{"requests", r.requests},
                      {"distinct_keys", r.distinct_keys},
                      {"working_set_bytes", r.working_set_bytes},
                      {"working_set_redis_bytes", r.working_set_redis_bytes},
                      {"largest_entry_bytes", r.largest_entry},
                      {"encode_seconds", r.total_seconds},
                      {"max_hit_ratio", WeightsJson(r.max_hit_ratio)},
                      {"exact", r.exact},
                      {"policy", r.policy},
                      {"replayed", r.replayed},
                      {"curves_s", r.curves_s},
                      {"replay_s", r.replay_s}};
  if (!r.exact) {
    j["sampler"] = {{"tail_rate", r.shards_rate},
                    {"sampled_keys", r.shards_sampled_keys},
                    {"head_keys", r.shards_head},
                    {"tracked_fraction", r.sampled_fraction},
                    {"memory_bytes", r.sampler_bytes}};
  }
  j["warnings"] = r.warnings;
  for (const MissRatioCurve& c : r.curves) {
    nlohmann::json pts = nlohmann::json::array();
    for (const CurvePoint& p : c.points) {
      pts.push_back({{"capacity_bytes", p.capacity_bytes}, {"miss_ratio", WeightsJson(p.miss_ratio)}});
    }
    j["curves"].push_back({{"label", c.label}, {"points", pts}});
  }
  for (const SizingRow& row : r.rows) {
    nlohmann::json x = {{"target", row.target}, {"hit_ratio", row.hit_ratio}, {"reachable", row.total_bytes >= 0}};
    if (row.total_bytes >= 0) {
      x["bytes"] = {{"total", row.total_bytes}, {"l1", row.l1_bytes}, {"l2", row.l2_bytes}, {"l3", row.l3_bytes}};
      x["predicted_seconds_hit_ratio"] = {
          {"l1", row.predicted_l1}, {"l1_l2", row.predicted_l12}, {"all", row.predicted_all}};
      x["curve_seconds_hit_ratio"] = row.curve_all;
      x["tiers_minisim_rate"] = row.tiers_rate;
      x["tiers_miniatures"] = row.miniatures;
      x["reached"] = row.reached;
      x["serve_args"] = row.serve_args;
    }
    if (row.total_bytes >= 0 && r.replayed) {
      const TierHits& h = row.replayed;
      const double l1 = h.Ratio(h.l1, Weighting::kSeconds), l2 = h.Ratio(h.l2, Weighting::kSeconds);
      x["replayed_seconds_hit_ratio"] = {
          {"l1", l1}, {"l1_l2", l1 + l2}, {"all", l1 + l2 + h.Ratio(h.l3, Weighting::kSeconds)}};
      x["replayed"] = {{"l1", WeightsJson(h.l1)},
                       {"l2", WeightsJson(h.l2)},
                       {"l3", WeightsJson(h.l3)},
                       {"miss", WeightsJson(h.miss)},
                       {"l1_write_bytes", h.l1_write_bytes}};
    }
    j["sizing"].push_back(x);
  }
  return j.dump() + "\n";
}

}  // namespace epd::plan
