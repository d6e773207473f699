// src/media/digest.h (internal to epd::media): streaming SHA-256 (OpenSSL EVP)
// and XXH3-128 (libxxhash) behind one tiny interface, so the key encoder is
// written once for both modes.
//
// Thread safety: thread-compatible (one object per computation).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>

namespace epd::internal {

// A one-shot streaming digest: Update() any number of times, then Final()
// once. REQUIRES: no Update() after Final().
class Digest {
 public:
  virtual ~Digest() = default;
  virtual void Update(std::span<const std::uint8_t> data) = 0;
  // 32 bytes for SHA-256; XXH3-128 fills bytes [0, 16) and leaves the rest 0.
  virtual std::array<std::uint8_t, 32> Final() = 0;
};

// Throws epd::Error(kInternal) if libcrypto cannot create the context.
std::unique_ptr<Digest> NewSha256();
// Throws epd::Error(kInternal) if libxxhash cannot allocate its state.
std::unique_ptr<Digest> NewXxh3_128();

}  // namespace epd::internal
