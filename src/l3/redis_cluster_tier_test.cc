// RedisTier (epd/l3/redis_tier.h) on a real Redis Cluster of three masters
// that each test forms on free loopback ports (src/testing/redis_test_cluster.h):
// a value and its lease land in one slot on the master serving it, MOVED
// and ASK are followed while a slot moves, a forged value planted on a node
// is refused as on a single Redis, and a dead master's failures are counted
// under its name while the other masters go on serving. Where a key lives is
// asked of the servers themselves (CLUSTER KEYSLOT, EXISTS on each node).
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "epd/l3/l3_value.h"
#include "epd/l3/redis_tier.h"
#include "epd/media/content_key.h"
#include "l3_test_util.h"
#include "redis_test_cluster.h"

namespace epd {
namespace {

using test_util::RedisCluster;
using test_util::TestKey;
using test_util::TestKeyring;

EmbeddingPtr Rows(std::int64_t tokens, std::int64_t hidden, std::uint8_t fill) {
  auto e = std::make_shared<Embedding>();
  e->tokens = tokens;
  e->hidden = hidden;
  e->grid = {1, 2, 2 * tokens};
  e->main.assign(static_cast<std::size_t>(tokens * hidden * 4), static_cast<std::byte>(fill));
  return e;
}

std::shared_ptr<SharedTier> Open(const RedisCluster& cluster, const std::string& owner,
                                 std::shared_ptr<const L3Keyring> keyring = TestKeyring(1, 0x21)) {
  RedisTierOptions o;
  o.urls = {cluster.url()};
  o.keyring = std::move(keyring);
  o.timeout = std::chrono::milliseconds(500);
  o.lease = std::chrono::milliseconds(60000);
  o.owner_id = owner;
  o.reconnect_min = std::chrono::milliseconds(1);
  o.reconnect_max = std::chrono::milliseconds(20);
  StatusOr<std::shared_ptr<SharedTier>> t = OpenRedisTier(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? *t : nullptr;
}

void AwaitWrites(const SharedTier& t, std::uint64_t n) {
  for (int i = 0; i < 2000; ++i) {
    const SharedTierStats s = t.Stats();
    if (s.writes + s.write_drops >= n) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  FAIL() << "the writer did not finish " << n << " writes";
}

std::string ValueKey(const ContentKey& k) { return "epd:v:{" + k.Hex() + "}"; }
std::string LeaseKey(const ContentKey& k) { return "epd:lease:{" + k.Hex() + "}"; }

// The slot of `redis_key`, as the cluster computes it.
int SlotOf(RedisCluster& c, const std::string& redis_key) {
  const std::string r = c.node(0).Cli({"CLUSTER", "KEYSLOT", redis_key});
  return std::stoi(r.substr(1));
}

// How many masters hold `redis_key` (EXISTS answers MOVED elsewhere).
int Holders(RedisCluster& c, const std::string& redis_key, int* holder = nullptr) {
  int n = 0;
  for (int i = 0; i < c.size(); ++i) {
    if (c.node(i).Cli({"EXISTS", redis_key}) == ":1\r\n") {
      ++n;
      if (holder != nullptr) *holder = i;
    }
  }
  return n;
}

TEST(RedisClusterTier, ValueAndLeaseShareASlotOnTheMasterServingIt) {
  RedisCluster cluster(EPD_REDIS_SERVER, 3);
  auto a = Open(cluster, "server-a");
  auto b = Open(cluster, "server-b");
  std::set<int> masters_used;
  for (std::uint8_t i = 1; i <= 6; ++i) {
    const ContentKey k = TestKey(i);
    const int slot = SlotOf(cluster, ValueKey(k));
    EXPECT_EQ(SlotOf(cluster, LeaseKey(k)), slot);
    ASSERT_EQ(a->TryLease(k), LeaseResult::kAcquired);
    int lease_holder = -1;
    EXPECT_EQ(Holders(cluster, LeaseKey(k), &lease_holder), 1);
    EXPECT_EQ(lease_holder, cluster.MasterOf(slot));
    EXPECT_EQ(b->TryLease(k), LeaseResult::kHeldByOther);
    a->PutAsync(k, Rows(2, 3, i));
    AwaitWrites(*a, i);
    int value_holder = -1;
    EXPECT_EQ(Holders(cluster, ValueKey(k), &value_holder), 1);
    EXPECT_EQ(value_holder, lease_holder);
    masters_used.insert(value_holder);
    StatusOr<EmbeddingPtr> got = b->Get(k);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_NE(*got, nullptr);
    EXPECT_EQ((*got)->main, Rows(2, 3, i)->main);
  }
  EXPECT_EQ(a->Stats().leases_released, 6u);  // the lease is gone once the value is in
  EXPECT_EQ(Holders(cluster, LeaseKey(TestKey(1))), 0);
  EXPECT_GE(masters_used.size(), 2u);
  EXPECT_EQ(b->Stats().redirects_moved, 0u);
  EXPECT_GE(b->Stats().slot_map_refreshes, 1u);
}

TEST(RedisClusterTier, FollowsMovedOnceTheSlotHasMoved) {
  RedisCluster cluster(EPD_REDIS_SERVER, 3);
  auto a = Open(cluster, "server-a");
  const ContentKey k = TestKey(20);
  a->PutAsync(k, Rows(2, 2, 5));
  AwaitWrites(*a, 1);
  ASSERT_NE(*a->Get(k), nullptr);  // the slot map is read and used
  const int slot = SlotOf(cluster, ValueKey(k));
  const int from = cluster.MasterOf(slot);
  const int to = (from + 1) % cluster.size();
  cluster.BeginMove(slot, from, to);
  cluster.Migrate(from, to, {ValueKey(k)});
  cluster.FinishMove(slot, to);
  StatusOr<EmbeddingPtr> got = a->Get(k);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ((*got)->main, Rows(2, 2, 5)->main);
  const SharedTierStats s = a->Stats();
  EXPECT_EQ(s.redirects_moved, 1u);
  EXPECT_EQ(s.errors.size(), 0u);
  int holder = -1;
  EXPECT_EQ(Holders(cluster, ValueKey(k), &holder), 1);
  EXPECT_EQ(holder, to);
  // The map now points there: no second redirection.
  ASSERT_NE(*a->Get(k), nullptr);
  EXPECT_EQ(a->Stats().redirects_moved, 1u);
}

TEST(RedisClusterTier, AnswersAskWithAskingWhileTheSlotMigrates) {
  RedisCluster cluster(EPD_REDIS_SERVER, 3);
  auto a = Open(cluster, "server-a");
  auto b = Open(cluster, "server-b");
  const ContentKey k = TestKey(30);
  EXPECT_EQ(*b->Get(k), nullptr);  // b's map is read before the move starts
  const int slot = SlotOf(cluster, ValueKey(k));
  const int from = cluster.MasterOf(slot);
  const int to = (from + 2) % cluster.size();
  cluster.BeginMove(slot, from, to);
  // A new key in a migrating slot is written on the importing node.
  a->PutAsync(k, Rows(3, 2, 8));
  AwaitWrites(*a, 1);
  EXPECT_EQ(a->Stats().writes, 1u);
  EXPECT_GE(a->Stats().redirects_ask, 1u);
  StatusOr<EmbeddingPtr> got = b->Get(k);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ((*got)->main, Rows(3, 2, 8)->main);
  EXPECT_EQ(b->Stats().redirects_ask, 1u);
  EXPECT_EQ(b->Stats().redirects_moved, 0u);  // ASK leaves the map alone
  cluster.FinishMove(slot, to);
  int holder = -1;
  EXPECT_EQ(Holders(cluster, ValueKey(k), &holder), 1);
  EXPECT_EQ(holder, to);
}

TEST(RedisClusterTier, ForgedValuePlantedOnItsNodeIsRefusedAndDeleted) {
  RedisCluster cluster(EPD_REDIS_SERVER, 3);
  const auto ring = TestKeyring(1, 0x21);
  auto a = Open(cluster, "server-a", ring);
  const ContentKey k = TestKey(40);
  const int node = cluster.MasterOf(SlotOf(cluster, ValueKey(k)));
  // Other rows with a correct checksum and no MAC, planted where the key lives.
  ASSERT_EQ(cluster.node(node).Cli({"SET", ValueKey(k), EncodeL3Value(k, *Rows(2, 2, 9), kContentKeyVersion)}),
            "+OK\r\n");
  StatusOr<EmbeddingPtr> got = a->Get(k);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, nullptr);
  EXPECT_EQ(a->Stats().auth_failures, 1u);
  EXPECT_EQ(Holders(cluster, ValueKey(k)), 0);
  // A value made with the cluster key on the same node is served.
  L3ValueOptions keyed;
  keyed.keyring = ring;
  cluster.node(node).Cli({"SET", ValueKey(k), EncodeL3Value(k, *Rows(2, 2, 9), kContentKeyVersion, keyed)});
  got = a->Get(k);
  ASSERT_TRUE(got.ok());
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ((*got)->main, Rows(2, 2, 9)->main);
}

TEST(RedisClusterTier, DeadMasterIsCountedByNodeWhileTheOthersServe) {
  RedisCluster cluster(EPD_REDIS_SERVER, 3);
  auto a = Open(cluster, "server-a");
  // One key on master 0 and one elsewhere, as the servers place them.
  ContentKey on_dead{}, on_live{};
  bool have_dead = false, have_live = false;
  for (std::uint8_t i = 50; i < 80 && !(have_dead && have_live); ++i) {
    const bool dead = cluster.MasterOf(SlotOf(cluster, ValueKey(TestKey(i)))) == 0;
    if (dead && !have_dead) on_dead = TestKey(i), have_dead = true;
    if (!dead && !have_live) on_live = TestKey(i), have_live = true;
  }
  ASSERT_TRUE(have_dead && have_live);
  a->PutAsync(on_live, Rows(1, 2, 3));
  AwaitWrites(*a, 1);
  cluster.node(0).Kill();
  EXPECT_FALSE(a->Get(on_dead).ok());
  const std::string dead_name = "127.0.0.1:" + std::to_string(cluster.node(0).port()) + "/0";
  SharedTierStats s = a->Stats();
  EXPECT_TRUE(s.degraded);
  ASSERT_EQ(s.node_errors.count(dead_name), 1u);
  EXPECT_GE(s.node_errors.at(dead_name), 1u);
  EXPECT_EQ(s.node_errors.size(), 1u);
  StatusOr<EmbeddingPtr> got = a->Get(on_live);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_NE(*got, nullptr);
}

TEST(RedisClusterTier, ClusterDownIsRetriedBoundedThenCountedAndTheSlotServesOnceBack) {
  RedisCluster cluster(EPD_REDIS_SERVER, 3);
  auto a = Open(cluster, "server-a");
  const ContentKey k = TestKey(90);
  a->PutAsync(k, Rows(1, 2, 4));
  AwaitWrites(*a, 1);
  const int slot = SlotOf(cluster, ValueKey(k));
  const int owner = cluster.MasterOf(slot);
  // The slot served by no node: its owner answers CLUSTERDOWN for it.
  ASSERT_EQ(cluster.node(owner).Cli({"CLUSTER", "DELSLOTS", std::to_string(slot)}), "+OK\r\n");
  StatusOr<EmbeddingPtr> down = a->Get(k);
  EXPECT_FALSE(down.ok());
  SharedTierStats s = a->Stats();
  EXPECT_EQ(s.errors.at("reply"), 1u);  // one failure after the retries, not one per retry
  EXPECT_EQ(s.node_errors.at("127.0.0.1:" + std::to_string(cluster.node(owner).port()) + "/0"), 1u);
  ASSERT_EQ(cluster.node(owner).Cli({"CLUSTER", "ADDSLOTS", std::to_string(slot)}), "+OK\r\n");
  StatusOr<EmbeddingPtr> back = a->Get(k);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_NE(*back, nullptr);
  EXPECT_EQ((*back)->main, Rows(1, 2, 4)->main);
}

// Four readers share one tier while the slot of half their keys moves
// between two masters, step by step: every read is a hit with its own rows.
TEST(RedisClusterTier, ReadersInParallelKeepHittingWhileTheirSlotMoves) {
  RedisCluster cluster(EPD_REDIS_SERVER, 3);
  auto a = Open(cluster, "server-a");
  const ContentKey moving = TestKey(100);
  const int slot = SlotOf(cluster, ValueKey(moving));
  const int from = cluster.MasterOf(slot);
  const int to = (from + 1) % cluster.size();
  std::vector<ContentKey> keys = {moving};
  for (std::uint8_t i = 101; keys.size() < 4; ++i) keys.push_back(TestKey(i));
  for (std::size_t i = 0; i < keys.size(); ++i) a->PutAsync(keys[i], Rows(1, 2, static_cast<std::uint8_t>(i)));
  AwaitWrites(*a, keys.size());
  std::atomic<bool> stop{false};
  std::atomic<int> misses{0}, failures{0}, reads{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      for (std::size_t n = static_cast<std::size_t>(t); !stop.load(); ++n) {
        const std::size_t i = n % keys.size();
        StatusOr<EmbeddingPtr> got = a->Get(keys[i]);
        ++reads;
        if (!got.ok()) {
          ++failures;
        } else if (*got == nullptr || (*got)->main != Rows(1, 2, static_cast<std::uint8_t>(i))->main) {
          ++misses;
        }
      }
    });
  }
  auto until_reads = [&](int n) {
    while (reads.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  until_reads(50);
  cluster.BeginMove(slot, from, to);
  until_reads(reads.load() + 50);
  cluster.Migrate(from, to, {ValueKey(moving)});
  until_reads(reads.load() + 50);
  cluster.FinishMove(slot, to);
  until_reads(reads.load() + 50);
  stop = true;
  for (std::thread& r : readers) r.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(misses.load(), 0);
  EXPECT_GE(a->Stats().redirects_moved + a->Stats().redirects_ask, 1u);
}

TEST(RedisClusterTier, OpenRefusesMixedUrlsAndABraceInThePrefix) {
  RedisTierOptions o;
  o.urls = {"redis-cluster://127.0.0.1:7000", "redis://127.0.0.1:6379"};
  StatusOr<std::shared_ptr<SharedTier>> t = OpenRedisTier(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("cannot be mixed"), std::string::npos);
  o.urls = {"redis-cluster://127.0.0.1:7000"};
  o.key_prefix = "epd{x}:";
  t = OpenRedisTier(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("brace"), std::string::npos);
  o.key_prefix = "epd:";
  o.urls = {"redis-cluster://127.0.0.1:7000/3"};
  EXPECT_FALSE(OpenRedisTier(o).ok());
}

}  // namespace
}  // namespace epd
