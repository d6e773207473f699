// ExitDeadline: the process ends with the given code once the budget passes
// inside the scope, and nothing happens when the scope ends in time.
#include "exit_deadline.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <chrono>
#include <thread>

namespace epd::cli {
namespace {

TEST(ExitDeadlineDeathTest, EndsTheProcessWhenTheScopeOutlivesItsBudget) {
  EXPECT_EXIT(
      {
        // As epd-encode's main does: logs go to stderr, which the death test reads.
        spdlog::set_default_logger(spdlog::stderr_logger_mt("stderr"));
        const ExitDeadline d(std::chrono::milliseconds(50), "took too long", 7);
        // Stands in for a shutdown step that never returns.
        std::this_thread::sleep_for(std::chrono::hours(1));
      },
      ::testing::ExitedWithCode(7), "took too long");
}

TEST(ExitDeadlineTest, DisarmsWhenTheScopeEndsInTime) {
  { const ExitDeadline d(std::chrono::minutes(10), "unused", 7); }
  SUCCEED();  // still running: the destructor returned without exiting
}

}  // namespace
}  // namespace epd::cli
