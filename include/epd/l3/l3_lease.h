// epd/l3/l3_lease.h: the value of a single-flight lease in the shared tier
// (L3), and how a reader decides whether a lease it found is authentic.
//
// Without a keyring a lease's value is its holder's owner id, as before:
// anyone who can write to the Redis can hold any key back for as long as its
// lease's PX (docs/L3.md, "Threat model").
//
// With a keyring (epd/l3/l3_keyring.h) it is one line of ASCII words:
//   EPLL1 <key id> <expiry ms> <nonce> <tag> <owner id>
// <key id> decimal, the cluster key the tag is under; <expiry ms> decimal,
// the writer's wall clock (Unix ms) plus the lease lifetime; <nonce> 32 hex
// digits (16 random bytes); <tag> 64 hex digits: HMAC-SHA256 under the
// key's lease key over
//   "epd-l3 lease v1" NUL | key id (4, LE) | content key (32) |
//   expiry ms (8, LE) | nonce (16) | owner id bytes
// and the owner id is the rest of the line (it may hold spaces). Binding
// the content key means a lease copied to another key fails; binding the
// expiry means a lease replayed after its lifetime fails. The nonce makes
// two leases of one owner on one key differ, so a compare-and-delete of one
// never removes the other.
//
// Clocks: the expiry is the only wall-clock value compared across hosts. A
// reader refuses a lease whose expiry is more than `clock_slack_ms` in its
// own past: a replay (or a holder whose clock runs behind by more than the
// slack). The cost of a skewed clock is a duplicate encode, never a wrong
// value; Redis's PX still ends every lease by Redis's own clock.
//
// Thread safety: thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "epd/core/content_key_type.h"
#include "epd/core/status.h"
#include "epd/l3/l3_keyring.h"

namespace epd {

inline constexpr std::int64_t kLeaseClockSlackMs = 2000;

// The value this process sets for its lease on `key`: `owner` itself without
// a keyring, the authenticated line above with one. kInternal when OpenSSL
// fails (no random bytes, out of memory).
StatusOr<std::string> MakeLeaseValue(const L3Keyring* keyring, const ContentKey& key, std::string_view owner,
                                     std::int64_t expiry_unix_ms);

// The owner id of a lease value read for `key`. Without a keyring: the value
// itself. With one: kUnauthenticated naming what is wrong (not the format
// above, a key id the keyring does not hold, a tag mismatch: forged, altered
// or copied from another key; an expiry more than clock_slack_ms before
// now_unix_ms: replayed).
StatusOr<std::string> LeaseOwner(const L3Keyring* keyring, const ContentKey& key, std::string_view value,
                                 std::int64_t now_unix_ms, std::int64_t clock_slack_ms = kLeaseClockSlackMs);

}  // namespace epd
