#include "flag_checks.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

namespace epd::cli {
namespace {

// %g without trailing noise: 0.001, 2047, 1e+06.
std::string Show(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string Got(const std::string& s) { return ", got '" + s + "'"; }

// The whole of `s` as a finite number; nullopt for anything else (empty,
// trailing text, inf, nan, out of double's range).
std::optional<double> ParseFinite(const std::string& s) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v) || errno == ERANGE) return std::nullopt;
  return v;
}

}  // namespace

CLI::Validator Number(double lo, double hi, const std::string& unit, bool lo_open) {
  std::string range;
  if (std::isinf(hi)) {
    range = std::string(lo_open ? "> " : ">= ") + Show(lo);
  } else {
    range = (lo_open ? "above " + Show(lo) + " and up to " : "from " + Show(lo) + " to ") + Show(hi);
  }
  const std::string expected = "expected a number " + range + (unit.empty() ? "" : " (" + unit + ")");
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        const std::optional<double> v = ParseFinite(s);
        if (!v || *v < lo || (lo_open && *v == lo) || *v > hi) return expected + Got(s);
        return "";
      },
      range + (unit.empty() ? "" : " " + unit));
}

CLI::Validator ZeroOrNumber(double lo, double hi, const std::string& unit) {
  const std::string range = "0 or a number from " + Show(lo) + " to " + Show(hi);
  const std::string expected = "expected " + range + (unit.empty() ? "" : " (" + unit + ")");
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        const std::optional<double> v = ParseFinite(s);
        if (!v || (*v != 0 && (*v < lo || *v > hi))) return expected + Got(s);
        return "";
      },
      range + (unit.empty() ? "" : " " + unit));
}

CLI::Validator Positive(const std::string& unit) { return Number(0, kNoUpperBound, unit, true); }

CLI::Validator NonNegative(const std::string& unit) { return Number(0, kNoUpperBound, unit, false); }

CLI::Validator Integer(std::int64_t lo, std::int64_t hi) {
  const std::string range = hi == std::numeric_limits<std::int64_t>::max()
                                ? ">= " + std::to_string(lo)
                                : "from " + std::to_string(lo) + " to " + std::to_string(hi);
  const std::string expected = "expected an integer " + range;
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE) return expected + Got(s);
        if (v < lo || v > hi) return expected + Got(s);
        return "";
      },
      range);
}

}  // namespace epd::cli
