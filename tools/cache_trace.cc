// Lines are parsed one at a time, so a malformed line is reported with its
// number. A flat object of plain strings and numbers (what bench/traces.py
// and plan's users write) takes a scanner of its own, ~10x faster than a DOM
// parse, which a 10^7-line trace needs to stay within plan's time budget;
// any line it does not recognise in full (escapes, nesting, literals, a bad
// number, a missing field) goes to nlohmann::json, which decides and words
// the error, so both paths accept and reject the same lines.
#include "cache_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

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

// Whether `s` is a number by JSON's grammar (RFC 8259, section 6):
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?. from_chars alone also takes
// "007", ".5", "5." and "inf", which JSON does not.
bool JsonNumber(std::string_view s) {
  std::size_t i = 0;
  auto digits = [&] {
    const std::size_t from = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i - from;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (digits() == 0) {
    return false;
  }
  if (i < s.size() && s[i] == '.' && (++i, digits() == 0)) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

// The fast path's cursor over one line, and what it has read of the object.
struct FlatScan {
  explicit FlatScan(std::string_view l) : line(l) {}

  std::string_view line;
  std::size_t i = 0;
  std::optional<std::string_view> key;
  std::optional<std::int64_t> bytes;
  std::optional<double> cost;

  bool At(char c) const { return i < line.size() && line[i] == c; }
  void SkipSpace() {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
  }
  // A string of printable ASCII without escapes, or nullopt.
  std::optional<std::string_view> String() {
    if (!At('"')) return std::nullopt;
    const std::size_t end = line.find_first_of("\"\\", i + 1);
    if (end == std::string_view::npos || line[end] != '"') return std::nullopt;
    std::string_view out = line.substr(i + 1, end - i - 1);
    for (char c : out) {
      if (c < 0x20 || c > 0x7e) return std::nullopt;  // a control character, or not ASCII (char may be signed)
    }
    i = end + 1;
    return out;
  }
};

// The number value of field `name` at the cursor: bytes (an integer up to
// kMaxCacheBytes), cost_s or t_ms, each finite and >= 0. False for anything
// else, which the DOM parse then decides.
bool ScanFlatNumber(FlatScan& sc, std::string_view name) {
  const std::size_t end = sc.line.find_first_of(",} \t\r", sc.i);
  const std::string_view num =
      sc.line.substr(sc.i, end == std::string_view::npos ? std::string_view::npos : end - sc.i);
  if (!JsonNumber(num)) return false;
  double d;
  auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), d);
  if (ec != std::errc() || ptr != num.data() + num.size() || !std::isfinite(d) || d < 0) return false;
  if (name == "bytes") {
    std::int64_t n;
    auto [p2, e2] = std::from_chars(num.data(), num.data() + num.size(), n);
    if (e2 != std::errc() || p2 != num.data() + num.size() || n > kMaxCacheBytes) return false;
    sc.bytes = n;
  } else if (name == "cost_s") {
    sc.cost = d;
  } else if (name != "t_ms") {
    return false;
  }
  sc.i += num.size();
  return true;
}

// One `"name": value` member at the cursor: key and tenant take strings,
// the rest numbers (ScanFlatNumber).
bool ScanFlatMember(FlatScan& sc) {
  auto name = sc.String();
  sc.SkipSpace();
  if (!name || !sc.At(':')) return false;
  ++sc.i;
  sc.SkipSpace();
  if (!sc.At('"')) return ScanFlatNumber(sc, *name);
  auto v = sc.String();
  if (!v) return false;
  if (*name == "key") {
    sc.key = v;
  } else if (*name != "tenant") {
    return false;
  }
  return true;
}

// The fast path (see the top of the file): the access, or nullopt to let
// the DOM parse decide. Strings must be printable ASCII without escapes
// (anything else, UTF-8 included, goes to the DOM parse, which validates it).
std::optional<CacheAccess> ScanFlatLine(std::string_view line, double default_seconds_per_byte) {
  FlatScan sc(line);
  sc.SkipSpace();
  if (!sc.At('{')) return std::nullopt;
  ++sc.i;
  for (bool first = true;; first = false) {
    sc.SkipSpace();
    if (first && sc.At('}')) return std::nullopt;  // empty object: let the DOM say why
    if (!ScanFlatMember(sc)) return std::nullopt;
    sc.SkipSpace();
    if (sc.At(',')) {
      ++sc.i;
      continue;
    }
    if (sc.At('}')) break;
    return std::nullopt;
  }
  ++sc.i;
  sc.SkipSpace();
  if (sc.i != line.size() || !sc.key || sc.key->empty() || !sc.bytes) return std::nullopt;
  return CacheAccess{KeyHash(*sc.key), *sc.bytes,
                     sc.cost ? *sc.cost : static_cast<double>(*sc.bytes) * default_seconds_per_byte};
}

// The JSON parser's own account of why `line` is not JSON (the parse runs
// again, with exceptions, on this error path only), without its exception
// id and the parser's own line number: "parse error at column 9: ..." or "number overflow parsing '1e400'".
std::string JsonError(std::string_view line) {
  try {
    [[maybe_unused]] const nlohmann::json parsed = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    std::string_view what = e.what();
    if (what.starts_with("[json.exception.")) what.remove_prefix(std::min(what.find("] ") + 2, what.size()));
    // The parser saw one line: its "line 1, " would read as the file's line.
    std::string text(what);
    if (const std::size_t at = text.find("at line 1, column "); at != std::string::npos) text.erase(at + 3, 8);
    // It quotes the bytes it last read: printable ASCII stays, the rest is escaped.
    std::string out;
    for (const char c : text) {
      const auto b = static_cast<unsigned char>(c);
      out += b >= 0x20 && b < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", b);
    }
    return out;
  }
  return "unknown reason";
}

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

namespace {

// A line the fast path left to the DOM parse: its access; or nothing and no
// error, for a replay manifest's failed item (an error message and no bytes:
// nothing was cached); or why it is rejected.
struct DomLine {
  std::optional<CacheAccess> access;
  std::string error;
};

DomLine ParseDomLine(std::string_view line, const CacheTraceOptions& options) {
  // One at the start of the file is gone (ParseCacheTrace); the JSON parser
  // would skip one wherever it is given a line.
  if (line.starts_with("\xEF\xBB\xBF")) return {std::nullopt, "a UTF-8 byte-order mark inside the file"};
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return {std::nullopt, "not valid JSON: " + JsonError(line)};
  if (!j.is_object()) return {std::nullopt, "expected a JSON object"};
  if (auto e = j.find("error");
      e != j.end() && e->is_string() && !e->get_ref<const std::string&>().empty() && !j.contains("bytes")) {
    return {};
  }
  if (j.contains("images") || j.contains("videos")) {
    return {std::nullopt, "a replay trace line (images/videos), not a cache trace: give --images DIR and --model DIR"};
  }
  auto key = j.find("key");
  if (key == j.end() || !key->is_string() || key->get_ref<const std::string&>().empty()) {
    return {std::nullopt, "key must be a non-empty string"};
  }
  auto bytes = j.find("bytes");
  if (bytes == j.end() || !(bytes->is_number_unsigned() || (bytes->is_number_integer() && *bytes >= 0)) ||
      bytes->get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxCacheBytes)) {
    return {std::nullopt, "bytes must be an integer, 0 <= bytes <= 2^62 - 1"};
  }
  CacheAccess a{KeyHash(key->get_ref<const std::string&>()), bytes->get<std::int64_t>(), 0};
  auto cost = j.find("cost_s");
  if (cost == j.end()) {
    a.seconds = static_cast<double>(a.bytes) * options.default_seconds_per_byte;
  } else if (!cost->is_number() || !(cost->get<double>() >= 0) || !std::isfinite(cost->get<double>())) {
    return {std::nullopt, "cost_s must be a finite number >= 0"};
  } else {
    a.seconds = cost->get<double>();
  }
  auto t = j.find("t_ms");
  if (t != j.end() && (!t->is_number() || !(t->get<double>() >= 0)))
    return {std::nullopt, "t_ms must be a number >= 0"};
  auto tenant = j.find("tenant");
  if (tenant != j.end() && !tenant->is_string()) return {std::nullopt, "tenant must be a string"};
  return {a, ""};
}

}  // namespace

StatusOr<std::vector<CacheAccess>> ParseCacheTrace(std::string_view text, const std::string& name,
                                                   const CacheTraceOptions& options) {
  // A byte-order mark may start the file (and only the file): dropped here.
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
  std::vector<CacheAccess> out;
  out.reserve(text.size() / 64);
  std::size_t at = 0;
  double seconds = 0;  // the running total, which must stay finite
  const char* const kOverflow =
      "the encode seconds so far sum past the largest double (cost_s, or bytes x --seconds-per-byte, too large)";
  for (std::size_t n = 1; at < text.size(); ++n) {
    if (options.progress && (n & 0xffff) == 0) options.progress(at, text.size());
    std::string_view line = NextLine(text, at);
    if (Blank(line)) continue;
    // NOLINTNEXTLINE(performance-inefficient-string-concatenation): built once, for the error returned
    auto error = [&](const std::string& what) { return InvalidArgument(name + ":" + std::to_string(n) + ": " + what); };
    // The JSON parser reads a NUL as the end of its input and would drop the rest of the line.
    if (line.find('\0') != std::string_view::npos) return error("a NUL byte, which JSON text never holds");
    std::optional<CacheAccess> access = ScanFlatLine(line, options.default_seconds_per_byte);
    if (!access) {
      DomLine dom = ParseDomLine(line, options);
      if (!dom.error.empty()) return error(dom.error);
      if (!dom.access) {
        if (options.skipped != nullptr) ++*options.skipped;
        continue;
      }
      access = dom.access;
    }
    if (!std::isfinite(seconds += access->seconds)) return error(kOverflow);
    out.push_back(*access);
  }
  return out;
}

StatusOr<std::vector<CacheAccess>> ReadCacheTrace(const std::string& path, const CacheTraceOptions& options) {
  // A regular file only: /dev/zero or a FIFO would be read without end.
  StatusOr<std::string> text = ReadRegularFile(path);
  if (!text.ok()) return InvalidArgument("trace: " + text.status().message());
  return ParseCacheTrace(*text, path, options);
}

}  // namespace epd::cli
