// src/l3/l3_test_util.h (test-only): what the epd::l3 tests share: content
// keys and keyrings made from a seed, and little-endian field access into a
// value's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "epd/core/content_key_type.h"
#include "epd/l3/l3_keyring.h"

namespace epd::test_util {

// A content key whose bytes depend on `seed`.
inline ContentKey TestKey(std::uint8_t seed) {
  ContentKey k;
  for (std::size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<std::uint8_t>(seed * 31 + i);
  return k;
}

// A keyring whose current key has id `id` and a secret of 32 bytes `fill`,
// and optionally a previous key (id, fill).
inline std::shared_ptr<const L3Keyring> TestKeyring(
    std::uint32_t id, std::uint8_t fill, std::optional<std::pair<std::uint32_t, std::uint8_t>> previous = {}) {
  L3Secret s;
  s.fill(fill);
  std::optional<std::pair<std::uint32_t, L3Secret>> p;
  if (previous) {
    L3Secret ps;
    ps.fill(previous->second);
    p = std::make_pair(previous->first, ps);
  }
  return L3Keyring::FromSecrets(id, s, p).value();
}

// The n-byte little-endian field at `off` of `v`, read and written.
inline std::uint64_t Le(const std::string& v, std::size_t off, std::size_t n) {
  std::uint64_t x = 0;
  for (std::size_t i = 0; i < n; ++i) x |= std::uint64_t{static_cast<unsigned char>(v[off + i])} << (8 * i);
  return x;
}
inline void SetLe(std::string& v, std::size_t off, std::size_t n, std::uint64_t x) {
  for (std::size_t i = 0; i < n; ++i) v[off + i] = static_cast<char>((x >> (8 * i)) & 0xff);
}

}  // namespace epd::test_util
