// src/server/auth.h (internal): the bearer token a server may require.
//
// With a token configured, every Encode, Health and Stats call must carry the
// metadata "authorization: Bearer <token>"; a call without it, or with
// another token, ends UNAUTHENTICATED before any work (and is counted and
// logged like every failed call, call_outcomes.h). The comparison takes the
// same time whatever the token sent: both sides are hashed with SHA-256 and
// the digests compared with OpenSSL's CRYPTO_memcmp, so neither the length
// nor a matching prefix leaks through timing.
//
// A token is only as secret as the channel: send it over TLS (or over a
// network only the proxy and the servers share).
//
// Thread safety: immutable after construction; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "epd/core/status.h"

namespace grpc {
class ServerContextBase;
}

namespace epd::internal {

class TokenCheck {
 public:
  // Empty `token`: no check (every call passes).
  explicit TokenCheck(const std::string& token);

  bool enabled() const { return digest_.has_value(); }

  // OK, or kUnauthenticated naming what was wrong (missing header, not
  // "Bearer", wrong token) without echoing what was sent.
  Status Check(const grpc::ServerContextBase& ctx) const;
  // The same for the value of the authorization header (nullopt = absent).
  Status CheckHeader(const std::optional<std::string>& header) const;

 private:
  std::optional<std::array<std::uint8_t, 32>> digest_;
};

}  // namespace epd::internal
