// The flag checks, driven through a real CLI11 parse as the tool uses them:
// the value stored, or the message the user sees.
#include "flag_checks.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace epd::cli {
namespace {

// Parses `--x VALUE` into an option checked by `check`; returns "" when
// accepted (and stores the value in *out), else CLI11's error text.
template <typename T>
std::string Parse(const CLI::Validator& check, const std::string& value, T* out) {
  CLI::App app;
  app.add_option("--x", *out)->check(check);
  std::vector<std::string> args = {value, "--x"};  // CLI11 takes them reversed
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(FlagChecksTest, NonNegativeRefusesNanInfinityAndNegatives) {
  double v = -7;
  EXPECT_EQ(Parse(NonNegative("MB"), "0", &v), "");
  EXPECT_EQ(v, 0.0);
  EXPECT_EQ(Parse(NonNegative("MB"), "1.5", &v), "");
  EXPECT_EQ(v, 1.5);
  EXPECT_EQ(Parse(NonNegative("MB"), "nan", &v), "--x: expected a number >= 0 (MB), got 'nan'");
  EXPECT_EQ(Parse(NonNegative("MB"), "inf", &v), "--x: expected a number >= 0 (MB), got 'inf'");
  EXPECT_EQ(Parse(NonNegative("MB"), "-1", &v), "--x: expected a number >= 0 (MB), got '-1'");
  EXPECT_EQ(Parse(NonNegative("MB"), "12MB", &v), "--x: expected a number >= 0 (MB), got '12MB'");
  EXPECT_EQ(v, 1.5);  // a refused value leaves the option as it was
}

TEST(FlagChecksTest, PositiveRefusesZero) {
  double v = 0;
  EXPECT_EQ(Parse(Positive("s"), "0", &v), "--x: expected a number > 0 (s), got '0'");
  EXPECT_EQ(Parse(Positive("s"), "1e-3", &v), "");
  EXPECT_EQ(v, 0.001);
}

// --keepalive-s 0.0004 was kept as 0 ms, which means gRPC's default (two
// hours): the opposite of what was asked. Below the lower bound, only 0.
TEST(FlagChecksTest, ZeroOrNumberRefusesValuesThatWouldRoundToZero) {
  double v = -7;
  EXPECT_EQ(Parse(ZeroOrNumber(0.001, 86400, "s"), "0", &v), "");
  EXPECT_EQ(v, 0.0);
  EXPECT_EQ(Parse(ZeroOrNumber(0.001, 86400, "s"), "0.001", &v), "");
  EXPECT_EQ(v, 0.001);
  EXPECT_EQ(Parse(ZeroOrNumber(0.001, 86400, "s"), "0.0004", &v),
            "--x: expected 0 or a number from 0.001 to 86400 (s), got '0.0004'");
  EXPECT_EQ(Parse(ZeroOrNumber(0.001, 86400, "s"), "1e-300", &v),
            "--x: expected 0 or a number from 0.001 to 86400 (s), got '1e-300'");
  EXPECT_EQ(Parse(ZeroOrNumber(0.001, 86400, "s"), "-1", &v),
            "--x: expected 0 or a number from 0.001 to 86400 (s), got '-1'");
  EXPECT_EQ(Parse(ZeroOrNumber(0.001, 86400, "s"), "nan", &v),
            "--x: expected 0 or a number from 0.001 to 86400 (s), got 'nan'");
  EXPECT_EQ(Parse(ZeroOrNumber(0.001, 86400, "s"), "86401", &v),
            "--x: expected 0 or a number from 0.001 to 86400 (s), got '86401'");
  EXPECT_EQ(v, 0.001);
}

TEST(FlagChecksTest, BoundedNumberNamesBothEnds) {
  double v = 0;
  EXPECT_EQ(Parse(Number(0.001, 2047, "MB"), "3000", &v), "--x: expected a number from 0.001 to 2047 (MB), got '3000'");
  EXPECT_EQ(Parse(Number(0, 1e6, "s", /*lo_open=*/true), "0", &v),
            "--x: expected a number above 0 and up to 1e+06 (s), got '0'");
  EXPECT_EQ(Parse(Number(0, 1e6, "s", /*lo_open=*/true), "1e300", &v),
            "--x: expected a number above 0 and up to 1e+06 (s), got '1e300'");
  EXPECT_EQ(Parse(Number(0.001, 2047, "MB"), "2047", &v), "");
  EXPECT_EQ(v, 2047.0);
}

TEST(FlagChecksTest, IntegerRefusesFractionsAndOutOfRange) {
  int port = 0;
  EXPECT_EQ(Parse(Integer(0, 65535), "65535", &port), "");
  EXPECT_EQ(port, 65535);
  EXPECT_EQ(Parse(Integer(0, 65535), "70000", &port), "--x: expected an integer from 0 to 65535, got '70000'");
  EXPECT_EQ(Parse(Integer(0, 65535), "80.5", &port), "--x: expected an integer from 0 to 65535, got '80.5'");
  EXPECT_EQ(Parse(Integer(0, 65535), "99999999999999999999", &port),
            "--x: expected an integer from 0 to 65535, got '99999999999999999999'");
  std::int64_t n = 0;
  EXPECT_EQ(Parse(Integer(1), "0", &n), "--x: expected an integer >= 1, got '0'");
  EXPECT_EQ(Parse(Integer(1), "8192", &n), "");
  EXPECT_EQ(n, 8192);
}

}  // namespace
}  // namespace epd::cli
