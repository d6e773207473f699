#include "digest.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <cstring>

#include "epd/core/status.h"

namespace epd::internal {
namespace {

// OpenSSL's EVP interface (not the deprecated SHA256_* calls), so a provider
// with SHA-NI/AVX2 code is picked at run time.
class Sha256 final : public Digest {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
      EVP_MD_CTX_free(ctx_);
      throw Error(StatusCode::kInternal, "libcrypto: cannot initialise SHA-256");
    }
  }
  ~Sha256() override { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(std::span<const std::uint8_t> data) override {
    if (data.empty()) return;
    if (EVP_DigestUpdate(ctx_, data.data(), data.size()) != 1) {
      throw Error(StatusCode::kInternal, "libcrypto: SHA-256 update failed");
    }
  }

  std::array<std::uint8_t, 32> Final() override {
    std::array<std::uint8_t, 32> out{};
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx_, out.data(), &len) != 1 || len != out.size()) {
      throw Error(StatusCode::kInternal, "libcrypto: SHA-256 final failed");
    }
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

class Xxh3Digest128 final : public Digest {
 public:
  Xxh3Digest128() : state_(XXH3_createState()) {
    if (state_ == nullptr || XXH3_128bits_reset(state_) != XXH_OK) {
      XXH3_freeState(state_);
      throw Error(StatusCode::kInternal, "libxxhash: cannot initialise XXH3-128");
    }
  }
  ~Xxh3Digest128() override { XXH3_freeState(state_); }
  Xxh3Digest128(const Xxh3Digest128&) = delete;
  Xxh3Digest128& operator=(const Xxh3Digest128&) = delete;

  void Update(std::span<const std::uint8_t> data) override {
    if (data.empty()) return;
    XXH3_128bits_update(state_, data.data(), data.size());
  }

  std::array<std::uint8_t, 32> Final() override {
    // The canonical (big-endian) form, so keys do not depend on host byte order.
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(state_));
    std::array<std::uint8_t, 32> out{};
    static_assert(sizeof(canon.digest) == 16);
    std::memcpy(out.data(), canon.digest, sizeof(canon.digest));
    return out;
  }

 private:
  XXH3_state_t* state_;
};

}  // namespace

std::unique_ptr<Digest> NewSha256() { return std::make_unique<Sha256>(); }
std::unique_ptr<Digest> NewXxh3_128() { return std::make_unique<Xxh3Digest128>(); }

}  // namespace epd::internal
