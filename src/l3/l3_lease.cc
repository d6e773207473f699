// Lease values (epd/l3/l3_lease.h).
#include "epd/l3/l3_lease.h"

#include <array>
#include <charconv>
#include <cstring>

#include "l3_hex.h"

namespace epd {
namespace {

constexpr std::string_view kPrefix = "EPLL1";
constexpr char kDomain[] = "epd-l3 lease v1";  // with its NUL: sizeof includes it
using Nonce = std::array<std::uint8_t, 16>;

template <typename T>
bool Number(std::string_view s, T* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

void PutLe(std::uint64_t v, std::size_t n, std::uint8_t* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>((v >> (8 * i)) & 0xff);
}

StatusOr<HmacSha256::Tag> LeaseTag(const L3Key& k, const ContentKey& key, std::int64_t expiry, const Nonce& nonce,
                                   std::string_view owner) {
  std::uint8_t fixed[4 + 8];
  PutLe(k.id, 4, fixed);
  PutLe(static_cast<std::uint64_t>(expiry), 8, fixed + 4);
  HmacSha256 mac(k.lease_key);
  mac.Update(kDomain, sizeof(kDomain));
  mac.Update(fixed, 4);
  mac.Update(key.bytes.data(), key.bytes.size());
  mac.Update(fixed + 4, 8);
  mac.Update(nonce.data(), nonce.size());
  mac.Update(owner.data(), owner.size());
  return mac.Final();
}

// The next space-separated word of `rest`, which is advanced past it.
std::string_view NextWord(std::string_view& rest) {
  const std::size_t sp = rest.find(' ');
  std::string_view w = rest.substr(0, sp);
  rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
  return w;
}

Status Forged(const std::string& why) {
  return Status(StatusCode::kUnauthenticated, "L3 lease not authenticated: " + why);
}

}  // namespace

StatusOr<std::string> MakeLeaseValue(const L3Keyring* ring, const ContentKey& key, std::string_view owner,
                                     std::int64_t expiry_unix_ms) {
  if (ring == nullptr) return std::string(owner);
  Nonce nonce;
  if (Status s = RandomBytes(nonce); !s.ok()) return s;
  const L3Key& k = ring->current();
  StatusOr<HmacSha256::Tag> tag = LeaseTag(k, key, expiry_unix_ms, nonce, owner);
  if (!tag.ok()) return tag.status();
  std::string out(kPrefix);
  out += ' ' + std::to_string(k.id) + ' ' + std::to_string(expiry_unix_ms) + ' ' +
         internal::HexOf(nonce.data(), nonce.size()) + ' ' + internal::HexOf(tag->data(), tag->size()) + ' ';
  out += owner;
  return out;
}

StatusOr<std::string> LeaseOwner(const L3Keyring* ring, const ContentKey& key, std::string_view value,
                                 std::int64_t now_unix_ms, std::int64_t clock_slack_ms) {
  if (ring == nullptr) return std::string(value);
  std::string_view rest = value;
  std::uint32_t id = 0;
  std::int64_t expiry = 0;
  Nonce nonce;
  HmacSha256::Tag stored;
  if (NextWord(rest) != kPrefix || !Number(NextWord(rest), &id) || !Number(NextWord(rest), &expiry) ||
      !internal::ParseHex(NextWord(rest), nonce.data(), nonce.size()) ||
      !internal::ParseHex(NextWord(rest), stored.data(), stored.size())) {
    return Forged("not an authenticated lease (expected 'EPLL1 <key id> <expiry> <nonce> <tag> <owner>')");
  }
  const L3Key* k = ring->Find(id);
  if (k == nullptr) return Forged("under key id " + std::to_string(id) + ", which this server does not hold");
  StatusOr<HmacSha256::Tag> tag = LeaseTag(*k, key, expiry, nonce, rest);
  if (!tag.ok()) return tag.status();
  if (!TagsEqual(tag->data(), stored.data(), stored.size())) {
    return Forged("tag mismatch (forged, altered, or copied from another key)");
  }
  if (expiry < now_unix_ms - clock_slack_ms) {
    return Forged("expired " + std::to_string(now_unix_ms - expiry) + " ms ago by this server's clock (replayed)");
  }
  return std::string(rest);
}

}  // namespace epd
