// GMAC and HMAC-SHA256 (epd/l3/l3_mac.h) against published answers: the GCM
// specification's test case 13 (AES-256, zero key and IV, no input; McGrew
// and Viega, "The Galois/Counter Mode of Operation", appendix B) and RFC 4231
// test cases 1 and 2; GMAC over many chunks equals GMAC over one; and the
// tag comparison.
#include "epd/l3/l3_mac.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace epd {
namespace {

template <std::size_t N>
std::string Hex(const std::array<std::uint8_t, N>& a) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::uint8_t b : a) {
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

TEST(L3Mac, GmacOfNothingUnderZeroKeyIsGcmTestCase13) {
  Gmac mac(L3Secret{}, Gmac::Iv{});
  StatusOr<Gmac::Tag> tag = mac.Final();
  ASSERT_TRUE(tag.ok());
  EXPECT_EQ(Hex(*tag), "530f8afbc74536b9a963b4f1c4cb738b");
}

TEST(L3Mac, GmacIsTheSameOverChunksAndDependsOnKeyIvAndEveryByte) {
  std::vector<std::uint8_t> data(100003);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 31 + 7);
  L3Secret key{};
  key[0] = 1;
  Gmac::Iv iv{};
  iv[11] = 9;
  auto tag_of = [&](const std::vector<std::uint8_t>& d, const L3Secret& k, const Gmac::Iv& v, std::size_t chunk) {
    Gmac mac(k, v);
    for (std::size_t off = 0; off < d.size(); off += chunk) mac.Update(d.data() + off, std::min(chunk, d.size() - off));
    return *mac.Final();
  };
  const Gmac::Tag whole = tag_of(data, key, iv, data.size());
  EXPECT_EQ(tag_of(data, key, iv, 4096), whole);
  EXPECT_EQ(tag_of(data, key, iv, 7), whole);
  L3Secret other_key = key;
  other_key[31] ^= 1;
  EXPECT_NE(tag_of(data, other_key, iv, 4096), whole);
  Gmac::Iv other_iv = iv;
  other_iv[0] ^= 1;
  EXPECT_NE(tag_of(data, key, other_iv, 4096), whole);
  std::vector<std::uint8_t> flipped = data;
  flipped[50000] ^= 0x20;
  EXPECT_NE(tag_of(flipped, key, iv, 4096), whole);
}

TEST(L3Mac, HmacSha256IsRfc4231) {
  const std::vector<std::uint8_t> key1(20, 0x0b);
  HmacSha256 a(key1);
  a.Update("Hi", 2);
  a.Update(" There", 6);
  EXPECT_EQ(Hex(*a.Final()), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  const std::string jefe = "Jefe", msg = "what do ya want for nothing?";
  HmacSha256 b(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(jefe.data()), jefe.size()));
  b.Update(msg.data(), msg.size());
  EXPECT_EQ(Hex(*b.Final()), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(L3Mac, TagsEqualComparesEveryByte) {
  const std::uint8_t a[16] = {1, 2, 3}, b[16] = {1, 2, 3};
  std::uint8_t c[16] = {1, 2, 3};
  c[15] = 1;
  EXPECT_TRUE(TagsEqual(a, b, 16));
  EXPECT_FALSE(TagsEqual(a, c, 16));
  EXPECT_TRUE(TagsEqual(a, c, 15));
}

TEST(L3Mac, RandomBytesDiffer) {
  std::array<std::uint8_t, 16> x{}, y{};
  ASSERT_TRUE(RandomBytes(x).ok());
  ASSERT_TRUE(RandomBytes(y).ok());
  EXPECT_NE(x, y);  // 2^-128 chance of a false failure
}

}  // namespace
}  // namespace epd
