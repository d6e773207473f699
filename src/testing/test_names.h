// src/testing/test_names.h (test-only): names such as "k17" for request ids
// and cache keys in tests.
#pragma once

#include <string>

namespace epd::test_util {

// "<prefix><n>", built by appending: GCC 12 mis-warns (-Wrestrict) on
// "literal" + std::to_string(n), which prepends into the temporary.
inline std::string Name(const char* prefix, long long n) {
  std::string s(prefix);
  s += std::to_string(n);
  return s;
}

}  // namespace epd::test_util
