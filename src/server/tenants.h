// src/server/tenants.h (internal): who the caller of a call is, decided once
// per call from its credential, and the key namespace its items go to
// (docs/SECURITY.md).
//
// The rule, in order (ServerOptions, "Tenants"):
//   1. Bearer tokens configured: the token names the tenant (an unknown or
//      missing token is UNAUTHENTICATED); a tenant header is ignored.
//   2. Mutual TLS: the client certificate's subject field tls_tenant_field
//      names it (gRPC's AuthContext "x509_common_name", or a field of
//      "x509_subject").
//   3. trust_tenant_header and the header sent: the header names it.
//   4. Otherwise the caller is tenant "default".
// Operators (a token marked operator, or any caller when the server has no
// credentials at all) may read global Stats; other callers read their own
// tenant's. The fair order's share is "tenant:<name>" for a tenant named by a
// credential, else today's rule (admission.h, TenantFrom); the single shared
// auth_token names tenant "default" but no client, so it keeps today's rule.
//
// With isolation salted, every request carries KeyNamespace{secret,
// "tenant:<name>", public_allowed}: the worker keys its items in that
// namespace (epd/worker/encode_request.h), so nothing one tenant caches is a
// hit, a join or an L3 value for another, except items marked public by
// tenants in public_readers.
//
// Thread safety: immutable after Create; thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>

#include "auth.h"
#include "epd/core/status.h"
#include "epd/server/server.h"
#include "epd/worker/encode_request.h"

namespace grpc {
class ServerContextBase;
}

namespace epd::internal {

using Caller = CallerIdentity;  // epd/server/server.h

// The tenant name rule: 1..128 bytes of printable ASCII without spaces.
// kInvalidArgument naming `what` otherwise.
Status CheckTenantName(const std::string& name, const std::string& what);

class TenantDirectory {
 public:
  // Errors (kInvalidArgument): an empty token, a token listed twice, a bad
  // tenant name, isolation salted without a secret of >= 16 bytes (naming
  // --tenant-secret-file), max_tenant_labels < 1.
  static StatusOr<std::unique_ptr<TenantDirectory>> Create(const ServerOptions& options);

  // See the header comment. `authorization` and `header` are the metadata
  // values sent (nullopt = none), `cert_subject_field` the client
  // certificate's tenant field (nullopt = no certificate), `peer` the
  // address without port. kUnauthenticated for a refused token,
  // kInvalidArgument for a malformed tenant header.
  StatusOr<Caller> Identify(const std::optional<std::string>& authorization, const std::optional<std::string>& header,
                            const std::optional<std::string>& cert_subject_field, const std::string& peer) const;
  // The same, read from a gRPC call's metadata and auth context.
  StatusOr<Caller> Identify(const grpc::ServerContextBase& ctx) const;

  const TokenCheck& tokens() const { return tokens_; }
  bool salted() const { return secret_ != nullptr; }
  // Tokens, mutual TLS or a trusted header can name a tenant here.
  bool names_tenants() const { return tokens_.enabled() || mutual_tls_ || trust_header_; }
  // Tenants the tokens name (for the metrics page's first labels).
  const std::set<std::string>& configured() const { return configured_; }

 private:
  TenantDirectory(const ServerOptions& options, const std::vector<TokenCheck::Entry>& entries);

  const TokenCheck tokens_;
  const std::string tenant_header_;
  const bool trust_header_;
  const bool mutual_tls_;
  const std::string cert_field_;
  std::shared_ptr<const std::string> secret_;  // null = isolation none
  std::set<std::string> public_readers_;
  bool all_public_ = false;
  std::set<std::string> configured_;
};

// The value of `field` in a subject as gRPC prints it ("CN=a,O=b,OU=c"):
// "CN" -> "a"; "subject" -> the whole string; nullopt when absent. Escaped
// commas (RFC 4514 "\,") are not split on.
std::optional<std::string> SubjectField(const std::string& subject, const std::string& field);

}  // namespace epd::internal
