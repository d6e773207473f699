// src/testing/float_rows.h (test-only): reading a tower output's F32 bytes
// back as floats, and the relative difference the tower tests compare them
// by.
//
// Usage:
//   std::vector<float> main = epd::test_util::Floats(out->main);
//   EXPECT_LT(epd::test_util::RelDiff(main, reference), 1e-5);
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace epd::test_util {

// The bytes as float32 values (host byte order); bytes.size() / 4 of them.
inline std::vector<float> Floats(const std::vector<std::byte>& bytes) {
  std::vector<float> f(bytes.size() / 4);
  // An empty vector's data() may be null (towers without deepstack rows), and
  // memcpy from null is undefined even for 0 bytes: UBSan reported it under
  // make asan, once in each test that had its own copy of this function.
  if (!bytes.empty()) std::memcpy(f.data(), bytes.data(), f.size() * sizeof(float));
  return f;
}

// max |a - b| / max(1, max |b|): b is the reference. The towers' outputs are
// O(1), so this is an absolute difference for small outputs and a relative
// one for large. Records a failure when the sizes differ (then compares the
// common prefix).
inline double RelDiff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 1;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / scale;
}

}  // namespace epd::test_util
