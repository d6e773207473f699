// src/l3/l3_hex.h (internal to epd::l3): lower-case hex of bytes and its
// inverse, for the key file (epd/l3/l3_keyring.h) and lease values
// (epd/l3/l3_lease.h). Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace epd::internal {

// 2n lower-case hex digits of the n bytes at p.
inline std::string HexOf(const std::uint8_t* p, std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

// Parses exactly 2n hex digits (either case) into the n bytes at out; false
// (out partly written) for another length or a non-hex character.
inline bool ParseHex(std::string_view s, std::uint8_t* out, std::size_t n) {
  if (s.size() != 2 * n) return false;
  for (std::size_t i = 0; i < 2 * n; ++i) {
    const char c = s[i];
    const int v = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (v < 0) return false;
    out[i / 2] = static_cast<std::uint8_t>(i % 2 == 0 ? v << 4 : out[i / 2] | v);
  }
  return true;
}

}  // namespace epd::internal
