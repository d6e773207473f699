#include "tls.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

namespace epd::internal {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::unique_ptr<BIO, BioFree> Bio(const std::string& pem) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

std::unique_ptr<X509, X509Free> ReadCert(const std::string& pem) {
  auto bio = Bio(pem);
  return std::unique_ptr<X509, X509Free>(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

}  // namespace

StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const std::string& cert_pem,
                                                                         const std::string& key_pem,
                                                                         const std::string& client_ca_pem) {
  if (cert_pem.empty() && key_pem.empty()) {
    if (!client_ca_pem.empty()) {
      return InvalidArgument("a TLS client CA (--tls-client-ca) needs TLS: set the server certificate and key too");
    }
    return grpc::InsecureServerCredentials();
  }
  if (cert_pem.empty() || key_pem.empty()) {
    return InvalidArgument(std::string("TLS needs both a certificate and its private key; the ") +
                           (cert_pem.empty() ? "certificate (--tls-cert)" : "key (--tls-key)") + " is missing");
  }
  auto cert = ReadCert(cert_pem);
  if (cert == nullptr) return InvalidArgument("the TLS certificate (--tls-cert) is not a PEM X.509 certificate");
  auto key_bio = Bio(key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    ERR_clear_error();
    return InvalidArgument("the TLS key (--tls-key) is not an unencrypted PEM private key");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return InvalidArgument("the TLS key (--tls-key) does not belong to the certificate (--tls-cert)");
  }
  grpc::SslServerCredentialsOptions opts(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  opts.pem_key_cert_pairs.push_back({key_pem, cert_pem});
  if (!client_ca_pem.empty()) {
    if (ReadCert(client_ca_pem) == nullptr) {
      ERR_clear_error();
      return InvalidArgument("the TLS client CA (--tls-client-ca) is not a PEM X.509 certificate");
    }
    opts.pem_root_certs = client_ca_pem;
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  ERR_clear_error();
  return grpc::SslServerCredentials(opts);
}

}  // namespace epd::internal
