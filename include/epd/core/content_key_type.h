// epd/core/content_key_type.h: ContentKey, the 256-bit value under which an
// image's embedding is cached, and its hash and hex form.
//
// This is the core's half of content keys: the value type the caches, the
// scheduler's users and the worker's results hold. How a key is derived from
// media (SHA-256 or XXH3 over model id, preprocessing and bytes) is the
// media library's: epd/media/content_key.h.
//
// Cost: a key is 32 bytes, compared and hashed in O(1) (the hash reads its
// first 8 bytes, already uniformly distributed by the digest).
//
// Thread safety: value type; the functions are thread-safe.
//
// Example:
//   std::unordered_map<epd::ContentKey, int, epd::ContentKeyHash> seen;
//   std::string hex = key.Hex();                      // 64 lower-case digits
//   epd::StatusOr<epd::ContentKey> back = epd::ParseContentKeyHex(hex);
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

#include "epd/core/status.h"

namespace epd {

struct ContentKey {
  std::array<std::uint8_t, 32> bytes{};

  // Lower-case hex, 64 characters.
  std::string Hex() const;

  friend bool operator==(const ContentKey&, const ContentKey&) = default;
  // NOLINTNEXTLINE(modernize-use-nullptr): clang-tidy 14 flags the 0 the compiler synthesizes for a defaulted <=>.
  friend auto operator<=>(const ContentKey&, const ContentKey&) = default;
};

// Hash for unordered containers and the cache index. The key is already a
// uniformly distributed digest, so its first 8 bytes are a perfect hash value.
struct ContentKeyHash {
  std::size_t operator()(const ContentKey& k) const noexcept {
    std::uint64_t h;
    std::memcpy(&h, k.bytes.data(), sizeof(h));
    return static_cast<std::size_t>(h);
  }
};

// Parses the 64-hex-digit form Hex() writes (either case accepted).
// Errors (kInvalidArgument): wrong length or a non-hex character.
StatusOr<ContentKey> ParseContentKeyHex(std::string_view hex);

}  // namespace epd

template <>
struct std::hash<epd::ContentKey> : epd::ContentKeyHash {};
