// RedisTier (epd/l3/redis_tier.h) against a real redis-server that each test
// starts on its own free port (src/testing/redis_server.h): values written by
// one tier are read by another, leases are exclusive and released by
// compare-and-delete, and every failure (Redis killed, restarted, full,
// wrong password, a corrupt value) is counted and survived. With a cluster
// keyring, forged values and leases are refused, counted, deleted and (for
// leases) taken; a rotation accepts the previous key and then refuses it.
#include "epd/l3/redis_tier.h"

#include <gtest/gtest.h>

#include <thread>

#include "epd/l3/l3_lease.h"
#include "epd/l3/l3_value.h"
#include "epd/media/content_key.h"
#include "l3_test_util.h"
#include "redis_server.h"
#include "test_names.h"

namespace epd {
namespace {

using test_util::RedisKey;
using test_util::RedisServer;

std::int64_t WallMsForTest() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ContentKey KeyOf(std::uint8_t seed) {
  ContentKey k;
  for (std::size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<std::uint8_t>(seed + 17 * i);
  return k;
}

EmbeddingPtr Rows(std::int64_t tokens, std::int64_t hidden, std::uint8_t fill) {
  auto e = std::make_shared<Embedding>();
  e->tokens = tokens;
  e->hidden = hidden;
  e->grid = {1, 2, 2 * tokens};
  e->main.assign(static_cast<std::size_t>(tokens * hidden * 4), static_cast<std::byte>(fill));
  return e;
}

std::shared_ptr<SharedTier> Open(const std::vector<std::string>& urls, const std::string& owner = "",
                                 std::vector<std::string>* log = nullptr,
                                 std::shared_ptr<const L3Keyring> keyring = nullptr) {
  RedisTierOptions o;
  o.keyring = std::move(keyring);
  o.urls = urls;
  o.timeout = std::chrono::milliseconds(500);
  o.lease = std::chrono::milliseconds(60000);
  o.owner_id = owner;
  o.reconnect_min = std::chrono::milliseconds(1);
  o.reconnect_max = std::chrono::milliseconds(20);
  if (log != nullptr) o.log = [log](const std::string& line) { log->push_back(line); };
  StatusOr<std::shared_ptr<SharedTier>> t = OpenRedisTier(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? *t : nullptr;
}

// Waits (bounded) until the tier's writer has done `writes` writes or drops.
void AwaitWrites(const SharedTier& t, std::uint64_t n) {
  for (int i = 0; i < 2000; ++i) {
    const SharedTierStats s = t.Stats();
    if (s.writes + s.write_drops >= n) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  FAIL() << "the writer did not finish " << n << " writes";
}

TEST(RedisUrl, ParsesHostPortDbAndCredentials) {
  StatusOr<RedisUrl> u = ParseRedisUrl("redis://alice:s3cret@cache.local:6380/2");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->host, "cache.local");
  EXPECT_EQ(u->port, 6380);
  EXPECT_EQ(u->db, 2);
  EXPECT_EQ(u->user, "alice");
  EXPECT_EQ(u->password, "s3cret");
  EXPECT_EQ(u->Name(), "cache.local:6380/2");
  StatusOr<RedisUrl> d = ParseRedisUrl("redis://10.1.2.3");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->port, 6379);
  EXPECT_EQ(d->db, 0);
  StatusOr<RedisUrl> p = ParseRedisUrl("redis://:pw@h:1/");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->user, "");
  EXPECT_EQ(p->password, "pw");
}

TEST(RedisUrl, RejectsBadUrlsWithoutEchoingThePassword) {
  for (const char* bad : {"http://h:1", "redis://", "redis://h:0", "redis://h:70000", "redis://h:1/x",
                          "redis://user@h:1", "rediss://h:1"}) {
    StatusOr<RedisUrl> u = ParseRedisUrl(bad);
    EXPECT_FALSE(u.ok()) << bad;
    EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument);
  }
  StatusOr<RedisUrl> u = ParseRedisUrl("redis://bob:topsecret@h:99999");
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().message().find("topsecret"), std::string::npos) << u.status().message();
}

TEST(RedisTier, OpenRejectsBadOptions) {
  RedisTierOptions o;
  EXPECT_EQ(OpenRedisTier(o).status().code(), StatusCode::kInvalidArgument);  // no URL
  o.urls = {"redis://127.0.0.1:1", "redis://127.0.0.1:1/0"};
  EXPECT_EQ(OpenRedisTier(o).status().code(), StatusCode::kInvalidArgument);  // same shard twice
  o.urls = {"redis://127.0.0.1:1"};
  o.timeout = std::chrono::milliseconds(0);
  EXPECT_EQ(OpenRedisTier(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(RedisTier, ValueWrittenByOneProcessIsReadByAnother) {
  RedisServer redis(EPD_REDIS_SERVER);
  auto a = Open({redis.url()}, "a");
  auto b = Open({redis.url()}, "b");
  EXPECT_EQ(*b->Get(KeyOf(1)), nullptr);  // a miss
  a->PutAsync(KeyOf(1), Rows(3, 5, 0x42));
  AwaitWrites(*a, 1);
  StatusOr<EmbeddingPtr> got = b->Get(KeyOf(1));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ((*got)->tokens, 3);
  EXPECT_EQ((*got)->hidden, 5);
  EXPECT_EQ((*got)->grid, (GridTHW{1, 2, 6}));
  EXPECT_EQ((*got)->main, Rows(3, 5, 0x42)->main);
  const SharedTierStats sa = a->Stats(), sb = b->Stats();
  EXPECT_EQ(sa.writes, 1u);
  EXPECT_EQ(sa.write_bytes, kL3HeaderBytes + std::size_t{3} * 5 * 4);
  EXPECT_EQ(sb.gets, 2u);
  EXPECT_EQ(sb.hits, 1u);
  EXPECT_EQ(sb.misses, 1u);
  EXPECT_FALSE(sb.degraded);
  // The stored key and TTL are the documented ones (24 h by default).
  const std::string ttl = redis.Cli({"PTTL", RedisKey("epd:v:", KeyOf(1))});
  ASSERT_EQ(ttl[0], ':') << ttl;
  const long ms = std::stol(ttl.substr(1));
  EXPECT_GT(ms, 23L * 3600 * 1000);
  EXPECT_LE(ms, 24L * 3600 * 1000);
}

TEST(RedisTier, CorruptValueIsCountedAndServedAsAMiss) {
  RedisServer redis(EPD_REDIS_SERVER);
  std::vector<std::string> log;
  auto t = Open({redis.url()}, "a", &log);
  std::string v = EncodeL3Value(KeyOf(2), *Rows(2, 2, 7), kContentKeyVersion);
  v[v.size() - 1] ^= 0x10;
  redis.Cli({"SET", RedisKey("epd:v:", KeyOf(2)), v});
  StatusOr<EmbeddingPtr> got = t->Get(KeyOf(2));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, nullptr);
  EXPECT_EQ(t->Stats().corrupt, 1u);
  EXPECT_EQ(redis.Cli({"EXISTS", RedisKey("epd:v:", KeyOf(2))}), ":0\r\n");  // deleted
  EXPECT_EQ(t->Stats().misses, 1u);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("checksum"), std::string::npos) << log[0];
  // A re-encode overwrites it with a good value.
  t->PutAsync(KeyOf(2), Rows(2, 2, 7));
  AwaitWrites(*t, 1);
  ASSERT_NE(*t->Get(KeyOf(2)), nullptr);
}

TEST(RedisTier, LeaseIsExclusiveAndReleasedOnlyByItsHolder) {
  RedisServer redis(EPD_REDIS_SERVER);
  auto a = Open({redis.url()}, "server-a");
  auto b = Open({redis.url()}, "server-b");
  EXPECT_EQ(a->TryLease(KeyOf(3)), LeaseResult::kAcquired);
  EXPECT_EQ(a->TryLease(KeyOf(3)), LeaseResult::kHeldByUs);
  EXPECT_EQ(b->TryLease(KeyOf(3)), LeaseResult::kHeldByOther);
  EXPECT_EQ(redis.Cli({"GET", RedisKey("epd:lease:", KeyOf(3))}), "$8\r\nserver-a\r\n");
  // b never held it: its release deletes nothing.
  b->ReleaseAsync(KeyOf(3));
  // a writes its value, then releases.
  a->PutAsync(KeyOf(3), Rows(1, 1, 1));
  AwaitWrites(*a, 1);
  for (int i = 0; i < 400 && a->Stats().leases_released == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(a->Stats().leases_released, 1u);
  EXPECT_EQ(redis.Cli({"EXISTS", RedisKey("epd:lease:", KeyOf(3))}), ":0\r\n");
  EXPECT_EQ(b->TryLease(KeyOf(3)), LeaseResult::kAcquired);
}

TEST(RedisTier, LapsedLeaseTakenByAnotherIsNotDeletedByTheFirst) {
  RedisServer redis(EPD_REDIS_SERVER);
  auto a = Open({redis.url()}, "server-a");
  EXPECT_EQ(a->TryLease(KeyOf(4)), LeaseResult::kAcquired);
  // The lease lapses (simulated: deleted) and another process takes it.
  redis.Cli({"DEL", RedisKey("epd:lease:", KeyOf(4))});
  redis.Cli({"SET", RedisKey("epd:lease:", KeyOf(4)), "server-c"});
  a->ReleaseAsync(KeyOf(4));
  a->PutAsync(KeyOf(5), Rows(1, 1, 1));  // queued after the release: done means the release ran
  AwaitWrites(*a, 1);
  EXPECT_EQ(redis.Cli({"GET", RedisKey("epd:lease:", KeyOf(4))}), "$8\r\nserver-c\r\n");
  EXPECT_EQ(a->Stats().leases_released, 0u);
}

TEST(RedisTier, KilledRedisIsCountedDegradedThenReconnected) {
  RedisServer redis(EPD_REDIS_SERVER);
  std::vector<std::string> log;
  auto t = Open({redis.url()}, "a", &log);
  ASSERT_TRUE(t->Get(KeyOf(6)).ok());
  redis.Kill();
  StatusOr<EmbeddingPtr> down = t->Get(KeyOf(6));
  EXPECT_FALSE(down.ok());
  EXPECT_EQ(t->TryLease(KeyOf(6)), LeaseResult::kError);
  SharedTierStats s = t->Stats();
  EXPECT_TRUE(s.degraded);
  std::uint64_t errors = 0;
  for (const auto& [kind, n] : s.errors) errors += n;
  EXPECT_GE(errors, 2u);
  EXPECT_FALSE(log.empty());
  redis.Restart();
  bool back = false;
  for (int i = 0; i < 400 && !back; ++i) {
    back = t->Get(KeyOf(6)).ok();
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(back) << "the tier did not reconnect";
  EXPECT_FALSE(t->Stats().degraded);
}

TEST(RedisTier, StalledRedisTimesOutAndIsUsedAgainOnceItAnswers) {
  RedisServer redis(EPD_REDIS_SERVER);
  auto t = Open({redis.url()}, "a");  // 500 ms timeout
  ASSERT_TRUE(t->Get(KeyOf(8)).ok());
  redis.Pause();  // accepts connections (kernel backlog) but never answers
  EXPECT_FALSE(t->Get(KeyOf(8)).ok());
  EXPECT_GE(t->Stats().errors.count("timeout"), 1u);
  EXPECT_TRUE(t->Stats().degraded);
  redis.Resume();
  bool back = false;
  for (int i = 0; i < 400 && !back; ++i) {
    back = t->Get(KeyOf(8)).ok();
    if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(back);
}

TEST(RedisTier, FullRedisRefusesWritesAndReadsGoOn) {
  RedisServer redis(EPD_REDIS_SERVER, {"--maxmemory-policy", "noeviction"});
  const std::string filler(std::size_t{200} * 1024, 'x');
  for (int i = 0; i < 20; ++i) redis.Cli({"SET", test_util::Name("filler", i), filler});
  ASSERT_EQ(redis.Cli({"CONFIG", "SET", "maxmemory", "1mb"}), "+OK\r\n");
  auto t = Open({redis.url()}, "a");
  for (int i = 0; i < 10; ++i) t->PutAsync(KeyOf(static_cast<std::uint8_t>(100 + i)), Rows(16, 16, 1));
  AwaitWrites(*t, 10);
  const SharedTierStats s = t->Stats();
  EXPECT_EQ(s.write_drops, 10u);
  EXPECT_EQ(s.writes, 0u);
  EXPECT_EQ(s.errors.at("oom"), 10u);
  EXPECT_EQ(redis.Cli({"EXISTS", RedisKey("epd:v:", KeyOf(100))}), ":0\r\n");
  EXPECT_TRUE(t->Get(KeyOf(1)).ok());  // reads still answer
}

TEST(RedisTier, PasswordFromTheUrlIsUsedAndAWrongOneIsAnAuthError) {
  RedisServer redis(EPD_REDIS_SERVER, {"--requirepass", "pw123"});
  auto good = Open({test_util::Name("redis://:pw123@127.0.0.1:", redis.port())}, "a");
  EXPECT_TRUE(good->Get(KeyOf(7)).ok());
  auto bad = Open({test_util::Name("redis://:nope@127.0.0.1:", redis.port())}, "b");
  EXPECT_FALSE(bad->Get(KeyOf(7)).ok());
  EXPECT_GT(bad->Stats().errors.count("auth"), 0u);
  auto none = Open({test_util::Name("redis://127.0.0.1:", redis.port())}, "c");
  EXPECT_FALSE(none->Get(KeyOf(7)).ok());
}

TEST(RedisTier, KeysAreSpreadOverSeveralRedisServers) {
  RedisServer r1(EPD_REDIS_SERVER), r2(EPD_REDIS_SERVER);
  auto t = Open({r1.url(), r2.url()}, "a");
  for (int i = 0; i < 40; ++i) t->PutAsync(KeyOf(static_cast<std::uint8_t>(i)), Rows(1, 1, 1));
  AwaitWrites(*t, 40);
  const std::string n1 = r1.Cli({"DBSIZE"}), n2 = r2.Cli({"DBSIZE"});
  const long c1 = std::stol(n1.substr(1)), c2 = std::stol(n2.substr(1));
  EXPECT_EQ(c1 + c2, 40);
  EXPECT_GT(c1, 5);
  EXPECT_GT(c2, 5);
  for (int i = 0; i < 40; ++i) EXPECT_NE(*t->Get(KeyOf(static_cast<std::uint8_t>(i))), nullptr);
}

// Format 1 values with a correct checksum: what anyone who can write to the
// Redis plants. The rows are finite and of the right shape.
TEST(RedisTier, NanRowsOrADegenerateGridAreRejectedDeletedAndCounted) {
  RedisServer redis(EPD_REDIS_SERVER);
  auto t = Open({redis.url()}, "a");
  EmbeddingPtr nan = Rows(2, 2, 0xff);  // 0xffffffff: a NaN in every element
  auto zero = std::make_shared<Embedding>(*Rows(2, 2, 7));
  zero->grid = {0, 0, 0};
  redis.Cli({"SET", RedisKey("epd:v:", KeyOf(30)), EncodeL3Value(KeyOf(30), *nan, kContentKeyVersion)});
  redis.Cli({"SET", RedisKey("epd:v:", KeyOf(31)), EncodeL3Value(KeyOf(31), *zero, kContentKeyVersion)});
  EXPECT_EQ(*t->Get(KeyOf(30)), nullptr);
  EXPECT_EQ(*t->Get(KeyOf(31)), nullptr);
  EXPECT_EQ(t->Stats().corrupt, 2u);
  EXPECT_EQ(t->Stats().misses, 2u);
  EXPECT_EQ(redis.Cli({"EXISTS", RedisKey("epd:v:", KeyOf(30))}), ":0\r\n");
  EXPECT_EQ(redis.Cli({"EXISTS", RedisKey("epd:v:", KeyOf(31))}), ":0\r\n");
}

using test_util::TestKeyring;

std::string ValueIn(const RedisServer& redis, const ContentKey& key) {
  const std::string r = redis.Cli({"GET", RedisKey("epd:v:", key)});
  const std::size_t body = r.find("\r\n") + 2;
  return r[0] == '$' && r[1] != '-' ? r.substr(body, r.size() - body - 2) : std::string();
}

TEST(RedisTierKeyed, ForgedChecksummedValueIsRefusedDeletedAndReencodedAndAKeyedOneIsServed) {
  RedisServer redis(EPD_REDIS_SERVER);
  const auto ring = TestKeyring(1, 0x21);
  std::vector<std::string> log;
  auto t = Open({redis.url()}, "a", &log, ring);
  // Other rows under this key, with a correct XXH3 checksum and no MAC.
  redis.Cli({"SET", RedisKey("epd:v:", KeyOf(40)), EncodeL3Value(KeyOf(40), *Rows(2, 2, 9), kContentKeyVersion)});
  EXPECT_EQ(*t->Get(KeyOf(40)), nullptr);
  SharedTierStats s = t->Stats();
  EXPECT_EQ(s.auth_failures, 1u);
  EXPECT_EQ(s.corrupt, 0u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(redis.Cli({"EXISTS", RedisKey("epd:v:", KeyOf(40))}), ":0\r\n");
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("format 1 carries no MAC"), std::string::npos) << log[0];
  // The re-encode writes format 2, which another keyed process serves.
  t->PutAsync(KeyOf(40), Rows(2, 2, 7));
  AwaitWrites(*t, 1);
  EXPECT_EQ(t->Stats().write_bytes, kL3KeyedHeaderBytes + std::size_t{2} * 2 * 4);
  EXPECT_EQ(ValueIn(redis, KeyOf(40)).substr(4, 1), std::string(1, '\x02'));
  auto b = Open({redis.url()}, "b", nullptr, ring);
  StatusOr<EmbeddingPtr> got = b->Get(KeyOf(40));
  ASSERT_TRUE(got.ok());
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ((*got)->main, Rows(2, 2, 7)->main);
  // The same forgery made with the key is accepted: the MAC proves who
  // wrote it, not what (docs/L3.md, threat model).
  L3ValueOptions with_key;
  with_key.keyring = ring;
  redis.Cli(
      {"SET", RedisKey("epd:v:", KeyOf(41)), EncodeL3Value(KeyOf(41), *Rows(2, 2, 9), kContentKeyVersion, with_key)});
  StatusOr<EmbeddingPtr> keyed = b->Get(KeyOf(41));
  ASSERT_TRUE(keyed.ok());
  ASSERT_NE(*keyed, nullptr);
  EXPECT_EQ((*keyed)->main, Rows(2, 2, 9)->main);
  EXPECT_EQ(b->Stats().auth_failures, 0u);
}

TEST(RedisTierKeyed, ValueUnderTheOldKeyIsServedDuringARotationAndRefusedAfterIt) {
  RedisServer redis(EPD_REDIS_SERVER);
  auto before = Open({redis.url()}, "a", nullptr, TestKeyring(1, 0x21));
  before->PutAsync(KeyOf(42), Rows(3, 2, 5));
  AwaitWrites(*before, 1);
  auto during = Open({redis.url()}, "b", nullptr, TestKeyring(2, 0x22, std::make_pair(1u, std::uint8_t{0x21})));
  StatusOr<EmbeddingPtr> got = during->Get(KeyOf(42));
  ASSERT_TRUE(got.ok());
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ((*got)->main, Rows(3, 2, 5)->main);
  auto after = Open({redis.url()}, "c", nullptr, TestKeyring(2, 0x22));
  EXPECT_EQ(*after->Get(KeyOf(42)), nullptr);
  EXPECT_EQ(after->Stats().auth_failures, 1u);
  EXPECT_EQ(redis.Cli({"EXISTS", RedisKey("epd:v:", KeyOf(42))}), ":0\r\n");
}

TEST(RedisTierKeyed, ForgedCopiedOrReplayedLeaseIsDeletedAndTakenAndARealOneIsNot) {
  RedisServer redis(EPD_REDIS_SERVER);
  const auto ring = TestKeyring(1, 0x21);
  auto a = Open({redis.url()}, "server-a", nullptr, ring);
  auto b = Open({redis.url()}, "server-b", nullptr, ring);
  // A bare owner id (what a lease was before, and what a forger can write).
  redis.Cli({"SET", RedisKey("epd:lease:", KeyOf(50)), "server-x", "PX", "60000"});
  EXPECT_EQ(a->TryLease(KeyOf(50)), LeaseResult::kAcquired);
  EXPECT_EQ(a->Stats().lease_auth_failures, 1u);
  const std::string held = redis.Cli({"GET", RedisKey("epd:lease:", KeyOf(50))});
  const std::string value = held.substr(held.find("\r\n") + 2, held.size() - held.find("\r\n") - 4);
  StatusOr<std::string> owner = LeaseOwner(ring.get(), KeyOf(50), value, WallMsForTest());
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  EXPECT_EQ(*owner, "server-a");
  // That real lease holds b back, and is not counted as forged.
  EXPECT_EQ(b->TryLease(KeyOf(50)), LeaseResult::kHeldByOther);
  EXPECT_EQ(b->Stats().lease_auth_failures, 0u);
  EXPECT_EQ(a->TryLease(KeyOf(50)), LeaseResult::kHeldByUs);
  // Copied to another key: refused there.
  redis.Cli({"SET", RedisKey("epd:lease:", KeyOf(51)), value, "PX", "60000"});
  EXPECT_EQ(b->TryLease(KeyOf(51)), LeaseResult::kAcquired);
  // Replayed after its lifetime (a lease of a from long ago).
  const std::string old = *MakeLeaseValue(ring.get(), KeyOf(52), "server-a", WallMsForTest() - 60000);
  redis.Cli({"SET", RedisKey("epd:lease:", KeyOf(52)), old, "PX", "60000"});
  EXPECT_EQ(b->TryLease(KeyOf(52)), LeaseResult::kAcquired);
  EXPECT_EQ(b->Stats().lease_auth_failures, 2u);
  // b releases its own leases by their exact value.
  b->ReleaseAsync(KeyOf(51));
  b->ReleaseAsync(KeyOf(52));
  b->PutAsync(KeyOf(53), Rows(1, 1, 1));  // queued after the releases
  AwaitWrites(*b, 1);
  EXPECT_EQ(b->Stats().leases_released, 2u);
  EXPECT_EQ(redis.Cli({"EXISTS", RedisKey("epd:lease:", KeyOf(51))}), ":0\r\n");
}

// The worker's hook (issue 27, fault 3): a value the caller refuses is
// deleted while it is the one read, and survives once rewritten.
TEST(RedisTier, RejectAsyncDeletesTheValueReadButNotOneWrittenSince) {
  RedisServer redis(EPD_REDIS_SERVER);
  for (const bool keyed : {false, true}) {
    SCOPED_TRACE(keyed ? "keyed" : "checksummed");
    redis.Cli({"FLUSHALL"});
    const auto ring = keyed ? TestKeyring(1, 0x21) : nullptr;
    auto t = Open({redis.url()}, "a", nullptr, ring);
    auto w = Open({redis.url()}, "w", nullptr, ring);
    w->PutAsync(KeyOf(60), Rows(2, 3, 1));
    w->PutAsync(KeyOf(61), Rows(2, 3, 1));
    AwaitWrites(*w, 2);
    ASSERT_NE(*t->Get(KeyOf(60)), nullptr);
    ASSERT_NE(*t->Get(KeyOf(61)), nullptr);
    // 61 is rewritten (other rows) before the caller's refusal arrives.
    w->PutAsync(KeyOf(61), Rows(2, 3, 2));
    AwaitWrites(*w, 3);
    const std::string rewritten = ValueIn(redis, KeyOf(61));
    t->RejectAsync(KeyOf(60), "grid differs from the probe");
    t->RejectAsync(KeyOf(61), "grid differs from the probe");
    t->RejectAsync(KeyOf(62), "never read");  // only counted
    t->PutAsync(KeyOf(63), Rows(1, 1, 1));    // queued after the deletes
    AwaitWrites(*t, 1);
    EXPECT_EQ(redis.Cli({"EXISTS", RedisKey("epd:v:", KeyOf(60))}), ":0\r\n");
    EXPECT_EQ(ValueIn(redis, KeyOf(61)), rewritten);
    EXPECT_EQ(t->Stats().corrupt, 3u);
  }
}

}  // namespace
}  // namespace epd
