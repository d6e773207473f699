// The L3 value format (epd/l3/l3_value.h). Format 1 (no keyring): a round
// trip keeps every field and byte, the header sits at the documented offsets
// with an XXH3-64 checksum computed here independently, and every kind of
// damage is rejected, including a degenerate grid, a grid that disagrees with
// the tokens and non-finite rows (issue 27, fault 3). Format 2 (a keyring)
// follows, below.
#define XXH_INLINE_ALL
#include "epd/l3/l3_value.h"

#include <gtest/gtest.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "epd/media/content_key.h"
#include "l3_test_util.h"

namespace epd {
namespace {

using test_util::Le;
using test_util::SetLe;
ContentKey KeyOf(std::uint8_t seed) { return test_util::TestKey(seed); }

// 6 tokens x 4 hidden, 2 deepstack layers, bf16: main 48 bytes, deepstack 96.
Embedding Sample() {
  Embedding e;
  e.tokens = 6;
  e.hidden = 4;
  e.deepstack_layers = 2;
  e.dtype = DType::kBFloat16;
  e.grid = {1, 4, 6};
  e.main.resize(48);
  e.deepstack.resize(96);
  for (std::size_t i = 0; i < e.main.size(); ++i) e.main[i] = static_cast<std::byte>(i * 7 + 1);
  for (std::size_t i = 0; i < e.deepstack.size(); ++i) e.deepstack[i] = static_cast<std::byte>(255 - i);
  return e;
}

// Recomputes the checksum over a (modified) value, as a writer would.
void Reseal(std::string& v) {
  std::string covered = v.substr(0, 104) + v.substr(112);
  SetLe(v, 104, 8, XXH3_64bits(covered.data(), covered.size()));
}

TEST(L3Value, RoundTripKeepsShapeGridAndBytes) {
  const Embedding e = Sample();
  const std::string v = EncodeL3Value(KeyOf(1), e, kContentKeyVersion);
  ASSERT_EQ(v.size(), 112u + 48u + 96u);
  StatusOr<EmbeddingPtr> back = DecodeL3Value(v, KeyOf(1), kContentKeyVersion);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const Embedding& b = **back;
  EXPECT_EQ(b.shape(), e.shape());
  EXPECT_EQ(b.grid, e.grid);
  EXPECT_EQ(b.main, e.main);
  EXPECT_EQ(b.deepstack, e.deepstack);
  EXPECT_TRUE(b.on_host());
}

TEST(L3Value, HeaderFieldsSitAtTheDocumentedOffsets) {
  const std::string v = EncodeL3Value(KeyOf(2), Sample(), 7);
  EXPECT_EQ(v.substr(0, 4), "EPL3");
  EXPECT_EQ(Le(v, 4, 2), kL3FormatChecksummed);
  EXPECT_EQ(Le(v, 6, 2), 112u);
  EXPECT_EQ(Le(v, 8, 4), 7u);
  EXPECT_EQ(Le(v, 12, 1), 1u);  // bfloat16
  EXPECT_EQ(Le(v, 13, 3), 0u);  // no merge size byte in format 1
  EXPECT_EQ(Le(v, 16, 8), 6u);
  EXPECT_EQ(Le(v, 24, 8), 4u);
  EXPECT_EQ(Le(v, 32, 8), 2u);
  EXPECT_EQ(Le(v, 40, 8), 1u);
  EXPECT_EQ(Le(v, 48, 8), 4u);
  EXPECT_EQ(Le(v, 56, 8), 6u);
  EXPECT_EQ(Le(v, 64, 8), 144u);
  EXPECT_EQ(std::memcmp(v.data() + 72, KeyOf(2).bytes.data(), 32), 0);
  std::string covered = v.substr(0, 104) + v.substr(112);
  EXPECT_EQ(Le(v, 104, 8), XXH3_64bits(covered.data(), covered.size()));
  EXPECT_EQ(static_cast<unsigned char>(v[112]), 1u);  // main[0]
}

void ExpectRejected(const std::string& v, const std::string& why, const ContentKey& key = KeyOf(1)) {
  StatusOr<EmbeddingPtr> r = DecodeL3Value(v, key, kContentKeyVersion);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
}

TEST(L3Value, FlippedPayloadByteFailsTheChecksum) {
  std::string v = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion);
  v[150] ^= 0x01;
  ExpectRejected(v, "checksum");
}

TEST(L3Value, FlippedGridByteFailsTheChecksum) {
  std::string v = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion);
  // Grid (1, 4, 6) -> (1, 2, 12): still 6 tokens, a valid shape; only the
  // checksum notices.
  v[48] ^= 0x06;
  v[56] ^= 0x0a;
  ExpectRejected(v, "checksum");
}

TEST(L3Value, TruncatedValueIsRejected) {
  const std::string v = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion);
  ExpectRejected(v.substr(0, v.size() - 1), "truncated");
  ExpectRejected(v.substr(0, 50), "shorter than");
  ExpectRejected(v + "x", "truncated or padded");
}

TEST(L3Value, OtherFormatOrKeyVersionIsRejected) {
  std::string v = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion);
  std::string f = v;
  SetLe(f, 4, 2, 7);
  Reseal(f);
  ExpectRejected(f, "format version");
  std::string k = v;
  SetLe(k, 8, 4, kContentKeyVersion + 1);
  Reseal(k);
  ExpectRejected(k, "content key version");
}

TEST(L3Value, ValueOfAnotherKeyIsRejected) {
  const std::string v = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion);
  ExpectRejected(v, "another content key", KeyOf(9));
}

TEST(L3Value, BadMagicDtypeOrShapeIsRejected) {
  const std::string v = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion);
  std::string m = v;
  m[0] = 'X';
  ExpectRejected(m, "magic");
  std::string d = v;
  SetLe(d, 12, 1, 9);
  Reseal(d);
  ExpectRejected(d, "dtype");
  std::string s = v;
  SetLe(s, 16, 8, 7);  // 7 tokens, grid (1, 4, 7): the payload no longer matches the shape
  SetLe(s, 56, 8, 7);
  Reseal(s);
  ExpectRejected(s, "the shape needs");
  std::string n = v;
  SetLe(n, 24, 8, static_cast<std::uint64_t>(-4));
  Reseal(n);
  ExpectRejected(n, "out of range");
}

// A value with no rows and no grid (what an empty embedding encodes to) is
// refused: grid (0, 0, 0) is degenerate (it was served before; issue 27).
TEST(L3Value, DegenerateGridIsRejected) {
  Embedding empty;
  empty.hidden = 8;
  ExpectRejected(EncodeL3Value(KeyOf(1), empty, kContentKeyVersion), "degenerate grid (0, 0, 0)");
  for (std::size_t side : {0u, 1u, 2u}) {
    std::string v = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion);
    SetLe(v, 40 + 8 * side, 8, side == 1 ? 0 : static_cast<std::uint64_t>(-2));  // t or w < 0, h == 0
    Reseal(v);
    ExpectRejected(v, "degenerate grid");
  }
}

TEST(L3Value, GridThatDoesNotGiveTheTokensIsRejected) {
  // Sample: 6 tokens, grid (1, 4, 6): 24 patches / 2^2 = 6. Grid (1, 4, 8)
  // gives 8 tokens under merge 2; (1, 2, 12) gives 6 (another shape with the
  // same count: only the request's own probe can tell, see the worker).
  std::string v = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion);
  SetLe(v, 56, 8, 8);
  Reseal(v);
  ExpectRejected(v, "grid (1, 4, 8) with merge size 2 does not give 6 tokens");
  std::string same_count = EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion);
  SetLe(same_count, 48, 8, 2);
  SetLe(same_count, 56, 8, 12);
  Reseal(same_count);
  EXPECT_TRUE(DecodeL3Value(same_count, KeyOf(1), kContentKeyVersion).ok());
  // The reader's merge size decides in format 1: under merge 1 the sample's
  // 24 patches are 24 tokens, not 6.
  L3ValueOptions merge1;
  merge1.merge_size = 1;
  StatusOr<EmbeddingPtr> r =
      DecodeL3Value(EncodeL3Value(KeyOf(1), Sample(), kContentKeyVersion), KeyOf(1), kContentKeyVersion, merge1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("merge size 1 does not give 6 tokens"), std::string::npos);
}

// Element `index` of the value's rows (main then deepstack) set to `bits`
// (an element of the value's dtype), checksum recomputed.
std::string WithElement(const Embedding& e, std::size_t index, std::uint64_t bits) {
  std::string v = EncodeL3Value(KeyOf(1), e, kContentKeyVersion);
  SetLe(v, 112 + index * DTypeSize(e.dtype), DTypeSize(e.dtype), bits);
  Reseal(v);
  return v;
}

Embedding SampleOf(DType d) {
  Embedding e = Sample();
  e.dtype = d;
  e.main.assign(e.main_bytes(), std::byte{0});
  e.deepstack.assign(e.deepstack_bytes(), std::byte{0});
  return e;
}

TEST(L3Value, NonFiniteRowsAreRejectedInEveryDtype) {
  struct Case {
    DType dtype;
    std::uint64_t nan, inf, neg_inf, max_finite, smallest_denormal;
  };
  // IEEE 754 binary32 and binary16 bit patterns; bfloat16 is binary32's top
  // half.
  const Case cases[] = {{DType::kFloat32, 0x7fc00000, 0x7f800000, 0xff800000, 0x7f7fffff, 0x00000001},
                        {DType::kBFloat16, 0x7fc0, 0x7f80, 0xff80, 0x7f7f, 0x0001},
                        {DType::kFloat16, 0x7e00, 0x7c00, 0xfc00, 0x7bff, 0x0001}};
  for (const Case& c : cases) {
    const Embedding e = SampleOf(c.dtype);
    const std::size_t elements = e.ExpectedBytes() / DTypeSize(c.dtype);
    const std::size_t main_elements = e.main_bytes() / DTypeSize(c.dtype);
    // In the first and last main element and the last deepstack element.
    for (std::size_t at : {std::size_t{0}, main_elements - 1, elements - 1}) {
      for (std::uint64_t bad : {c.nan, c.inf, c.neg_inf}) {
        SCOPED_TRACE(DTypeName(c.dtype));
        ExpectRejected(WithElement(e, at, bad), "non-finite");
      }
      // The largest finite value and a denormal are not flagged.
      EXPECT_TRUE(DecodeL3Value(WithElement(e, at, c.max_finite), KeyOf(1), kContentKeyVersion).ok());
      EXPECT_TRUE(DecodeL3Value(WithElement(e, at, c.smallest_denormal), KeyOf(1), kContentKeyVersion).ok());
    }
  }
}

// Rows larger than one scan block (16 KiB) and a main/deepstack boundary
// that is not a multiple of it: every byte still comes back, and a NaN in
// the last element is still found.
TEST(L3Value, LargeValueRoundTripsAcrossScanBlocks) {
  Embedding e;
  e.tokens = 300;
  e.hidden = 37;
  e.deepstack_layers = 3;
  e.grid = {1, 20, 60};
  e.main.resize(e.main_bytes());
  e.deepstack.resize(e.deepstack_bytes());
  for (std::size_t i = 0; i < e.main.size(); ++i) e.main[i] = static_cast<std::byte>((i * 13) % 61);
  for (std::size_t i = 0; i < e.deepstack.size(); ++i) e.deepstack[i] = static_cast<std::byte>((i * 7) % 59);
  StatusOr<EmbeddingPtr> back =
      DecodeL3Value(EncodeL3Value(KeyOf(1), e, kContentKeyVersion), KeyOf(1), kContentKeyVersion);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)->main, e.main);
  EXPECT_EQ((*back)->deepstack, e.deepstack);
  ExpectRejected(WithElement(e, e.ExpectedBytes() / 4 - 1, 0x7fc00000), "non-finite");
}

// ---- Format 2 (a keyring): the header sits at the documented offsets and
// its tag is the GMAC computed here with another OpenSSL interface (EVP_MAC
// "GMAC", under a subkey derived with the one-shot HMAC()), a keyed reader
// refuses what does not authenticate (format 1 with a correct checksum
// included) as kUnauthenticated, an authentic value with a bad shape as
// kDataLoss, and a rotation accepts the previous key while the file names it
// and refuses it after.

using test_util::TestKeyring;

L3ValueOptions Keyed(std::shared_ptr<const L3Keyring> ring) {
  L3ValueOptions o;
  o.keyring = std::move(ring);
  return o;
}

// 4 tokens x 3 hidden float32, 1 deepstack layer, grid (1, 2, 8).
Embedding KeyedSample() {
  Embedding e;
  e.tokens = 4;
  e.hidden = 3;
  e.deepstack_layers = 1;
  e.grid = {1, 2, 8};
  for (int i = 0; i < 12; ++i) {
    const float m = 0.5f * static_cast<float>(i) - 2, d = -1.25f * static_cast<float>(i);
    const auto* pm = reinterpret_cast<const std::byte*>(&m);
    const auto* pd = reinterpret_cast<const std::byte*>(&d);
    e.main.insert(e.main.end(), pm, pm + 4);
    e.deepstack.insert(e.deepstack.end(), pd, pd + 4);
  }
  return e;
}

// The value subkey of `seed`'s secret, and the GMAC of a format 2 value
// under it, through interfaces the code under test does not use.
std::string IndependentTag(const std::string& v, std::uint8_t seed) {
  L3Secret secret;
  secret.fill(seed);
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
void ResealTag(std::string& v, std::uint8_t seed) {
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
  const L3ValueOptions o = Keyed(TestKeyring(7, 1));
  const Embedding e = KeyedSample();
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
  const std::string forged = EncodeL3Value(KeyOf(1), KeyedSample(), kContentKeyVersion);
  ASSERT_TRUE(DecodeL3Value(forged, KeyOf(1), kContentKeyVersion).ok());  // its checksum is right
  std::string covered = forged.substr(0, 104) + forged.substr(112);
  ASSERT_EQ(Le(forged, 104, 8), XXH3_64bits(covered.data(), covered.size()));
  ExpectRefused(forged, Keyed(TestKeyring(7, 1)), StatusCode::kUnauthenticated, "format 1 carries no MAC");
}

TEST(L3ValueKeyed, AlteredOrForeignValuesAreUnauthenticated) {
  const L3ValueOptions o = Keyed(TestKeyring(7, 1));
  const std::string v = EncodeL3Value(KeyOf(1), KeyedSample(), kContentKeyVersion, o);
  std::string row = v;
  row[150] ^= 0x01;  // a payload byte: still finite, still the right shape
  ExpectRefused(row, o, StatusCode::kUnauthenticated, "tag mismatch");
  std::string grid = v;
  SetLe(grid, 48, 8, 4);  // grid (1, 4, 8): 8 tokens, a bad header too
  ExpectRefused(grid, o, StatusCode::kUnauthenticated, "tag mismatch");
  std::string tag = v;
  tag[130] = static_cast<char>(tag[130] ^ 0x80);
  ExpectRefused(tag, o, StatusCode::kUnauthenticated, "tag mismatch");
  // The same id with another secret (another cluster), and an unknown id.
  ExpectRefused(v, Keyed(TestKeyring(7, 2)), StatusCode::kUnauthenticated, "tag mismatch");
  ExpectRefused(v, Keyed(TestKeyring(8, 1)), StatusCode::kUnauthenticated, "key id 7, which this server does not hold");
  ExpectRefused(v.substr(0, 100), o, StatusCode::kUnauthenticated, "shorter than any header");
  // A valid value of another content key, renamed: its key is in the tag.
  ExpectRefused(v, o, StatusCode::kDataLoss, "another content key", KeyOf(2));
  std::string renamed = v;
  std::memcpy(renamed.data() + 72, KeyOf(2).bytes.data(), 32);
  ExpectRefused(renamed, o, StatusCode::kUnauthenticated, "tag mismatch", KeyOf(2));
}

TEST(L3ValueKeyed, KeyedValueIsCorruptToAReaderWithoutTheKey) {
  const std::string v = EncodeL3Value(KeyOf(1), KeyedSample(), kContentKeyVersion, Keyed(TestKeyring(7, 1)));
  ExpectRefused(v, {}, StatusCode::kDataLoss, "format 2 (MAC under key id 7)");
}

// A key holder that writes a bad value (another build's bug, a mismatched
// configuration): authentic, so kDataLoss, never served.
TEST(L3ValueKeyed, AuthenticValueWithABadShapeOrRowsIsDataLoss) {
  const L3ValueOptions o = Keyed(TestKeyring(7, 1));
  Embedding zero = KeyedSample();
  zero.grid = {0, 0, 0};
  ExpectRefused(EncodeL3Value(KeyOf(1), zero, kContentKeyVersion, o), o, StatusCode::kDataLoss,
                "degenerate grid (0, 0, 0)");
  std::string nan = EncodeL3Value(KeyOf(1), KeyedSample(), kContentKeyVersion, o);
  SetLe(nan, 136 + 4 * 13, 4, 0x7fc00000);  // deepstack element 1
  ResealTag(nan, 1);
  ExpectRefused(nan, o, StatusCode::kDataLoss, "non-finite");
  // Written by a tower of merge size 4 (its grid happens to agree under 2).
  L3ValueOptions merge4 = o;
  merge4.merge_size = 4;
  ExpectRefused(EncodeL3Value(KeyOf(1), KeyedSample(), kContentKeyVersion, merge4), o, StatusCode::kDataLoss,
                "merge size 4, this server's tower merges 2");
}

// Rotation: deploy {current new, previous old}, then {current new}.
TEST(L3ValueKeyed, PreviousKeyIsAcceptedDuringARotationAndRefusedAfter) {
  const L3ValueOptions before = Keyed(TestKeyring(1, 1));
  const L3ValueOptions during = Keyed(TestKeyring(2, 2, std::make_pair(1u, std::uint8_t{1})));
  const L3ValueOptions after = Keyed(TestKeyring(2, 2));
  const std::string old_value = EncodeL3Value(KeyOf(1), KeyedSample(), kContentKeyVersion, before);
  EXPECT_TRUE(DecodeL3Value(old_value, KeyOf(1), kContentKeyVersion, during).ok());
  ExpectRefused(old_value, after, StatusCode::kUnauthenticated, "key id 1, which this server does not hold");
  // During the rotation values are written under the new key, which a server
  // still on the old file cannot check, and a server on the final file can.
  const std::string new_value = EncodeL3Value(KeyOf(1), KeyedSample(), kContentKeyVersion, during);
  EXPECT_EQ(Le(new_value, 104, 4), 2u);
  EXPECT_EQ(new_value.substr(120, 16), IndependentTag(new_value, 2));
  EXPECT_TRUE(DecodeL3Value(new_value, KeyOf(1), kContentKeyVersion, after).ok());
  ExpectRefused(new_value, before, StatusCode::kUnauthenticated, "key id 2, which this server does not hold");
}

// ---- The optional encode cost (issue 26): a value written with a measured
// cost carries it in 8 more header bytes, under the checksum or the tag (both
// computed here independently); a value without one is byte for byte the
// format the builds before the field wrote, and reads back as unmeasured; a
// tampered cost is refused like any tampered byte.

std::uint64_t Bits(double x) {
  std::uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

TEST(L3ValueCost, ChecksummedValueCarriesTheCostUnderItsChecksum) {
  const Embedding e = Sample();
  const std::string plain = EncodeL3Value(KeyOf(40), e, kContentKeyVersion);
  ASSERT_EQ(plain.size(), 112u + 144u);  // the format before the field
  EXPECT_EQ(Le(plain, 6, 2), 112u);
  double cost = 0;
  ASSERT_TRUE(DecodeL3Value(plain, KeyOf(40), kContentKeyVersion, {}, &cost).ok());
  EXPECT_EQ(cost, kL3Unmeasured);

  const std::string v = EncodeL3Value(KeyOf(40), e, kContentKeyVersion, {}, 0.0375);
  ASSERT_EQ(v.size(), 120u + 144u);
  EXPECT_EQ(Le(v, 6, 2), 120u);
  EXPECT_EQ(Le(v, 112, 8), Bits(0.0375));
  EXPECT_EQ(static_cast<unsigned char>(v[120]), 1u);  // main[0]
  const std::string covered = v.substr(0, 104) + v.substr(112);
  EXPECT_EQ(Le(v, 104, 8), XXH3_64bits(covered.data(), covered.size()));
  StatusOr<EmbeddingPtr> back = DecodeL3Value(v, KeyOf(40), kContentKeyVersion, {}, &cost);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(cost, 0.0375);
  EXPECT_EQ((*back)->main, e.main);
  EXPECT_EQ((*back)->deepstack, e.deepstack);

  // A cost not measured writes no field.
  EXPECT_EQ(EncodeL3Value(KeyOf(40), e, kContentKeyVersion, {}, kL3Unmeasured), plain);
  EXPECT_EQ(EncodeL3Value(KeyOf(40), e, kContentKeyVersion, {}, std::nan("")).size(), plain.size());

  std::string flipped = v;
  flipped[113] ^= 0x10;
  ExpectRejected(flipped, "checksum mismatch", KeyOf(40));
  std::string negative = v;
  SetLe(negative, 112, 8, Bits(-2.0));
  Reseal(negative);
  ExpectRejected(negative, "encode cost -2", KeyOf(40));
  std::string other_size = v;
  SetLe(other_size, 6, 2, 128);
  ExpectRejected(other_size, "header of 128 bytes, expected 112 or 120", KeyOf(40));
}

TEST(L3ValueCost, AuthenticatedValueCarriesTheCostUnderItsTag) {
  const L3ValueOptions o = Keyed(TestKeyring(7, 1));
  const Embedding e = KeyedSample();
  const std::string plain = EncodeL3Value(KeyOf(1), e, kContentKeyVersion, o);
  EXPECT_EQ(Le(plain, 6, 2), 136u);
  double cost = 0;
  ASSERT_TRUE(DecodeL3Value(plain, KeyOf(1), kContentKeyVersion, o, &cost).ok());
  EXPECT_EQ(cost, kL3Unmeasured);

  const std::string v = EncodeL3Value(KeyOf(1), e, kContentKeyVersion, o, 1.5);
  ASSERT_EQ(v.size(), 144u + 96u);
  EXPECT_EQ(Le(v, 6, 2), 144u);
  EXPECT_EQ(Le(v, 136, 8), Bits(1.5));
  EXPECT_EQ(v.substr(120, 16), IndependentTag(v, 1));
  EXPECT_EQ(std::memcmp(v.data() + 144, e.main.data(), 48), 0);
  StatusOr<EmbeddingPtr> back = DecodeL3Value(v, KeyOf(1), kContentKeyVersion, o, &cost);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(cost, 1.5);
  EXPECT_EQ((*back)->deepstack, e.deepstack);

  // Whoever can write to Redis but holds no key cannot change the cost.
  std::string cheaper = v;
  SetLe(cheaper, 136, 8, Bits(1e-9));
  ExpectRefused(cheaper, o, StatusCode::kUnauthenticated, "tag mismatch");
  // A key holder that writes a bad cost wrote a bad value.
  SetLe(cheaper, 136, 8, Bits(std::numeric_limits<double>::infinity()));
  ResealTag(cheaper, 1);
  ExpectRefused(cheaper, o, StatusCode::kDataLoss, "encode cost inf");
}

}  // namespace
}  // namespace epd
