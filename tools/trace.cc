#include "trace.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cli_util.h"

namespace epd::cli {
namespace {

using nlohmann::json;

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

StatusOr<std::vector<TraceRequest>> ParseTrace(const std::string& text, const std::string& name) {
  std::vector<TraceRequest> out;
  std::set<std::string> ids;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // NOLINTNEXTLINE(performance-inefficient-string-concatenation): built once, for the error returned
    auto error = [&](const std::string& what) { return InvalidArgument(name + ":" + std::to_string(n) + ": " + what); };
    // The JSON parser reads a NUL as the end of its input and would drop the rest of the line.
    if (line.find('\0') != std::string::npos) return error("a NUL byte, which JSON text never holds");
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return error("not valid JSON");
    if (!j.is_object()) return error("expected a JSON object");
    TraceRequest r;
    if (j.contains("id")) {
      if (!j["id"].is_string() || j["id"].get<std::string>().empty()) return error("id must be a non-empty string");
      r.id = j["id"].get<std::string>();
    } else {
      r.id = "line-" + std::to_string(n);
    }
    if (!ids.insert(r.id).second) return error("duplicate request id '" + r.id + "'");
    if (j.contains("arrival_ms")) {
      if (!j["arrival_ms"].is_number() || !(j["arrival_ms"].get<double>() >= 0)) {
        return error("arrival_ms must be a number >= 0");
      }
      r.arrival_ms = j["arrival_ms"].get<double>();
      if (!(r.arrival_ms < kMaxArrivalMs)) {
        return error("arrival_ms " + j["arrival_ms"].dump() + " is not below " + std::to_string(kMaxArrivalMs) +
                     " (about 285 years): --realtime waits for it in int64 nanoseconds, which it would overflow");
      }
    }
    const char* const kImagesRule = "images must be a non-empty array of strings";
    for (const char* field : {"images", "videos"}) {
      if (!j.contains(field)) continue;
      const bool images = std::string(field) == "images";
      const std::string what = images ? kImagesRule : "videos must be an array of non-empty strings";
      if (!j[field].is_array()) return error(what);
      for (const json& p : j[field]) {
        if (!p.is_string() || p.get<std::string>().empty()) return error(what);
        (images ? r.images : r.videos).push_back(p.get<std::string>());
      }
    }
    // A line without videos needs images (the rule before videos existed).
    if (r.images.empty() && r.videos.empty()) return error(kImagesRule);
    out.push_back(std::move(r));
  }
  return out;
}

StatusOr<std::vector<TraceRequest>> ReadTrace(const std::string& path, std::int64_t max_bytes) {
  StatusOr<std::string> text = ReadRegularFile(path, max_bytes);
  if (!text.ok()) return InvalidArgument("cannot read trace " + path + ": " + std::string(text.status().message()));
  return ParseTrace(*text, path);
}

std::string TraceToJsonLines(const std::vector<TraceRequest>& trace) {
  std::string out;
  for (const TraceRequest& r : trace) {
    json j = {{"id", r.id}, {"arrival_ms", r.arrival_ms}, {"images", r.images}};
    if (!r.videos.empty()) j["videos"] = r.videos;
    out += j.dump();
    out += '\n';
  }
  return out;
}

StatusOr<std::vector<std::string>> ListImages(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return InvalidArgument(dir + " is not a directory");
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = Lower(e.path().extension().string());
    if (ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".webp" || ext == ".gif" || ext == ".bmp") {
      found.push_back(e.path().filename().string());
    }
  }
  if (ec) return InvalidArgument("cannot list " + dir + ": " + ec.message());
  if (found.empty()) return InvalidArgument(dir + " holds no .jpg, .jpeg, .png, .webp, .gif or .bmp file");
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<TraceRequest> GenerateTrace(const std::vector<std::string>& images, const GeneratorOptions& o) {
  assert(!images.empty() && o.requests >= 0 && o.zipf_s >= 0 && o.rate_per_s > 0);
  assert(1 <= o.min_images && o.min_images <= o.max_images);
  // Cumulative Zipf weights over ranks 1..M.
  std::vector<double> cdf(images.size());
  double total = 0;
  for (std::size_t r = 0; r < images.size(); ++r) {
    total += 1.0 / std::pow(static_cast<double>(r + 1), o.zipf_s);
    cdf[r] = total;
  }
  SplitMix64 rng(o.seed);
  const std::uint64_t span = static_cast<std::uint64_t>(o.max_images - o.min_images) + 1;
  std::vector<TraceRequest> out;
  out.reserve(static_cast<std::size_t>(o.requests));
  for (std::int64_t i = 0; i < o.requests; ++i) {
    TraceRequest r;
    char id[32];
    std::snprintf(id, sizeof(id), "gen-%06lld", static_cast<long long>(i) + 1);
    r.id = id;
    r.arrival_ms = static_cast<double>(i) * 1000.0 / o.rate_per_s;
    const int k = o.min_images + static_cast<int>(rng.Next() % span);
    for (int j = 0; j < k; ++j) {
      const double u = rng.Unit() * total;
      std::size_t rank = static_cast<std::size_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      rank = std::min(rank, images.size() - 1);  // u == total cannot happen, but stay in range
      r.images.push_back(images[rank]);
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace epd::cli
