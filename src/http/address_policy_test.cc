// The address classes a media fetch refuses, and address ranges, against
// addresses written out by hand from the IANA special-purpose registries.
#include "address_policy.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <string>
#include <utility>

namespace epd::internal {
namespace {

sockaddr_storage Addr(const std::string& text) {
  sockaddr_storage ss{};
  if (inet_pton(AF_INET, text.c_str(), &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr) == 1) {
    ss.ss_family = AF_INET;
  } else {
    EXPECT_EQ(inet_pton(AF_INET6, text.c_str(), &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr), 1) << text;
    ss.ss_family = AF_INET6;
  }
  return ss;
}

std::string ClassOf(const std::string& text) {
  const sockaddr_storage ss = Addr(text);
  return NonPublicClass(reinterpret_cast<const sockaddr*>(&ss)).value_or("public");
}

TEST(AddressPolicyTest, EverySpecialRangeIsNamedAndPublicAddressesPass) {
  const std::pair<const char*, const char*> cases[] = {{"127.0.0.1", "loopback"},
                                                       {"127.255.1.2", "loopback"},
                                                       {"10.0.0.7", "private"},
                                                       {"172.16.0.1", "private"},
                                                       {"172.31.255.255", "private"},
                                                       {"172.32.0.1", "public"},
                                                       {"192.168.1.1", "private"},
                                                       {"169.254.169.254", "link-local"},
                                                       {"100.64.0.1", "shared (carrier-grade NAT)"},
                                                       {"100.128.0.1", "public"},
                                                       {"0.0.0.0", "unspecified"},
                                                       {"224.0.0.1", "multicast"},
                                                       {"255.255.255.255", "reserved"},
                                                       {"192.0.2.10", "documentation"},
                                                       {"198.18.0.1", "benchmarking"},
                                                       {"8.8.8.8", "public"},
                                                       {"93.184.216.34", "public"},
                                                       {"::1", "loopback"},
                                                       {"::", "unspecified"},
                                                       {"fe80::1", "link-local"},
                                                       {"fd12:3456::1", "unique local (private)"},
                                                       {"fc00::1", "unique local (private)"},
                                                       {"ff02::1", "multicast"},
                                                       {"2001:db8::1", "documentation"},
                                                       {"::ffff:8.8.8.8", "public"},
                                                       {"64:ff9b::808:808", "public"},
                                                       {"2606:4700:4700::1111", "public"}};
  for (const auto& [addr, what] : cases) EXPECT_EQ(ClassOf(addr), what) << addr;
}

// Each form that carries an IPv4 address is judged by the IPv4 rule, and
// the class names the carried address.
TEST(AddressPolicyTest, IPv6FormsThatEmbedIPv4AreJudgedByTheEmbeddedAddress) {
  const std::pair<const char*, const char*> cases[] = {
      // 6to4, 2002::/16, the IPv4 address in bits 16..47
      {"2002:7f00:0001::", "loopback (6to4, embeds 127.0.0.1)"},
      {"2002:a00:1:5::1", "private (6to4, embeds 10.0.0.1)"},
      {"2002:a9fe:a9fe::", "link-local (6to4, embeds 169.254.169.254)"},
      {"2002:c0a8:0101:1:2:3:4:5", "private (6to4, embeds 192.168.1.1)"},
      {"2002:0808:0808::", "public"},
      {"2002:0808:0808:1::1", "public"},
      // NAT64 well-known prefix, 64:ff9b::/96
      {"64:ff9b::a00:1", "private (NAT64, embeds 10.0.0.1)"},
      {"64:ff9b::127.0.0.1", "loopback (NAT64, embeds 127.0.0.1)"},
      {"64:ff9b::169.254.169.254", "link-local (NAT64, embeds 169.254.169.254)"},
      // local-use NAT64, 64:ff9b:1::/48: refused whatever it carries
      {"64:ff9b:1::a00:1", "private (local-use NAT64, embeds 10.0.0.1)"},
      {"64:ff9b:1::808:808", "local-use NAT64 (not globally reachable; embeds 8.8.8.8)"},
      {"64:ff9b:1:ffff::7f00:1", "loopback (local-use NAT64, embeds 127.0.0.1)"},
      // SIIT: IPv4-mapped ::ffff:0:0/96 and IPv4-translated ::ffff:0:0:0/96
      {"::ffff:127.0.0.1", "loopback (IPv4-mapped, embeds 127.0.0.1)"},
      {"::ffff:10.1.2.3", "private (IPv4-mapped, embeds 10.1.2.3)"},
      {"::ffff:0:127.0.0.1", "loopback (IPv4-translated, embeds 127.0.0.1)"},
      {"::ffff:0:172.16.5.4", "private (IPv4-translated, embeds 172.16.5.4)"},
      {"::ffff:0:8.8.8.8", "public"},
      // IPv4-compatible ::/96: deprecated, refused whatever it carries
      {"::7f00:1", "loopback (IPv4-compatible, embeds 127.0.0.1)"},
      {"::a00:1", "private (IPv4-compatible, embeds 10.0.0.1)"},
      {"::808:808", "IPv4-compatible (deprecated; embeds 8.8.8.8)"},
      // neighbours of those prefixes are ordinary IPv6 addresses
      {"2003:7f00:1::", "public"},
      {"64:ff9b:2::a00:1", "public"},
      {"::1:ffff:7f00:1", "public"},
  };
  for (const auto& [addr, what] : cases) EXPECT_EQ(ClassOf(addr), what) << addr;
}

// An allowed network exempts every form that reaches it, as the refusal
// follows every form.
TEST(AddressPolicyTest, AnAllowedIPv4NetworkCoversTheFormsThatEmbedIt) {
  StatusOr<Cidr> ten = ParseCidr("10.0.0.0/8");
  ASSERT_TRUE(ten.ok());
  for (const char* addr : {"::ffff:10.0.0.1", "::ffff:0:10.0.0.1", "64:ff9b::a00:1", "2002:a00:1::", "::a00:1"}) {
    const sockaddr_storage ss = Addr(addr);
    EXPECT_TRUE(Contains(*ten, reinterpret_cast<const sockaddr*>(&ss))) << addr;
  }
  for (const char* addr : {"::1", "::", "2002:b00:1::", "fd00::a00:1"}) {
    const sockaddr_storage ss = Addr(addr);
    EXPECT_FALSE(Contains(*ten, reinterpret_cast<const sockaddr*>(&ss))) << addr;
  }
}

TEST(AddressPolicyTest, RangesContainTheirAddressesAndMappedOnes) {
  const auto in = [](const char* cidr, const char* addr) {
    StatusOr<Cidr> c = ParseCidr(cidr);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    const sockaddr_storage ss = Addr(addr);
    return Contains(*c, reinterpret_cast<const sockaddr*>(&ss));
  };
  EXPECT_TRUE(in("10.1.0.0/16", "10.1.200.3"));
  EXPECT_FALSE(in("10.1.0.0/16", "10.2.0.1"));
  EXPECT_TRUE(in("127.0.0.2", "127.0.0.2"));
  EXPECT_FALSE(in("127.0.0.2", "127.0.0.1"));
  EXPECT_TRUE(in("127.0.0.2/32", "::ffff:127.0.0.2"));
  EXPECT_TRUE(in("fd00::/8", "fd12::5"));
  EXPECT_FALSE(in("fd00::/8", "fe80::1"));
  EXPECT_TRUE(in("0.0.0.0/0", "8.8.8.8"));
  EXPECT_FALSE(in("10.0.0.0/8", "fd00::1"));
  for (const char* bad : {"10.0.0.0/33", "fd00::/129", "not-an-ip", "10.0.0.0/", "10.0.0.0/x"}) {
    StatusOr<Cidr> c = ParseCidr(bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(bad), std::string::npos) << c.status().message();
  }
}

}  // namespace
}  // namespace epd::internal
