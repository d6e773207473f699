// src/server/tls.h (internal): gRPC server credentials from PEM text.
//
// Plaintext when no certificate is given; TLS with `cert_pem` and `key_pem`;
// mutual TLS when `client_ca_pem` is set too: the handshake then requires a
// client certificate that CA signed, and refuses the connection otherwise
// (before any call, so nothing reaches a handler).
//
// The PEM text is checked here with OpenSSL (the certificate parses, the key
// parses and belongs to it, the CA parses), so a bad file is named at start
// instead of surfacing as "cannot listen" when gRPC refuses the port.
#pragma once

#include <memory>
#include <string>

#include "epd/core/status.h"

namespace grpc {
class ServerCredentials;
}

namespace epd::internal {

// kInvalidArgument naming the field for: a key without a certificate or the
// reverse, a client CA without a certificate, PEM that does not parse, a key
// that does not match the certificate.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const std::string& cert_pem,
                                                                         const std::string& key_pem,
                                                                         const std::string& client_ca_pem);

}  // namespace epd::internal
