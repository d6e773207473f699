// src/http/address_policy.h (internal): which network addresses a media
// fetch may connect to (server-side request forgery protection,
// epd/http/media_fetch.h).
//
// NonPublicClass names the class of an address that is not public unicast:
//   IPv4  0/8 "unspecified", 10/8 172.16/12 192.168/16 "private",
//         100.64/10 "shared (carrier-grade NAT)", 127/8 "loopback",
//         169.254/16 "link-local", 192.0.0/24 "IETF protocol assignment",
//         192.0.2/24 198.51.100/24 203.0.113/24 "documentation",
//         198.18/15 "benchmarking", 224/4 "multicast", 240/4 "reserved"
//   IPv6  :: "unspecified", ::1 "loopback", fc00::/7 "unique local (private)",
//         fe80::/10 "link-local", ff00::/8 "multicast", 2001:db8::/32
//         "documentation".
//   IPv6 forms that carry an IPv4 address are judged by the IPv4 rule
//   applied to the address they carry, and the class names both, e.g.
//   "loopback (6to4, embeds 127.0.0.1)":
//         ::ffff:0:0/96 IPv4-mapped and ::ffff:0:0:0/96 IPv4-translated
//         (SIIT, RFC 6145), 64:ff9b::/96 NAT64 (RFC 6052), 2002::/16 6to4
//         (RFC 3056: bits 16..47). Two are refused whatever they carry:
//         ::/96 "IPv4-compatible (deprecated; embeds a.b.c.d)" (RFC 4291)
//         and 64:ff9b:1::/48 "local-use NAT64 (not globally reachable;
//         embeds a.b.c.d)" (RFC 8215; the carried address is read at the
//         /96 position, but an operator's prefix may place it elsewhere).
// Sources: the IANA IPv4 and IPv6 Special-Purpose Address Registries
// (RFC 6890 and its updates).
//
// Thread safety: pure functions.
#pragma once

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "epd/core/status.h"

namespace epd::internal {

// nullopt for a public unicast address (or an address family other than
// IPv4/IPv6, which a TCP fetch never sees).
std::optional<std::string> NonPublicClass(const sockaddr* addr);

// "127.0.0.1", "::1".
std::string AddressText(const sockaddr* addr);

// An address range, "10.1.0.0/16" or "fd00::/8" (a bare address is /32 or
// /128).
struct Cidr {
  int family = AF_INET;
  std::array<std::uint8_t, 16> bytes{};
  int prefix = 0;
};
// kInvalidArgument naming the text when it is not an address range.
StatusOr<Cidr> ParseCidr(std::string_view text);
// True when `addr` lies in `range`, or carries (in one of the forms above)
// an IPv4 address that lies in it: an allowed network exempts every form
// that reaches it, as the refusal follows every form.
bool Contains(const Cidr& range, const sockaddr* addr);

}  // namespace epd::internal
