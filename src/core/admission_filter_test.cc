// AdmissionFilter: the doorkeeper's counts within a window, the window's
// end, and its false-positive rate against the bound in its header.
#include "epd/core/admission_filter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "epd/core/status.h"

namespace epd {
namespace {

std::uint64_t H(int i) { return std::hash<std::string>{}("key-" + std::to_string(i)); }

TEST(AdmissionFilterTest, CountsRequestsWithinAWindow) {
  AdmissionFilter f({.window = 1000});
  EXPECT_EQ(f.Estimate(H(1)), 0u);
  EXPECT_EQ(f.Record(H(1)), 1u);
  EXPECT_EQ(f.Estimate(H(1)), 1u);
  EXPECT_EQ(f.Record(H(1)), 2u);
  EXPECT_EQ(f.Record(H(1)), 3u);
  EXPECT_EQ(f.Estimate(H(1)), 3u);
  EXPECT_EQ(f.Estimate(H(2)), 0u);
}

// After `window` requests the doorkeeper forgets and the sketch halves: a key
// seen once is forgotten; one seen 5 times (doorkeeper + sketch 4) keeps 2.
TEST(AdmissionFilterTest, WindowEndForgetsOneRequestAndHalvesCounts) {
  AdmissionFilter f({.window = 10});
  f.Record(H(1));                              // 1 request: doorkeeper only
  for (int i = 0; i < 5; ++i) f.Record(H(2));  // 5: doorkeeper + sketch 4
  for (int i = 100; i < 104; ++i) f.Record(H(i));
  EXPECT_EQ(f.resets(), 1u);
  EXPECT_EQ(f.Estimate(H(1)), 0u);  // forgotten
  EXPECT_EQ(f.Estimate(H(2)), 2u);  // sketch 4 halved, doorkeeper cleared
  EXPECT_EQ(f.Record(H(2)), 3u);
}

TEST(AdmissionFilterTest, FalsePositivesStayUnderTheDocumentedRate) {
  const int window = 1 << 16;
  AdmissionFilter f({.window = static_cast<std::uint64_t>(window) + 1});
  for (int i = 0; i < window; ++i) f.Record(H(i));
  int false_positive = 0;
  const int probes = 200000;
  for (int i = 0; i < probes; ++i) false_positive += f.Estimate(H(10'000'000 + i)) > 0 ? 1 : 0;
  // Header: about 0.09% at 16 bits per request; allow 2x.
  EXPECT_LT(static_cast<double>(false_positive) / probes, 0.0018) << false_positive;
}

TEST(AdmissionFilterTest, BadOptionsAreRejectedNamingThem) {
  try {
    AdmissionFilter f({.window = 0});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("admission window must be >= 1"));
  }
  EXPECT_THROW(AdmissionFilter({.window = 10, .bits_per_request = 0}), Error);
}

}  // namespace
}  // namespace epd
