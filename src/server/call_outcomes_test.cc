// RateLimitedLog with a hand-driven clock: how many lines pass per window,
// and how the dropped ones are reported.
#include "call_outcomes.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace epd::internal {
namespace {

TEST(RateLimitedLogTest, PassesAtMostTheLimitPerWindowAndCountsTheRest) {
  std::vector<std::string> lines;
  RateLimitedLog::Clock::time_point now{};
  RateLimitedLog log([&](const std::string& l) { lines.push_back(l); }, 3, std::chrono::seconds(1),
                     [&] { return now; });
  for (int i = 0; i < 10; ++i) log.Log("line " + std::to_string(i));
  ASSERT_EQ(lines, (std::vector<std::string>{"line 0", "line 1", "line 2"}));
  now += std::chrono::milliseconds(999);  // same window
  log.Log("late");
  EXPECT_EQ(lines.size(), 3u);
  now += std::chrono::milliseconds(1);  // a new window: 7 + 1 were dropped
  log.Log("next");
  log.Log("after");
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[3], "next (8 earlier lines not logged: rate limit)");
  EXPECT_EQ(lines[4], "after");
}

TEST(CallOutcomesTest, CountsAndLogsOnlyFailedCalls) {
  std::vector<std::string> lines;
  CallOutcomes outcomes([&](const std::string& l) { lines.push_back(l); });
  outcomes.Record("/m", "ipv4:1.2.3.4:5", Status::Ok());
  outcomes.Record("/m", "ipv4:1.2.3.4:5", Status(StatusCode::kUnauthenticated, "no token"));
  outcomes.Record("/m", "ipv4:1.2.3.4:5", Status(StatusCode::kUnauthenticated, "no token"));
  const auto errors = outcomes.Errors();
  EXPECT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors.at(StatusCode::kUnauthenticated), 2u);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "/m from ipv4:1.2.3.4:5 failed: UNAUTHENTICATED: no token");
}

}  // namespace
}  // namespace epd::internal
