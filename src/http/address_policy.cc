// See address_policy.h.
#include "address_policy.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>

namespace epd::internal {
namespace {

struct Range4 {
  std::uint32_t base;
  int prefix;
  const char* what;
};

bool In4(std::uint32_t a, std::uint32_t base, int prefix) {
  const std::uint32_t mask = prefix == 0 ? 0 : ~std::uint32_t{0} << (32 - prefix);
  return (a & mask) == (base & mask);
}

std::optional<std::string> Class4(std::uint32_t a) {
  static const Range4 kRanges[] = {{0x00000000, 8, "unspecified"},
                                   {0x0A000000, 8, "private"},
                                   {0x64400000, 10, "shared (carrier-grade NAT)"},
                                   {0x7F000000, 8, "loopback"},
                                   {0xA9FE0000, 16, "link-local"},
                                   {0xAC100000, 12, "private"},
                                   {0xC0000000, 24, "IETF protocol assignment"},
                                   {0xC0000200, 24, "documentation"},
                                   {0xC0A80000, 16, "private"},
                                   {0xC6120000, 15, "benchmarking"},
                                   {0xC6336400, 24, "documentation"},
                                   {0xCB007100, 24, "documentation"},
                                   {0xE0000000, 4, "multicast"},
                                   {0xF0000000, 4, "reserved"}};
  for (const Range4& r : kRanges) {
    if (In4(a, r.base, r.prefix)) return std::string(r.what);
  }
  return std::nullopt;
}

std::uint32_t V4(const sockaddr_in* a) { return ntohl(a->sin_addr.s_addr); }

bool Prefix6(const std::uint8_t* b, std::initializer_list<std::uint8_t> head, int bits) {
  int i = 0;
  for (std::uint8_t h : head) {
    const int take = std::min(8, bits - i * 8);
    if (take <= 0) break;
    const std::uint8_t mask = static_cast<std::uint8_t>(0xFF << (8 - take));
    if ((b[i] & mask) != (h & mask)) return false;
    ++i;
  }
  return true;
}

bool AllZero(const std::uint8_t* b, int n) {
  for (int i = 0; i < n; ++i) {
    if (b[i] != 0) return false;
  }
  return true;
}

// An IPv4 address carried inside an IPv6 one, and the form that carries it.
struct Embedding {
  const char* form;
  std::uint32_t v4;
};

std::uint32_t Read4(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

// The forms of the IANA IPv6 special-purpose registry (and RFC 3056, 6052,
// 6145, 8215, 4291) that carry an IPv4 address. REQUIRES: b is neither ::
// nor ::1.
std::optional<Embedding> Embedded(const std::uint8_t* b) {
  if (AllZero(b, 10) && b[10] == 0xFF && b[11] == 0xFF) return Embedding{"IPv4-mapped", Read4(b + 12)};
  if (AllZero(b, 8) && b[8] == 0xFF && b[9] == 0xFF && b[10] == 0 && b[11] == 0) {
    return Embedding{"IPv4-translated", Read4(b + 12)};
  }
  if (AllZero(b, 12)) return Embedding{"IPv4-compatible", Read4(b + 12)};
  if (Prefix6(b, {0x00, 0x64, 0xFF, 0x9B}, 32) && AllZero(b + 4, 8)) return Embedding{"NAT64", Read4(b + 12)};
  if (Prefix6(b, {0x00, 0x64, 0xFF, 0x9B, 0x00, 0x01}, 48)) return Embedding{"local-use NAT64", Read4(b + 12)};
  if (b[0] == 0x20 && b[1] == 0x02) return Embedding{"6to4", Read4(b + 2)};
  return std::nullopt;
}

std::string Text4(std::uint32_t v4) {
  in_addr a{};
  a.s_addr = htonl(v4);
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a, buf, sizeof(buf));
  return buf;
}

// An embedded address is judged by the IPv4 rule, except two forms refused
// whatever they carry: IPv4-compatible (deprecated by RFC 4291) and
// local-use NAT64 (not globally reachable; where the IPv4 address sits in
// it depends on the operator's prefix length, so none can be trusted).
std::optional<std::string> ClassEmbedded(const Embedding& e) {
  const std::optional<std::string> c = Class4(e.v4);
  const std::string form = e.form, carried = Text4(e.v4);
  if (c.has_value()) return *c + " (" + form + ", embeds " + carried + ")";
  if (form == "IPv4-compatible") return "IPv4-compatible (deprecated; embeds " + carried + ")";
  if (form == "local-use NAT64") return "local-use NAT64 (not globally reachable; embeds " + carried + ")";
  return std::nullopt;
}

std::optional<std::string> Class6(const std::uint8_t* b) {
  if (AllZero(b, 16)) return "unspecified";
  if (AllZero(b, 15) && b[15] == 1) return "loopback";
  if (const std::optional<Embedding> e = Embedded(b)) return ClassEmbedded(*e);
  if (Prefix6(b, {0xFC}, 7)) return "unique local (private)";
  if (Prefix6(b, {0xFE, 0x80}, 10)) return "link-local";
  if (b[0] == 0xFF) return "multicast";
  if (Prefix6(b, {0x20, 0x01, 0x0D, 0xB8}, 32)) return "documentation";
  return std::nullopt;
}

bool InRange(const Cidr& range, int family, const std::uint8_t* b) {
  if (family != range.family) return false;
  for (int bit = 0; bit < range.prefix; ++bit) {
    const int i = bit / 8, shift = 7 - bit % 8;
    if (((b[i] >> shift) & 1) != ((range.bytes[i] >> shift) & 1)) return false;
  }
  return true;
}

const std::uint8_t* Bytes6(const sockaddr* addr) {
  return reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr.s6_addr;
}

}  // namespace

std::optional<std::string> NonPublicClass(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) return Class4(V4(reinterpret_cast<const sockaddr_in*>(addr)));
  if (addr->sa_family == AF_INET6) return Class6(Bytes6(addr));
  return std::nullopt;
}

std::string AddressText(const sockaddr* addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, buf, sizeof(buf));
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

StatusOr<Cidr> ParseCidr(std::string_view text) {
  const std::string s(text);
  const std::size_t slash = s.find('/');
  const std::string host = s.substr(0, slash);
  Cidr c;
  if (inet_pton(AF_INET, host.c_str(), c.bytes.data()) == 1) {
    c.family = AF_INET;
    c.prefix = 32;
  } else if (inet_pton(AF_INET6, host.c_str(), c.bytes.data()) == 1) {
    c.family = AF_INET6;
    c.prefix = 128;
  } else {
    return InvalidArgument("'" + s + "' is not an address range (e.g. 10.1.0.0/16 or fd00::/8)");
  }
  if (slash != std::string::npos) {
    const std::string bits = s.substr(slash + 1);
    const int max = c.prefix;
    char* end = nullptr;
    const long n = std::strtol(bits.c_str(), &end, 10);
    if (bits.empty() || *end != '\0' || n < 0 || n > max) {
      return InvalidArgument("'" + s + "': the prefix length must be 0.." + std::to_string(max));
    }
    c.prefix = static_cast<int>(n);
  }
  return c;
}

bool Contains(const Cidr& range, const sockaddr* addr) {
  if (addr->sa_family == AF_INET) {
    std::uint8_t b[4];
    std::memcpy(b, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, 4);
    return InRange(range, AF_INET, b);
  }
  if (addr->sa_family != AF_INET6) return false;
  const std::uint8_t* six = Bytes6(addr);
  if (InRange(range, AF_INET6, six)) return true;
  if (AllZero(six, 15) && six[15] <= 1) return false;  // :: and ::1 carry no IPv4 address
  const std::optional<Embedding> e = Embedded(six);
  if (!e.has_value()) return false;
  std::uint8_t b[4];
  const std::uint32_t n = htonl(e->v4);
  std::memcpy(b, &n, 4);
  return InRange(range, AF_INET, b);
}

}  // namespace epd::internal
