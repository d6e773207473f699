// GMAC and HMAC-SHA256 on OpenSSL 3's EVP (epd/l3/l3_mac.h). The cipher and
// the MAC algorithm are fetched once per process (EVP_CIPHER_fetch /
// EVP_MAC_fetch are lookups in OpenSSL's provider tables, costlier than a
// short message) and kept for its lifetime.
#include "epd/l3/l3_mac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>

namespace epd {
namespace {

EVP_CIPHER* Aes256Gcm() {
  static EVP_CIPHER* const cipher = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
  return cipher;
}

EVP_MAC* Hmac() {
  static EVP_MAC* const mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  return mac;
}

}  // namespace

Gmac::Gmac(const L3Secret& key, const Iv& iv) : ctx_(EVP_CIPHER_CTX_new()) {
  // The IV length is set before the key and IV are given (GCM's default is
  // 12 bytes already; set anyway, so the code says what it relies on).
  failed_ = ctx_ == nullptr || Aes256Gcm() == nullptr ||
            EVP_EncryptInit_ex2(ctx_, Aes256Gcm(), nullptr, nullptr, nullptr) != 1 ||
            EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(iv.size()), nullptr) != 1 ||
            EVP_EncryptInit_ex2(ctx_, nullptr, key.data(), iv.data(), nullptr) != 1;
}

Gmac::~Gmac() { EVP_CIPHER_CTX_free(ctx_); }

void Gmac::Update(const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (!failed_ && n > 0) {
    const int chunk = static_cast<int>(std::min<std::size_t>(n, INT_MAX / 2));
    int out_len = 0;
    // A null output buffer makes the input additional authenticated data.
    failed_ = EVP_EncryptUpdate(ctx_, nullptr, &out_len, p, chunk) != 1;
    p += chunk;
    n -= static_cast<std::size_t>(chunk);
  }
}

StatusOr<Gmac::Tag> Gmac::Final() {
  Tag tag{};
  int out_len = 0;
  if (failed_ || EVP_EncryptFinal_ex(ctx_, nullptr, &out_len) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag.size()), tag.data()) != 1) {
    failed_ = true;
    return Internal("OpenSSL AES-256-GCM (GMAC) failed");
  }
  return tag;
}

HmacSha256::HmacSha256(std::span<const std::uint8_t> key) {
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  ctx_ = Hmac() != nullptr ? EVP_MAC_CTX_new(Hmac()) : nullptr;
  failed_ = ctx_ == nullptr || EVP_MAC_init(ctx_, key.data(), key.size(), params) != 1;
}

HmacSha256::~HmacSha256() { EVP_MAC_CTX_free(ctx_); }

void HmacSha256::Update(const void* data, std::size_t n) {
  if (!failed_ && n > 0) failed_ = EVP_MAC_update(ctx_, static_cast<const unsigned char*>(data), n) != 1;
}

StatusOr<HmacSha256::Tag> HmacSha256::Final() {
  Tag tag{};
  std::size_t len = 0;
  if (failed_ || EVP_MAC_final(ctx_, tag.data(), &len, tag.size()) != 1 || len != tag.size()) {
    failed_ = true;
    return Internal("OpenSSL HMAC-SHA256 failed");
  }
  return tag;
}

bool TagsEqual(const void* a, const void* b, std::size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

Status RandomBytes(std::span<std::uint8_t> out) {
  if (out.size() > INT_MAX || RAND_bytes(out.data(), static_cast<int>(out.size())) != 1) {
    return Internal("OpenSSL RAND_bytes failed (no entropy source?)");
  }
  return Status::Ok();
}

}  // namespace epd
