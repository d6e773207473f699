// Test-only: the bytes of safetensors files written out by hand, so a test
// states what a reader must accept or reject independently of the codec's
// writer (epd/safetensors/safetensors_codec.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

namespace epd::test_util {

// `v` as 8 little-endian bytes: the header length prefix, or an I64/U64.
inline std::string Le64(std::uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// The host's (little-endian) bytes of each float, as an F32 tensor holds them.
inline std::string FloatBytes(std::initializer_list<float> values) {
  std::string s;
  for (float f : values) {
    char b[4];
    std::memcpy(b, &f, 4);
    s.append(b, 4);
  }
  return s;
}

// A file: the length prefix, `header` (JSON, unpadded) and `data`.
inline std::string SafetensorsBytes(const std::string& header, const std::string& data) {
  return Le64(header.size()) + header + data;
}

}  // namespace epd::test_util
