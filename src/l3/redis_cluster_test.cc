// The Redis Cluster protocol pieces (src/l3/redis_cluster.h) without a
// server: the key hash, hash tags, redirections, CLUSTER SLOTS replies and
// the redis-cluster:// URL. The expected slots were read from a real
// redis-server 7.0 in cluster mode (CLUSTER KEYSLOT <key>); the CRC16 check
// value is the one the Redis Cluster specification gives.
#include "redis_cluster.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <string>

namespace epd::internal {
namespace {

// A reply as hiredis parses it from RESP bytes.
Reply Parse(const std::string& resp) {
  redisReader* reader = redisReaderCreate();
  EXPECT_EQ(redisReaderFeed(reader, resp.data(), resp.size()), REDIS_OK);
  void* out = nullptr;
  EXPECT_EQ(redisReaderGetReply(reader, &out), REDIS_OK);
  redisReaderFree(reader);
  return Reply(static_cast<redisReply*>(out));
}

TEST(RedisCluster, Crc16OfTheSpecificationsCheckStringIs31C3) {
  EXPECT_EQ(Crc16("123456789"), 0x31C3);
  EXPECT_EQ(Crc16(""), 0);
}

TEST(RedisCluster, KeySlotMatchesClusterKeyslotOfARealServer) {
  EXPECT_EQ(KeySlot("123456789"), 12739);
  EXPECT_EQ(KeySlot("foo"), 12182);
  EXPECT_EQ(KeySlot("somekey"), 11058);
  EXPECT_EQ(KeySlot("{user1000}.following"), 3443);
  EXPECT_EQ(KeySlot("foo{}{bar}"), 8363);
  EXPECT_EQ(KeySlot("foo{{bar}}zap"), 4015);
  EXPECT_EQ(KeySlot("foo{bar}{zap}"), 5061);
  EXPECT_EQ(KeySlot("epd:v:{abc}"), 7638);
}

TEST(RedisCluster, HashTagIsTheFirstNonEmptyBracePair) {
  EXPECT_EQ(HashTag("{user1000}.following"), "user1000");
  EXPECT_EQ(HashTag("foo{bar}{zap}"), "bar");
  EXPECT_EQ(HashTag("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(HashTag("foo{}{bar}"), "foo{}{bar}");  // empty first tag: the whole key
  EXPECT_EQ(HashTag("foo{bar"), "foo{bar");        // no closing brace
  EXPECT_EQ(HashTag("plain"), "plain");
}

TEST(RedisCluster, ValueAndLeaseOfOneContentKeyShareASlot) {
  const std::string hex = "00ff3a9c";
  EXPECT_EQ(KeySlot("epd:v:{" + hex + "}"), KeySlot("epd:lease:{" + hex + "}"));
  EXPECT_EQ(KeySlot("tenant-b:v:{" + hex + "}"), KeySlot(hex));
}

TEST(RedisCluster, ParsesMovedAndAsk) {
  std::optional<Redirect> moved = ParseRedirect("MOVED 3999 127.0.0.1:6381");
  ASSERT_TRUE(moved.has_value());
  EXPECT_FALSE(moved->ask);
  EXPECT_EQ(moved->slot, 3999);
  EXPECT_EQ(moved->host, "127.0.0.1");
  EXPECT_EQ(moved->port, 6381);
  std::optional<Redirect> ask = ParseRedirect("ASK 16383 10.1.2.3:7000");
  ASSERT_TRUE(ask.has_value());
  EXPECT_TRUE(ask->ask);
  EXPECT_EQ(ask->slot, 16383);
  EXPECT_EQ(ask->host, "10.1.2.3");
  EXPECT_EQ(ask->port, 7000);
  std::optional<Redirect> unknown_endpoint = ParseRedirect("MOVED 0 :7001");
  ASSERT_TRUE(unknown_endpoint.has_value());
  EXPECT_EQ(unknown_endpoint->host, "");
  EXPECT_EQ(unknown_endpoint->port, 7001);
}

TEST(RedisCluster, RefusesMalformedRedirects) {
  EXPECT_FALSE(ParseRedirect("ERR unknown command").has_value());
  EXPECT_FALSE(ParseRedirect("TRYAGAIN Multiple keys request during rehashing of slot").has_value());
  EXPECT_FALSE(ParseRedirect("MOVED 16384 127.0.0.1:6381").has_value());
  EXPECT_FALSE(ParseRedirect("MOVED -1 127.0.0.1:6381").has_value());
  EXPECT_FALSE(ParseRedirect("MOVED 12 127.0.0.1").has_value());
  EXPECT_FALSE(ParseRedirect("MOVED 12 127.0.0.1:0").has_value());
  EXPECT_FALSE(ParseRedirect("MOVED 12").has_value());
  EXPECT_FALSE(ParseRedirect("ASKING").has_value());
}

TEST(RedisCluster, ReadsClusterSlotsWithItsReplicasAndUnknownEndpoints) {
  // Two ranges: the first with a replica and Redis 7's metadata map (as an
  // array in RESP2), the second with the endpoint "?" (unknown).
  const std::string resp =
      "*2\r\n"
      "*4\r\n:0\r\n:8191\r\n"
      "*4\r\n$9\r\n127.0.0.1\r\n:7000\r\n$4\r\nid-a\r\n*0\r\n"
      "*4\r\n$9\r\n127.0.0.1\r\n:7003\r\n$4\r\nid-d\r\n*0\r\n"
      "*3\r\n:8192\r\n:16383\r\n"
      "*3\r\n$1\r\n?\r\n:7001\r\n$4\r\nid-b\r\n";
  Reply r = Parse(resp);
  ASSERT_NE(r, nullptr);
  StatusOr<std::vector<SlotRange>> ranges = ParseClusterSlots(r.get(), "10.0.0.9");
  ASSERT_TRUE(ranges.ok()) << ranges.status().message();
  ASSERT_EQ(ranges->size(), 2u);
  EXPECT_EQ((*ranges)[0].first, 0);
  EXPECT_EQ((*ranges)[0].last, 8191);
  EXPECT_EQ((*ranges)[0].host, "127.0.0.1");
  EXPECT_EQ((*ranges)[0].port, 7000);  // the master, not the replica
  EXPECT_EQ((*ranges)[1].first, 8192);
  EXPECT_EQ((*ranges)[1].last, 16383);
  EXPECT_EQ((*ranges)[1].host, "10.0.0.9");
  EXPECT_EQ((*ranges)[1].port, 7001);
}

TEST(RedisCluster, RefusesMalformedClusterSlots) {
  Reply not_array = Parse("+OK\r\n");
  EXPECT_FALSE(ParseClusterSlots(not_array.get(), "h").ok());
  Reply short_entry = Parse("*1\r\n*2\r\n:0\r\n:5\r\n");
  StatusOr<std::vector<SlotRange>> s = ParseClusterSlots(short_entry.get(), "h");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("entry 0"), std::string::npos);
  Reply out_of_range = Parse("*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\nh\r\n:7000\r\n");
  EXPECT_FALSE(ParseClusterSlots(out_of_range.get(), "h").ok());
}

TEST(RedisCluster, ParsesSeedsWithSharedCredentials) {
  StatusOr<std::vector<RedisUrl>> seeds = ParseClusterUrl("redis-cluster://app:s3cret@10.0.0.1:7000,10.0.0.2:7001");
  ASSERT_TRUE(seeds.ok()) << seeds.status().message();
  ASSERT_EQ(seeds->size(), 2u);
  EXPECT_EQ((*seeds)[0].host, "10.0.0.1");
  EXPECT_EQ((*seeds)[0].port, 7000);
  EXPECT_EQ((*seeds)[1].host, "10.0.0.2");
  EXPECT_EQ((*seeds)[1].port, 7001);
  EXPECT_EQ((*seeds)[1].user, "app");
  EXPECT_EQ((*seeds)[1].password, "s3cret");
  EXPECT_EQ((*seeds)[1].db, 0);
}

TEST(RedisCluster, RefusesBadSeedsNamingWhatIsWrong) {
  auto message = [](const char* url) { return ParseClusterUrl(url).status().message(); };
  EXPECT_NE(message("redis://10.0.0.1:7000").find("redis-cluster://"), std::string::npos);
  EXPECT_NE(message("redis-cluster://").find("empty seed"), std::string::npos);
  EXPECT_NE(message("redis-cluster://a:7000,,b:7001").find("empty seed"), std::string::npos);
  EXPECT_NE(message("redis-cluster://a:7000/2").find("database 0 only"), std::string::npos);
  EXPECT_NE(message("redis-cluster://a:7000,a:7000").find("twice"), std::string::npos);
  EXPECT_NE(message("redis-cluster://a:70000").find("port"), std::string::npos);
}

}  // namespace
}  // namespace epd::internal
