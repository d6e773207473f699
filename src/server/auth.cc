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
  if (!token.empty()) table_.push_back({Sha256(token), TokenOwner{"default", true, true}});
}

TokenCheck::TokenCheck(const std::vector<Entry>& entries) {
  for (const Entry& e : entries) table_.push_back({Sha256(e.token), e.owner});
}

StatusOr<TokenOwner> TokenCheck::Owner(const std::optional<std::string>& header) const {
  if (!header.has_value()) {
    return Status(StatusCode::kUnauthenticated,
                  "this server requires a bearer token: send the metadata \"authorization: Bearer <token>\"");
  }
  if (!header->starts_with(kBearer)) {
    return Status(StatusCode::kUnauthenticated, "the authorization metadata is not \"Bearer <token>\"");
  }
  const std::array<std::uint8_t, 32> sent = Sha256(header->substr(sizeof(kBearer) - 1));
  const Digested* found = nullptr;
  for (const Digested& d : table_) {
    // Every entry is compared: the time does not depend on which matched.
    const bool match = CRYPTO_memcmp(sent.data(), d.digest.data(), sent.size()) == 0;
    if (match && found == nullptr) found = &d;
  }
  if (found == nullptr) return Status(StatusCode::kUnauthenticated, "the bearer token is not this server's");
  return found->owner;
}

Status TokenCheck::CheckHeader(const std::optional<std::string>& header) const {
  if (!enabled()) return Status::Ok();
  return Owner(header).status();
}

std::optional<std::string> AuthorizationOf(const grpc::ServerContextBase& ctx) {
  const auto& md = ctx.client_metadata();
  const auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

Status TokenCheck::Check(const grpc::ServerContextBase& ctx) const {
  if (!enabled()) return Status::Ok();
  return CheckHeader(AuthorizationOf(ctx));
}

}  // namespace epd::internal
