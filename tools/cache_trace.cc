// Lines are parsed with nlohmann::json's SAX-free DOM parse, one line at a
// time, so a malformed line is reported with its number and nothing before
// it is kept.
#include "cache_trace.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "epd/core/embedding_cache.h"

namespace epd::cli {

std::uint64_t KeyHash(std::string_view key) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a 64 offset basis
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
  h += 0x9e3779b97f4a7c15ULL;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

namespace {

std::string_view NextLine(std::string_view text, std::size_t& at) {
  const std::size_t end = text.find('\n', at);
  const std::size_t stop = end == std::string_view::npos ? text.size() : end;
  std::string_view line = text.substr(at, stop - at);
  at = stop + 1;
  return line;
}

bool Blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

}  // namespace

bool LooksLikeReplayTrace(std::string_view text) {
  std::size_t at = 0;
  while (at < text.size()) {
    std::string_view line = NextLine(text, at);
    if (Blank(line)) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    return j.is_object() && (j.contains("images") || j.contains("videos"));
  }
  return false;
}

StatusOr<std::vector<CacheAccess>> ParseCacheTrace(std::string_view text, const std::string& name,
                                                   const CacheTraceOptions& options) {
  std::vector<CacheAccess> out;
  std::size_t at = 0;
  for (std::size_t n = 1; at < text.size(); ++n) {
    if (options.progress && (n & 0xffff) == 0) options.progress(at, text.size());
    std::string_view line = NextLine(text, at);
    if (Blank(line)) continue;
    auto error = [&](const std::string& what) { return InvalidArgument(name + ":" + std::to_string(n) + ": " + what); };
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return error("not valid JSON");
    if (!j.is_object()) return error("expected a JSON object");
    if (j.contains("images") || j.contains("videos")) {
      return error("a replay trace line (images/videos), not a cache trace: give --images DIR and --model DIR");
    }
    auto key = j.find("key");
    if (key == j.end() || !key->is_string() || key->get_ref<const std::string&>().empty()) {
      return error("key must be a non-empty string");
    }
    auto bytes = j.find("bytes");
    if (bytes == j.end() || !(bytes->is_number_unsigned() || (bytes->is_number_integer() && *bytes >= 0)) ||
        bytes->get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxCacheBytes)) {
      return error("bytes must be an integer, 0 <= bytes <= 2^62 - 1");
    }
    CacheAccess a{KeyHash(key->get_ref<const std::string&>()), bytes->get<std::int64_t>(), 0};
    auto cost = j.find("cost_s");
    if (cost == j.end()) {
      a.seconds = static_cast<double>(a.bytes) * options.default_seconds_per_byte;
    } else {
      if (!cost->is_number() || !(cost->get<double>() >= 0) || !std::isfinite(cost->get<double>())) {
        return error("cost_s must be a finite number >= 0");
      }
      a.seconds = cost->get<double>();
    }
    auto t = j.find("t_ms");
    if (t != j.end() && (!t->is_number() || !(t->get<double>() >= 0))) return error("t_ms must be a number >= 0");
    auto tenant = j.find("tenant");
    if (tenant != j.end() && !tenant->is_string()) return error("tenant must be a string");
    out.push_back(a);
  }
  return out;
}

StatusOr<std::vector<CacheAccess>> ReadCacheTrace(const std::string& path, const CacheTraceOptions& options) {
  StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return InvalidArgument("cannot open trace " + path);
  return ParseCacheTrace(*text, path, options);
}

}  // namespace epd::cli
