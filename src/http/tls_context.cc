// See tls_context.h.
#include "tls_context.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

namespace epd::internal {
namespace {

struct BioDel {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioDel>;

BioPtr MemBio(const std::string& pem) { return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))); }

Status Refuse(const std::string& what) {
  ERR_clear_error();
  return InvalidArgument("HTTP TLS: " + what);
}

// The server certificate, then every further certificate of the PEM as
// its chain.
Status UseChain(SSL_CTX* ctx, const std::string& pem) {
  BioPtr bio = MemBio(pem);
  X509* leaf = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
  if (leaf == nullptr) return Refuse("the certificate is not a PEM X.509 certificate");
  const int used = SSL_CTX_use_certificate(ctx, leaf);
  X509_free(leaf);
  if (used != 1) return Refuse("OpenSSL refused the certificate");
  while (X509* extra = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add0_chain_cert(ctx, extra) != 1) {
      X509_free(extra);
      return Refuse("OpenSSL refused an intermediate certificate of the chain");
    }
  }
  ERR_clear_error();  // the loop ends on "no start line"
  return Status::Ok();
}

Status UseKey(SSL_CTX* ctx, const std::string& pem) {
  BioPtr bio = MemBio(pem);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) return Refuse("the key is not an unencrypted PEM private key");
  const int used = SSL_CTX_use_PrivateKey(ctx, key);
  EVP_PKEY_free(key);
  if (used != 1 || SSL_CTX_check_private_key(ctx) != 1) return Refuse("the key does not belong to the certificate");
  return Status::Ok();
}

Status RequireClientsOf(SSL_CTX* ctx, const std::string& pem) {
  BioPtr bio = MemBio(pem);
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  int added = 0;
  while (X509* ca = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    added += X509_STORE_add_cert(store, ca) == 1 ? 1 : 0;
    X509_free(ca);
  }
  if (added == 0) return Refuse("the client CA is not a PEM X.509 certificate");
  ERR_clear_error();
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return Status::Ok();
}

}  // namespace

StatusOr<SslCtxPtr> MakeTlsContext(const std::string& cert_pem, const std::string& key_pem,
                                   const std::string& client_ca_pem) {
  if (cert_pem.empty() && key_pem.empty()) {
    if (!client_ca_pem.empty()) return Refuse("a client CA needs the server certificate and key too");
    return SslCtxPtr();
  }
  if (cert_pem.empty() || key_pem.empty()) {
    return Refuse(std::string("TLS needs a certificate and its key; the ") +
                  (cert_pem.empty() ? "certificate" : "key") + " is missing");
  }
  SslCtxPtr ctx(SSL_CTX_new(TLS_server_method()));
  if (ctx == nullptr) return Refuse("OpenSSL could not create a context");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (Status s = UseChain(ctx.get(), cert_pem); !s.ok()) return s;
  if (Status s = UseKey(ctx.get(), key_pem); !s.ok()) return s;
  if (!client_ca_pem.empty()) {
    if (Status s = RequireClientsOf(ctx.get(), client_ca_pem); !s.ok()) return s;
  }
  return ctx;
}

}  // namespace epd::internal
