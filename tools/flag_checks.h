// tools/flag_checks.h: number checks for the command-line flags.
//
// CLI11 2.1's own checks (CLI::Range, PositiveNumber, NonNegativeNumber) let
// "nan" through (every comparison with NaN is false) and describe an open
// bound by printing DBL_MAX in full. These refuse NaN and infinities and say
// the accepted range in plain terms. CLI11 prefixes the option's name:
//   --cache-mb: expected a number >= 0 (MB), got 'nan'
//   --port: expected an integer from 0 to 65535, got '70000'
//
// Thread safety: the validators are immutable values; parse on one thread.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <string>

namespace epd::cli {

inline constexpr double kNoUpperBound = std::numeric_limits<double>::infinity();

// A finite number x with lo <= x <= hi (lo < x when lo_open). `unit` (e.g.
// "MB", "s") is named in the message; empty for none.
CLI::Validator Number(double lo, double hi = kNoUpperBound, const std::string& unit = "", bool lo_open = false);
// Exactly 0, or a finite number lo <= x <= hi: for a flag whose 0 means "off"
// or "the library's default", where a positive value below lo would be
// rounded to that 0 (e.g. seconds kept in whole milliseconds: lo = 0.001).
CLI::Validator ZeroOrNumber(double lo, double hi, const std::string& unit = "");
// Shorthands: x > 0, and x >= 0.
CLI::Validator Positive(const std::string& unit = "");
CLI::Validator NonNegative(const std::string& unit = "");
// A whole number lo <= n <= hi (written without a fraction or exponent).
CLI::Validator Integer(std::int64_t lo, std::int64_t hi = std::numeric_limits<std::int64_t>::max());

}  // namespace epd::cli
