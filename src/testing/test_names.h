// src/testing/test_names.h (test-only): names such as "k17" for request ids
// and cache keys in tests.
#pragma once

#include <string>

namespace epd::test_util {

// "<prefix><n>".
inline std::string Name(const char* prefix, long long n) { return prefix + std::to_string(n); }

}  // namespace epd::test_util
