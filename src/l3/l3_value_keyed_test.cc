// The L3 value format 2 (epd/l3/l3_value.h, a keyring): the header sits at
// the documented offsets and its tag is the GMAC computed here with another
// OpenSSL interface (EVP_MAC "GMAC", under a subkey derived with the one-shot
// HMAC()), a keyed reader refuses what does not authenticate (format 1 with
// a correct checksum included) as kUnauthenticated, an authentic value with
// a bad shape as kDataLoss, and a rotation accepts the previous key while the
// file names it and refuses it after.
#define XXH_INLINE_ALL
#include <gtest/gtest.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <xxhash.h>

#include <cstring>

#include "epd/l3/l3_value.h"
#include "epd/media/content_key.h"

namespace epd {
namespace {

ContentKey KeyOf(std::uint8_t seed) {
  ContentKey k;
  for (std::size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<std::uint8_t>(seed * 29 + i);
  return k;
}

L3Secret SecretOf(std::uint8_t seed) {
  L3Secret s;
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<std::uint8_t>(seed + 3 * i);
  return s;
}

std::shared_ptr<const L3Keyring> Ring(std::uint32_t id, std::uint8_t seed,
                                      std::optional<std::pair<std::uint32_t, std::uint8_t>> previous = {}) {
  std::optional<std::pair<std::uint32_t, L3Secret>> p;
  if (previous) p = std::make_pair(previous->first, SecretOf(previous->second));
  StatusOr<std::shared_ptr<const L3Keyring>> r = L3Keyring::FromSecrets(id, SecretOf(seed), p);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return *r;
}

L3ValueOptions Keyed(std::shared_ptr<const L3Keyring> ring) {
  L3ValueOptions o;
  o.keyring = std::move(ring);
  return o;
}

// 4 tokens x 3 hidden float32, 1 deepstack layer, grid (1, 2, 8).
Embedding Sample() {
  Embedding e;
  e.tokens = 4;
  e.hidden = 3;
  e.deepstack_layers = 1;
  e.grid = {1, 2, 8};
  for (int i = 0; i < 12; ++i) {
    const float m = 0.5f * i - 2, d = -1.25f * i;
    const auto* pm = reinterpret_cast<const std::byte*>(&m);
    const auto* pd = reinterpret_cast<const std::byte*>(&d);
    e.main.insert(e.main.end(), pm, pm + 4);
    e.deepstack.insert(e.deepstack.end(), pd, pd + 4);
  }
  return e;
}

std::uint64_t Le(const std::string& v, std::size_t off, std::size_t n) {
  std::uint64_t x = 0;
  for (std::size_t i = 0; i < n; ++i) x |= std::uint64_t{static_cast<unsigned char>(v[off + i])} << (8 * i);
  return x;
}

void SetLe(std::string& v, std::size_t off, std::size_t n, std::uint64_t x) {
  for (std::size_t i = 0; i < n; ++i) v[off + i] = static_cast<char>((x >> (8 * i)) & 0xff);
}

// The value subkey of `seed`'s secret, and the GMAC of a format 2 value
// under it, through interfaces the code under test does not use.
std::string IndependentTag(const std::string& v, std::uint8_t seed) {
  const L3Secret secret = SecretOf(seed);
  const char label[] = "epd-l3 value gmac v1";
  unsigned char key[32];
  unsigned int key_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(label),
       std::strlen(label), key, &key_len);
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "GMAC", nullptr);
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  char cipher[] = "AES-256-GCM";
  std::string iv = v.substr(108, 12);
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_CIPHER, cipher, 0),
                               OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_IV, iv.data(), iv.size()),
                               OSSL_PARAM_construct_end()};
  EXPECT_EQ(EVP_MAC_init(ctx, key, key_len, params), 1);
  const std::string covered = v.substr(0, 120) + v.substr(136);
  EXPECT_EQ(EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(covered.data()), covered.size()), 1);
  unsigned char tag[16];
  std::size_t tag_len = 0;
  EXPECT_EQ(EVP_MAC_final(ctx, tag, &tag_len, sizeof(tag)), 1);
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  return std::string(reinterpret_cast<const char*>(tag), tag_len);
}

// Recomputes the tag of a (modified) format 2 value, as a key holder would.
void Reseal(std::string& v, std::uint8_t seed) {
  const std::string tag = IndependentTag(v, seed);
  v.replace(120, 16, tag);
}

void ExpectRefused(const std::string& v, const L3ValueOptions& o, StatusCode code, const std::string& why,
                   const ContentKey& key = KeyOf(1)) {
  StatusOr<EmbeddingPtr> r = DecodeL3Value(v, key, kContentKeyVersion, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
}

TEST(L3ValueKeyed, HeaderAndTagAreTheDocumentedOnes) {
  const L3ValueOptions o = Keyed(Ring(7, 1));
  const Embedding e = Sample();
  const std::string v = EncodeL3Value(KeyOf(1), e, kContentKeyVersion, o);
  ASSERT_EQ(v.size(), 136u + 48u + 48u);
  EXPECT_EQ(v.substr(0, 4), "EPL3");
  EXPECT_EQ(Le(v, 4, 2), 2u);
  EXPECT_EQ(Le(v, 6, 2), 136u);
  EXPECT_EQ(Le(v, 8, 4), kContentKeyVersion);
  EXPECT_EQ(Le(v, 12, 1), 0u);  // float32
  EXPECT_EQ(Le(v, 13, 1), 2u);  // merge size
  EXPECT_EQ(Le(v, 14, 2), 0u);
  EXPECT_EQ(Le(v, 16, 8), 4u);
  EXPECT_EQ(Le(v, 56, 8), 8u);  // grid w
  EXPECT_EQ(Le(v, 64, 8), 96u);
  EXPECT_EQ(std::memcmp(v.data() + 72, KeyOf(1).bytes.data(), 32), 0);
  EXPECT_EQ(Le(v, 104, 4), 7u);  // key id
  EXPECT_EQ(v.substr(120, 16), IndependentTag(v, 1));
  EXPECT_EQ(std::memcmp(v.data() + 136, e.main.data(), 48), 0);
  EXPECT_EQ(std::memcmp(v.data() + 184, e.deepstack.data(), 48), 0);
  // A fresh IV per value: two encodes of the same rows differ in IV and tag.
  const std::string again = EncodeL3Value(KeyOf(1), e, kContentKeyVersion, o);
  EXPECT_NE(v.substr(108, 28), again.substr(108, 28));
  EXPECT_EQ(again.substr(120, 16), IndependentTag(again, 1));

  StatusOr<EmbeddingPtr> back = DecodeL3Value(v, KeyOf(1), kContentKeyVersion, o);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)->shape(), e.shape());
  EXPECT_EQ((*back)->grid, e.grid);
  EXPECT_EQ((*back)->main, e.main);
  EXPECT_EQ((*back)->deepstack, e.deepstack);
}

// What a Redis writer without the key can do: write a format 1 value with a
// correct checksum (it was served as a hit before the MAC).
TEST(L3ValueKeyed, ChecksummedValueIsRefusedByAKeyedReader) {
  const std::string forged = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion);
  ASSERT_TRUE(DecodeL3Value(forged, KeyOf(1), kContentKeyVersion).ok());  // its checksum is right
  std::string covered = forged.substr(0, 104) + forged.substr(112);
  ASSERT_EQ(Le(forged, 104, 8), XXH3_64bits(covered.data(), covered.size()));
  ExpectRefused(forged, Keyed(Ring(7, 1)), StatusCode::kUnauthenticated, "format 1 carries no MAC");
}

TEST(L3ValueKeyed, AlteredOrForeignValuesAreUnauthenticated) {
  const L3ValueOptions o = Keyed(Ring(7, 1));
  const std::string v = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion, o);
  std::string row = v;
  row[150] ^= 0x01;  // a payload byte: still finite, still the right shape
  ExpectRefused(row, o, StatusCode::kUnauthenticated, "tag mismatch");
  std::string grid = v;
  SetLe(grid, 48, 8, 4);  // grid (1, 4, 8): 8 tokens, a bad header too
  ExpectRefused(grid, o, StatusCode::kUnauthenticated, "tag mismatch");
  std::string tag = v;
  tag[130] ^= 0x80;
  ExpectRefused(tag, o, StatusCode::kUnauthenticated, "tag mismatch");
  // The same id with another secret (another cluster), and an unknown id.
  ExpectRefused(v, Keyed(Ring(7, 2)), StatusCode::kUnauthenticated, "tag mismatch");
  ExpectRefused(v, Keyed(Ring(8, 1)), StatusCode::kUnauthenticated, "key id 7, which this server does not hold");
  ExpectRefused(v.substr(0, 100), o, StatusCode::kUnauthenticated, "shorter than any header");
  // A valid value of another content key, renamed: its key is in the tag.
  ExpectRefused(v, o, StatusCode::kDataLoss, "another content key", KeyOf(2));
  std::string renamed = v;
  std::memcpy(renamed.data() + 72, KeyOf(2).bytes.data(), 32);
  ExpectRefused(renamed, o, StatusCode::kUnauthenticated, "tag mismatch", KeyOf(2));
}

TEST(L3ValueKeyed, KeyedValueIsCorruptToAReaderWithoutTheKey) {
  const std::string v = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion, Keyed(Ring(7, 1)));
  ExpectRefused(v, {}, StatusCode::kDataLoss, "format 2 (MAC under key id 7)");
}

// A key holder that writes a bad value (another build's bug, a mismatched
// configuration): authentic, so kDataLoss, never served.
TEST(L3ValueKeyed, AuthenticValueWithABadShapeOrRowsIsDataLoss) {
  const L3ValueOptions o = Keyed(Ring(7, 1));
  Embedding zero = Sample();
  zero.grid = {0, 0, 0};
  ExpectRefused(EncodeL3Value(KeyOf(1), zero, kContentKeyVersion, o), o, StatusCode::kDataLoss,
                "degenerate grid (0, 0, 0)");
  std::string nan = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion, o);
  SetLe(nan, 136 + 4 * 13, 4, 0x7fc00000);  // deepstack element 1
  Reseal(nan, 1);
  ExpectRefused(nan, o, StatusCode::kDataLoss, "non-finite");
  // Written by a tower of merge size 4 (its grid happens to agree under 2).
  L3ValueOptions merge4 = o;
  merge4.merge_size = 4;
  ExpectRefused(EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion, merge4), o, StatusCode::kDataLoss,
                "merge size 4, this server's tower merges 2");
}

// Rotation: deploy {current new, previous old}, then {current new}.
TEST(L3ValueKeyed, PreviousKeyIsAcceptedDuringARotationAndRefusedAfter) {
  const L3ValueOptions before = Keyed(Ring(1, 1));
  const L3ValueOptions during = Keyed(Ring(2, 2, std::make_pair(1u, std::uint8_t{1})));
  const L3ValueOptions after = Keyed(Ring(2, 2));
  const std::string old_value = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion, before);
  EXPECT_TRUE(DecodeL3Value(old_value, KeyOf(1), kContentKeyVersion, during).ok());
  ExpectRefused(old_value, after, StatusCode::kUnauthenticated, "key id 1, which this server does not hold");
  // During the rotation values are written under the new key, which a server
  // still on the old file cannot check, and a server on the final file can.
  const std::string new_value = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion, during);
  EXPECT_EQ(Le(new_value, 104, 4), 2u);
  EXPECT_EQ(new_value.substr(120, 16), IndependentTag(new_value, 2));
  EXPECT_TRUE(DecodeL3Value(new_value, KeyOf(1), kContentKeyVersion, after).ok());
  ExpectRefused(new_value, before, StatusCode::kUnauthenticated, "key id 2, which this server does not hold");
}

}  // namespace
}  // namespace epd
