// ClientOptions::Validate: the option checks EncodeClient::Connect makes
// before it opens a channel (epd/client/client.h).
#include <cstdint>
#include <string>

#include "epd/client/client.h"

namespace epd {

Status ClientOptions::Validate() const {
  if (target.empty()) return InvalidArgument("client target is empty; pass host:port or unix:/path");
  if (timeout.count() <= 0) {
    return InvalidArgument("client timeout must be > 0 ms, got " + std::to_string(timeout.count()));
  }
  if (max_response_bytes <= 0 || max_response_bytes > std::int64_t{2047} << 20) {
    return InvalidArgument("max_response_bytes must be in (0, 2047 MiB], got " + std::to_string(max_response_bytes));
  }
  if (delivery == Delivery::kCudaIpc && ipc_device == nullptr) {
    return InvalidArgument("Delivery::kCudaIpc needs ClientOptions::ipc_device, the Device that imports the rows");
  }
  if (tls_client_cert_pem.empty() != tls_client_key_pem.empty()) {
    return InvalidArgument(std::string("mutual TLS needs both the client certificate and its key; ") +
                           (tls_client_cert_pem.empty() ? "tls_client_cert_pem" : "tls_client_key_pem") +
                           " is missing");
  }
  return Status::Ok();
}

}  // namespace epd
