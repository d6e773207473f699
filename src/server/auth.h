// src/server/auth.h (internal): the bearer tokens a server may require.
//
// With tokens configured, every Encode, Health and Stats call must carry the
// metadata "authorization: Bearer <token>"; a call without it, or with a
// token not in the table, ends UNAUTHENTICATED before any work (and is
// counted and logged like every failed call, call_outcomes.h). Each token
// names its tenant (ServerOptions::tenant_tokens; the single auth_token is
// tenant "default", an operator) and whether it is an operator's. The
// comparison takes the same time whatever the token sent: the sent token is
// hashed with SHA-256 and its digest compared with every entry's by OpenSSL's
// CRYPTO_memcmp, without stopping at a match, so neither the length, a
// matching prefix nor which entry matched leaks through timing. Cost: one
// SHA-256 plus O(tokens) 32-byte compares per call.
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
#include <vector>

#include "epd/core/status.h"

namespace grpc {
class ServerContextBase;
}

namespace epd::internal {

// Who a token belongs to.
struct TokenOwner {
  std::string tenant;
  bool is_operator = false;
  // The single shared token (ServerOptions::auth_token): every client holds
  // it, so it names tenant "default" but no client in particular (the fair
  // order keeps telling its clients apart by address or header).
  bool shared = false;
};

class TokenCheck {
 public:
  struct Entry {
    std::string token;  // non-empty
    TokenOwner owner;
  };
  // Empty `token`: no check (every call passes).
  explicit TokenCheck(const std::string& token);
  // A table; empty = no check. REQUIRES: no empty token.
  explicit TokenCheck(const std::vector<Entry>& entries);

  bool enabled() const { return !table_.empty(); }

  // OK, or kUnauthenticated naming what was wrong (missing header, not
  // "Bearer", unknown token) without echoing what was sent.
  Status Check(const grpc::ServerContextBase& ctx) const;
  // The same for the value of the authorization header (nullopt = absent).
  Status CheckHeader(const std::optional<std::string>& header) const;
  // The token's owner, or CheckHeader's refusal. REQUIRES: enabled().
  StatusOr<TokenOwner> Owner(const std::optional<std::string>& header) const;

 private:
  struct Digested {
    std::array<std::uint8_t, 32> digest;
    TokenOwner owner;
  };
  std::vector<Digested> table_;
};

// The value of the "authorization" metadata of a gRPC call, if sent.
std::optional<std::string> AuthorizationOf(const grpc::ServerContextBase& ctx);

}  // namespace epd::internal
