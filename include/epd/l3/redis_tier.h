// epd/l3/redis_tier.h: the shared tier (L3, epd/core/shared_tier.h) on Redis or
// Valkey, through hiredis.
//
// Keys: "<prefix>v:<content key hex>" holds a value (epd/l3/l3_value.h) with a
// TTL; "<prefix>lease:<content key hex>" holds the lease of the process
// encoding that key (epd/l3/l3_lease.h), set with `SET ... NX PX <lease>`. Keys are spread over
// the URLs by consistent hashing (epd/l3/l3_ring.h), value and lease of one key
// always on the same shard. Or, with one redis-cluster:// URL, over a Redis
// Cluster by its own slot map, MOVED and ASK followed (docs/L3.md, "Redis
// Cluster"); the keys then carry the content key as their hash tag
// ("<prefix>v:{<hex>}", "<prefix>lease:{<hex>}"), so value and lease share a
// slot. Eviction is Redis's own: run it with a
// `maxmemory` and `maxmemory-policy allkeys-lru` (docs/L3.md).
//
// Calls: Get is one GET; TryLease is SET NX PX, plus a GET of the lease when
// it is taken; PutAsync queues a SET PX on a writer thread, followed by a
// compare-and-delete of this process's lease (a one-line Lua script, so a
// lease that lapsed and was taken by another process is never deleted).
// A rejected value costs one more EVAL (its compare-and-delete), a forged
// lease an EVAL and a second SET NX. Every command waits at most `timeout`.
//
// Checks on every value read (DecodeL3Value): header, shape, grid against
// tokens and merge_size, finite rows, and the checksum (no keyring) or the
// MAC (keyring). A value that fails is a miss, counted in `corrupt` or, when
// it does not authenticate, `auth_failures`, and is deleted while it still
// holds the bytes read. With a keyring a lease that does not authenticate is
// counted in `lease_auth_failures`, deleted likewise and taken by this
// process, so a forged lease cannot hold a key back.
//
// Failures: a shard that refuses the connection, times out or drops it is
// marked down and retried after a backoff (reconnect_min doubling to
// reconnect_max); while it is down, its calls fail at once (counted as
// "down") and Stats().degraded holds. Error replies (OOM from a full Redis
// with noeviction, NOAUTH/WRONGPASS, ...) are counted by kind; the
// connection stays. Each distinct error is passed to `log` at most once per
// `log_interval`, with the count of repeats since.
//
// Security: AUTH with the URL's password, or user and password (Redis 6
// ACL), on every connection; SELECT of the URL's database. Debian 12's
// hiredis (0.14) has no TLS: put stunnel in front of a remote Redis on both
// ends, or keep Redis on a private network. Without a keyring the tier
// trusts everyone who can write to the Redis; the threat model is in
// docs/L3.md.
//
// Thread safety: thread-safe. Connections are pooled per shard (one per
// concurrent caller), so Get/TryLease from several threads run in parallel.
//
// Example:
//   RedisTierOptions o;
//   o.urls = {"redis://127.0.0.1:6379/0"};
//   StatusOr<std::shared_ptr<SharedTier>> tier = OpenRedisTier(o);
//   worker_options.shared_tier = *tier;      // WorkerLoop consults it
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "epd/core/shared_tier.h"
#include "epd/core/status.h"
#include "epd/l3/l3_keyring.h"

namespace epd {

// redis://[[user]:password@]host[:port][/db]
struct RedisUrl {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string user;      // empty: AUTH with the password alone (the "default" user)
  std::string password;  // empty: no AUTH
  // "host:port/db": the shard's name on the ring and in logs (no credentials).
  std::string Name() const;
};

// kInvalidArgument naming what is wrong: another scheme (rediss:// included:
// no TLS in this build), an empty host, a port outside 1..65535, a database
// that is not a number in 0..65535, a user without a password.
StatusOr<RedisUrl> ParseRedisUrl(std::string_view url);

struct RedisTierOptions {
  // One or more redis:// URLs (see ParseRedisUrl); at least one. Or exactly
  // one redis-cluster://[[user]:password@]host:port[,host:port...]: the seeds
  // of a Redis Cluster (database 0 only).
  std::vector<std::string> urls;
  // Lifetime of a stored value; 0 = none (Redis's eviction alone).
  std::chrono::seconds ttl{24 * 3600};
  // Longest any one command (or connect) waits. Keep it well below the
  // callers' deadlines: a slow Redis costs every miss this much.
  std::chrono::milliseconds timeout{50};
  // Lease lifetime (PX). It must exceed one encode (queue + tower) or a
  // second process may take the lease over while the first still encodes
  // (a duplicate encode, never a wrong value). Enforced by Redis's clock.
  std::chrono::milliseconds lease{10000};
  // How a process waits on another's lease (epd/core/shared_tier.h).
  LeaseWaitPolicy wait{};
  // The value of this process's leases; empty = "<hostname>:<pid>:<random>".
  // Must differ between processes.
  std::string owner_id;
  // Prefix of every key ("epd:"), so a Redis can be shared with other users.
  std::string key_prefix = "epd:";
  // Bytes of embeddings queued for writing at most; beyond it a write is
  // dropped (counted in write_drops).
  std::int64_t max_write_queue_bytes = std::int64_t{256} << 20;
  int virtual_nodes = 160;
  std::chrono::milliseconds reconnect_min{100};
  std::chrono::milliseconds reconnect_max{5000};
  std::chrono::seconds log_interval{10};
  // The cluster keyring (epd/l3/l3_keyring.h, --l3-key-file): values and
  // leases are authenticated under it. Null: values carry an XXH3 checksum,
  // leases the bare owner id, and anyone who can write to the Redis can
  // make every server serve chosen rows or hold a key back.
  std::shared_ptr<const L3Keyring> keyring;
  // The tower's merge size (1..64): a value's tokens must be t*h*w/merge^2.
  std::int64_t merge_size = 2;
  // Receives the rate-limited error lines; called from any thread. Null = none.
  std::function<void(const std::string&)> log;
};

// Parses the URLs and starts the writer thread. Does not connect: shards are
// connected on first use, so a Redis that is down at start only makes the
// tier degraded. Errors: kInvalidArgument for no URL, a bad URL, the same
// shard twice, a non-positive timeout, lease or queue size, negative ttl,
// a merge size outside 1..64; for a cluster: a bad seed, a redis-cluster://
// URL beside other URLs, a key prefix holding a brace.
StatusOr<std::shared_ptr<SharedTier>> OpenRedisTier(RedisTierOptions options);

}  // namespace epd
