// Lease values (epd/l3/l3_lease.h): without a keyring the owner id as
// before; with one, a lease names its owner only while its tag holds over
// owner, content key, expiry and nonce, so a bare owner id, a lease copied to
// another key, an altered owner or expiry, a lease under an unknown key and a
// lease replayed after its expiry are all refused. The tag is checked here
// against HMAC-SHA256 computed with OpenSSL's one-shot HMAC().
#include "epd/l3/l3_lease.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>

#include "l3_hex.h"
#include "l3_test_util.h"

namespace epd {
namespace {

constexpr std::int64_t kNow = 1'790'000'000'000;  // Unix ms

ContentKey KeyOf(std::uint8_t seed) { return test_util::TestKey(seed); }
using test_util::TestKeyring;

std::string Lease(const L3Keyring& ring, const ContentKey& key, const std::string& owner, std::int64_t expiry) {
  StatusOr<std::string> v = MakeLeaseValue(&ring, key, owner, expiry);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return *v;
}

void ExpectForged(const L3Keyring& ring, const ContentKey& key, const std::string& value, const std::string& why) {
  StatusOr<std::string> r = LeaseOwner(&ring, key, value, kNow);
  ASSERT_FALSE(r.ok()) << value;
  EXPECT_EQ(r.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
}

TEST(L3Lease, WithoutAKeyringTheValueIsTheOwnerId) {
  StatusOr<std::string> v = MakeLeaseValue(nullptr, KeyOf(1), "host:42:abc", kNow);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "host:42:abc");
  EXPECT_EQ(*LeaseOwner(nullptr, KeyOf(1), "anything at all", kNow), "anything at all");
}

TEST(L3Lease, AuthenticLeaseNamesItsOwnerAndItsTagIsTheDocumentedHmac) {
  auto ring = TestKeyring(3, 0x5a);
  const std::string owner = "host a:17:0011 with spaces";
  const std::string v = Lease(*ring, KeyOf(1), owner, kNow + 10000);
  EXPECT_EQ(*LeaseOwner(ring.get(), KeyOf(1), v, kNow), owner);
  // "EPLL1 3 <expiry> <nonce> <tag> <owner>"
  const std::string head = "EPLL1 3 " + std::to_string(kNow + 10000) + " ";
  ASSERT_EQ(v.rfind(head, 0), 0u) << v;
  const std::string nonce_hex = v.substr(head.size(), 32), tag_hex = v.substr(head.size() + 33, 64);
  EXPECT_EQ(v.substr(head.size() + 32 + 1 + 64 + 1), owner);
  std::uint8_t nonce[16];
  ASSERT_TRUE(internal::ParseHex(nonce_hex, nonce, 16));
  std::string msg("epd-l3 lease v1\0", 16);  // with its NUL
  const std::uint32_t id = 3;
  const std::uint64_t expiry = kNow + 10000;
  for (int i = 0; i < 4; ++i) msg += static_cast<char>((id >> (8 * i)) & 0xff);
  msg.append(reinterpret_cast<const char*>(KeyOf(1).bytes.data()), 32);
  for (int i = 0; i < 8; ++i) msg += static_cast<char>((expiry >> (8 * i)) & 0xff);
  msg.append(reinterpret_cast<const char*>(nonce), 16);
  msg += owner;
  unsigned char tag[32];
  unsigned int n = 0;
  HMAC(EVP_sha256(), ring->current().lease_key.data(), 32, reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), tag, &n);
  EXPECT_EQ(tag_hex, internal::HexOf(tag, 32));
  // Two leases of one owner on one key differ (fresh nonce).
  EXPECT_NE(Lease(*ring, KeyOf(1), owner, kNow + 10000), v);
}

TEST(L3Lease, ForgedCopiedAlteredOrReplayedLeasesAreRefused) {
  auto ring = TestKeyring(3, 0x5a);
  const std::string v = Lease(*ring, KeyOf(1), "server-a", kNow + 10000);
  ExpectForged(*ring, KeyOf(1), "server-a", "not an authenticated lease");  // a bare owner id
  ExpectForged(*ring, KeyOf(1), "", "not an authenticated lease");
  ExpectForged(*ring, KeyOf(2), v, "tag mismatch");  // copied to another key
  std::string altered_owner = v;
  altered_owner.back() = 'b';
  ExpectForged(*ring, KeyOf(1), altered_owner, "tag mismatch");
  const std::string later = std::to_string(kNow + 99999);
  std::string altered_expiry = v;
  altered_expiry.replace(8, later.size(), later);
  ExpectForged(*ring, KeyOf(1), altered_expiry, "tag mismatch");
  ExpectForged(*TestKeyring(3, 0x11), KeyOf(1), v, "tag mismatch");  // another cluster's key
  ExpectForged(*TestKeyring(4, 0x5a), KeyOf(1), v, "key id 3, which this server does not hold");
  // Replayed: its expiry is more than the slack (2 s) in the past.
  const std::string old = Lease(*ring, KeyOf(1), "server-a", kNow - 2001);
  ExpectForged(*ring, KeyOf(1), old, "expired 2001 ms ago");
  EXPECT_TRUE(LeaseOwner(ring.get(), KeyOf(1), Lease(*ring, KeyOf(1), "a", kNow - 2000), kNow).ok());
}

TEST(L3Lease, PreviousKeyIsAcceptedDuringARotation) {
  const std::string old = Lease(*TestKeyring(1, 0x01), KeyOf(1), "server-a", kNow + 5000);
  EXPECT_EQ(*LeaseOwner(TestKeyring(2, 0x02, std::make_pair(1u, std::uint8_t{0x01})).get(), KeyOf(1), old, kNow),
            "server-a");
  ExpectForged(*TestKeyring(2, 0x02), KeyOf(1), old, "key id 1, which this server does not hold");
}

}  // namespace
}  // namespace epd
