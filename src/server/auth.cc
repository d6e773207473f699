#include "auth.h"

#include <grpcpp/grpcpp.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

namespace epd::internal {
namespace {

std::array<std::uint8_t, 32> Sha256(const std::string& s) {
  std::array<std::uint8_t, 32> d{};
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

constexpr char kBearer[] = "Bearer ";

}  // namespace

TokenCheck::TokenCheck(const std::string& token) {
  if (!token.empty()) digest_ = Sha256(token);
}

Status TokenCheck::CheckHeader(const std::optional<std::string>& header) const {
  if (!digest_.has_value()) return Status::Ok();
  if (!header.has_value()) {
    return Status(StatusCode::kUnauthenticated,
                  "this server requires a bearer token: send the metadata \"authorization: Bearer <token>\"");
  }
  if (!header->starts_with(kBearer)) {
    return Status(StatusCode::kUnauthenticated, "the authorization metadata is not \"Bearer <token>\"");
  }
  const std::array<std::uint8_t, 32> sent = Sha256(header->substr(sizeof(kBearer) - 1));
  if (CRYPTO_memcmp(sent.data(), digest_->data(), sent.size()) != 0) {
    return Status(StatusCode::kUnauthenticated, "the bearer token is not this server's");
  }
  return Status::Ok();
}

Status TokenCheck::Check(const grpc::ServerContextBase& ctx) const {
  if (!digest_.has_value()) return Status::Ok();
  const auto& md = ctx.client_metadata();
  const auto it = md.find("authorization");
  if (it == md.end()) return CheckHeader(std::nullopt);
  return CheckHeader(std::string(it->second.data(), it->second.size()));
}

}  // namespace epd::internal
