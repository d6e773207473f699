// The manifest is written from the RequestResults the replay already holds:
// no second pass over the cache, and the same key a result carries is the
// tensor name the safetensors writer used (both come from ContentKey::Hex).
// One pass over the results first collects each key's measured cost.
#include "replay_manifest.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

namespace epd::cli {
namespace {

constexpr std::string_view kSafetensorsExt = ".safetensors";

bool IsZero(const ContentKey& k) {
  for (std::uint8_t b : k.bytes) {
    if (b != 0) return false;
  }
  return true;
}

}  // namespace

std::unordered_map<ContentKey, double, ContentKeyHash> MeasuredCosts(std::span<const RequestResult> results) {
  std::unordered_map<ContentKey, double, ContentKeyHash> cost;
  for (const RequestResult& res : results) {
    for (const ItemResult& item : res.items) {
      if (item.status.ok() && std::isfinite(item.encode_seconds) && item.encode_seconds >= 0) {
        cost.try_emplace(item.key, item.encode_seconds);
      }
    }
  }
  return cost;
}

std::string ReplayManifestJsonLines(std::span<const TraceRequest> trace, std::span<const RequestResult> results,
                                    const std::string& out_file) {
  // Each key's measured cost: a hit or a join of the same image carries it
  // too, wherever it sits in the trace.
  const std::unordered_map<ContentKey, double, ContentKeyHash> cost = MeasuredCosts(results);
  std::string text;
  for (std::size_t r = 0; r < trace.size() && r < results.size(); ++r) {
    const TraceRequest& req = trace[r];
    const RequestResult& res = results[r];
    const std::vector<std::string> paths = req.paths();
    for (std::size_t i = 0; i < paths.size(); ++i) {
      // ordered_json keeps the documented field order.
      nlohmann::ordered_json line = {{"request", req.id}, {"item", i}, {"media", paths[i]}};
      const ItemResult* item = i < res.items.size() ? &res.items[i] : nullptr;
      if (item != nullptr && item->status.ok() && item->embedding != nullptr) {
        const Embedding& e = *item->embedding;
        line["key"] = item->key.Hex();
        if (e.grid.known()) line["grid_thw"] = {e.grid.t, e.grid.h, e.grid.w};
        line["tokens"] = e.tokens;
        line["bytes"] = e.nbytes();
        if (auto c = cost.find(item->key); c != cost.end()) line["cost_s"] = c->second;
        line["source"] = std::string(ItemSourceName(item->source));
        line["file"] = out_file;
      } else {
        if (item != nullptr && !IsZero(item->key)) line["key"] = item->key.Hex();
        // A request that did not complete leaves its items' slots unfilled:
        // its own status says why.
        const Status& why = item != nullptr && !item->status.ok() ? item->status : res.status;
        line["error"] = why.ok() ? std::string("UNKNOWN: no result") : why.ToString();
      }
      text += line.dump();
      text += '\n';
    }
  }
  return text;
}

std::string ManifestPathFor(const std::string& out_file) {
  std::string_view stem = out_file;
  if (stem.size() > kSafetensorsExt.size() && stem.ends_with(kSafetensorsExt)) {
    stem.remove_suffix(kSafetensorsExt.size());
  }
  return std::string(stem) + ".manifest.jsonl";
}

Status WriteReplayManifest(const std::string& path, std::span<const TraceRequest> trace,
                           std::span<const RequestResult> results, const std::string& out_file) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return Status(StatusCode::kUnavailable, "cannot open " + path + " for writing");
  f << ReplayManifestJsonLines(trace, results, out_file);
  f.close();
  if (!f) return Status(StatusCode::kUnavailable, "cannot write " + path);
  return Status::Ok();
}

}  // namespace epd::cli
