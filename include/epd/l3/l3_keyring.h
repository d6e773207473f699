// epd/l3/l3_keyring.h: the cluster key(s) that authenticate what the shared
// tier (L3) holds, read from the file `--l3-key-file` names (docs/L3.md,
// "Authenticated values and leases").
//
// File format (text; the same file on every server of a cluster):
//   # comment lines and blank lines are ignored
//   current  <key id> <secret>
//   previous <key id> <secret>        (optional: only during a rotation)
// <key id> is a decimal number in 1..4294967295, named in every value and
// lease written under the key; <secret> is 64 hex digits (32 random bytes),
// e.g. `openssl rand -hex 32`. Exactly one `current` line, at most one
// `previous` one, with another id and another secret.
//
// Values and leases are written under the current key; both keys are
// accepted when read. A rotation: deploy a file with the new key as
// `current` and the old one as `previous` on every server, then (once all
// run it, and values written under the old key may be refused) one with the
// new key alone.
//
// The secret itself is never used directly: two subkeys are derived from it,
// so the GMAC of values and the HMAC of leases never share a key:
//   value key = HMAC-SHA256(secret, "epd-l3 value gmac v1")
//   lease key = HMAC-SHA256(secret, "epd-l3 lease hmac v1")
// (the single-block expand step of HKDF, RFC 5869 section 2.3, with the
// label as info). The keyring holds only the subkeys and wipes them
// (OPENSSL_cleanse) when destroyed.
//
// Thread safety: immutable after construction; share it freely.
//
// Example:
//   StatusOr<std::shared_ptr<const L3Keyring>> ring = L3Keyring::Load("/etc/epd/l3.key");
//   options.keyring = *ring;        // RedisTierOptions
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "epd/core/status.h"
#include "epd/l3/l3_mac.h"

namespace epd {

// One cluster key: its id and the subkeys derived from its secret.
struct L3Key {
  std::uint32_t id = 0;
  L3Secret value_key{};  // GMAC (AES-256-GCM) key of values
  L3Secret lease_key{};  // HMAC-SHA256 key of leases
};

class L3Keyring {
 public:
  // The keyring a key file's text describes. kInvalidArgument naming
  // `source`, the line and what is wrong (an unknown role, a bad id, a
  // secret that is not 64 hex digits, two `current` lines, no `current`
  // line, a `previous` with the current's id or secret); the secret is
  // never quoted.
  static StatusOr<std::shared_ptr<const L3Keyring>> Parse(std::string_view text, const std::string& source);
  // Reads and parses `path`. kInvalidArgument also for a file that cannot
  // be read, is not a regular file, is over 64 KiB, or that every user of
  // the machine may read or write (mode o+r or o+w: chmod 600 or 640).
  static StatusOr<std::shared_ptr<const L3Keyring>> Load(const std::string& path);
  // From secrets directly (tests, tools). Same checks as Parse.
  static StatusOr<std::shared_ptr<const L3Keyring>> FromSecrets(
      std::uint32_t current_id, const L3Secret& current,
      std::optional<std::pair<std::uint32_t, L3Secret>> previous = std::nullopt);

  ~L3Keyring();

  // The key values and leases are written under.
  const L3Key& current() const { return current_; }
  // The key with `id`: the current or the previous one; null for any other
  // (unknown, or retired by a file without it).
  const L3Key* Find(std::uint32_t id) const;
  bool has_previous() const { return previous_.has_value(); }
  // "key id 7" or "key id 7, previous key id 6 accepted" (no secrets).
  std::string Describe() const;

 private:
  L3Keyring() = default;
  L3Key current_;
  std::optional<L3Key> previous_;
};

}  // namespace epd
