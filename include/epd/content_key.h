// epd/content_key.h: the 256-bit content key under which an image's embedding
// is cached, and the functions that derive it.
//
// A key is a SHA-256 digest (OpenSSL libcrypto) over a domain-separated,
// length-prefixed encoding of: the key-format version, the model id, every
// preprocessing field that changes the embedding, and the media's encoded
// bytes. It is computed before decoding, so a cache hit skips decode and
// preprocessing entirely. The full 32 bytes are kept: truncating to 64 bits
// would make a collision (one image served another's embedding) likely at
// about 2^32 images (birthday bound), which a fleet reaches.
//
// Thread safety: value type; the functions are thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

namespace epd {

struct ContentKey {
  std::array<std::uint8_t, 32> bytes{};

  // Lower-case hex, 64 characters.
  std::string Hex() const;

  friend bool operator==(const ContentKey&, const ContentKey&) = default;
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

}  // namespace epd

template <>
struct std::hash<epd::ContentKey> : epd::ContentKeyHash {};
