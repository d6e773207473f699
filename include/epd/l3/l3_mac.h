// epd/l3/l3_mac.h: the two message authentication codes the shared tier (L3)
// uses, on OpenSSL's EVP interfaces, and a constant-time tag comparison.
//
//   Gmac        GMAC: AES-256-GCM with every input byte as additional
//               authenticated data and no plaintext; a 16-byte tag.
//               Source: NIST SP 800-38D (GCM and GMAC), section 6.
//               REQUIRES a fresh IV per (key, message): reusing an IV under
//               one key lets an observer of the two tags forge messages
//               under that IV. With random 96-bit IVs (RandomBytes) SP
//               800-38D section 8.3 allows at most 2^32 messages per key.
//               Used for L3 values (epd/l3/l3_value.h): measured 4 to 5x
//               faster than HMAC-SHA256 on a 2 MB value (docs/L3.md).
//   HmacSha256  HMAC-SHA256 (RFC 2104, FIPS 198-1); a 32-byte tag, no IV.
//               Used for leases (epd/l3/l3_lease.h), which are short, and to
//               derive subkeys (epd/l3/l3_keyring.h).
//
// Both are incremental: Update() any number of times, then Final() once.
// An OpenSSL failure (out of memory, a missing algorithm) is remembered and
// reported by Final() as kInternal; Update() after a failure does nothing.
//
// Complexity: O(bytes) per Update. Thread safety: an object is not
// thread-safe; distinct objects may be used concurrently. Key bytes are
// copied into OpenSSL's context and wiped with it (EVP_*_free).
//
// Example:
//   Gmac mac(key, iv);
//   mac.Update(header, 120);
//   mac.Update(payload, n);
//   StatusOr<Gmac::Tag> tag = mac.Final();
//   bool same = TagsEqual(tag->data(), stored, tag->size());
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "epd/core/status.h"

typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;
typedef struct evp_mac_ctx_st EVP_MAC_CTX;

namespace epd {

using L3Secret = std::array<std::uint8_t, 32>;  // an AES-256 / HMAC key

class Gmac {
 public:
  using Iv = std::array<std::uint8_t, 12>;
  using Tag = std::array<std::uint8_t, 16>;
  Gmac(const L3Secret& key, const Iv& iv);
  ~Gmac();
  Gmac(const Gmac&) = delete;
  Gmac& operator=(const Gmac&) = delete;

  void Update(const void* data, std::size_t n);
  // The tag over everything passed to Update. Call once.
  StatusOr<Tag> Final();

 private:
  EVP_CIPHER_CTX* ctx_ = nullptr;
  bool failed_ = false;
};

class HmacSha256 {
 public:
  using Tag = std::array<std::uint8_t, 32>;
  explicit HmacSha256(std::span<const std::uint8_t> key);
  ~HmacSha256();
  HmacSha256(const HmacSha256&) = delete;
  HmacSha256& operator=(const HmacSha256&) = delete;

  void Update(const void* data, std::size_t n);
  StatusOr<Tag> Final();

 private:
  EVP_MAC_CTX* ctx_ = nullptr;
  bool failed_ = false;
};

// CRYPTO_memcmp: true when the n bytes are equal, in time independent of
// where they differ (so a forger learns nothing from how fast a guess fails).
bool TagsEqual(const void* a, const void* b, std::size_t n);

// n bytes from OpenSSL's CSPRNG (RAND_bytes). kInternal when it fails.
Status RandomBytes(std::span<std::uint8_t> out);

}  // namespace epd
