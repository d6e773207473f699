// The L3 value format (epd/l3/l3_value.h): a round trip keeps every field and
// byte, the header sits at the documented offsets with an XXH3-64 checksum
// computed here independently, and every kind of damage is rejected.
#define XXH_INLINE_ALL
#include "epd/l3/l3_value.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>

#include "epd/media/content_key.h"

namespace epd {
namespace {

ContentKey KeyOf(std::uint8_t seed) {
  ContentKey k;
  for (std::size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<std::uint8_t>(seed * 31 + i);
  return k;
}

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

std::uint64_t Le(const std::string& v, std::size_t off, std::size_t n) {
  std::uint64_t x = 0;
  for (std::size_t i = 0; i < n; ++i) x |= std::uint64_t{static_cast<unsigned char>(v[off + i])} << (8 * i);
  return x;
}

void SetLe(std::string& v, std::size_t off, std::size_t n, std::uint64_t x) {
  for (std::size_t i = 0; i < n; ++i) v[off + i] = static_cast<char>((x >> (8 * i)) & 0xff);
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
  EXPECT_EQ(Le(v, 4, 2), kL3FormatVersion);
  EXPECT_EQ(Le(v, 6, 2), 112u);
  EXPECT_EQ(Le(v, 8, 4), 7u);
  EXPECT_EQ(Le(v, 12, 1), 1u);  // bfloat16
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

TEST(L3Value, EmptyEmbeddingRoundTrips) {
  Embedding e;
  e.hidden = 8;
  const std::string v = EncodeL3Value(KeyOf(3), e, kContentKeyVersion);
  StatusOr<EmbeddingPtr> back = DecodeL3Value(v, KeyOf(3), kContentKeyVersion);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ((*back)->tokens, 0);
  EXPECT_EQ((*back)->hidden, 8);
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
  v[48] ^= 0x02;  // grid h: still a valid shape, only the checksum notices
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
  SetLe(f, 4, 2, kL3FormatVersion + 1);
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
  SetLe(s, 16, 8, 7);  // 7 tokens: the payload no longer matches the shape
  Reseal(s);
  ExpectRejected(s, "the shape needs");
  std::string n = v;
  SetLe(n, 24, 8, static_cast<std::uint64_t>(-4));
  Reseal(n);
  ExpectRejected(n, "out of range");
}

}  // namespace
}  // namespace epd
