// src/http/tls_context.h (internal): the OpenSSL server context of an
// HttpEndpoint with TLS.
//
// Built from PEM text: the certificate (a chain: the first certificate is
// the server's, the rest its intermediates), its unencrypted private key,
// and optionally a client CA, which makes the handshake require a client
// certificate that CA signed. TLS 1.2 or later; renegotiation off (a read
// then never needs to write, connection.cc relies on it).
//
// Errors (kInvalidArgument, naming the part): a key without a certificate
// or the reverse, a client CA without both, PEM that does not parse, a key
// that does not belong to the certificate.
//
// Thread safety: an SSL_CTX is shared by every connection (OpenSSL locks
// it internally).
#pragma once

#include <openssl/ssl.h>

#include <memory>
#include <string>

#include "epd/core/status.h"

namespace epd::internal {

struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxFree>;

// Null (and OK) when cert and key are both empty: plaintext.
StatusOr<SslCtxPtr> MakeTlsContext(const std::string& cert_pem, const std::string& key_pem,
                                   const std::string& client_ca_pem);

}  // namespace epd::internal
