// Consistent hashing (epd/l3/l3_ring.h): keys spread evenly, adding a shard
// moves about 1/(N+1) of the keys and all of them to the new shard, removing
// one moves only its keys, and the order shards are listed in does not matter.
#include "epd/l3/l3_ring.h"

#include <gtest/gtest.h>

#include <random>

namespace epd {
namespace {

std::vector<ContentKey> RandomKeys(std::size_t n) {
  std::mt19937_64 rng(12345);
  std::vector<ContentKey> keys(n);
  for (ContentKey& k : keys) {
    for (auto& b : k.bytes) b = static_cast<std::uint8_t>(rng());
  }
  return keys;
}

std::vector<std::string> Names(int n) {
  std::vector<std::string> out;
  out.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out.push_back("10.0.0." + std::to_string(i + 1) + ":6379/0");
  return out;
}

TEST(HashRing, SpreadsKeysEvenly) {
  const HashRing ring(Names(4));
  const auto keys = RandomKeys(40000);
  std::vector<int> count(4, 0);
  for (const ContentKey& k : keys) ++count[ring.ShardFor(k)];
  for (int c : count) {
    EXPECT_GT(c, 10000 * 0.75) << "a shard got too few keys";
    EXPECT_LT(c, 10000 * 1.25) << "a shard got too many keys";
  }
}

TEST(HashRing, AddingAShardMovesAboutOneNthOfTheKeysAllToIt) {
  const HashRing three(Names(3));
  const HashRing four(Names(4));
  const auto keys = RandomKeys(40000);
  int moved = 0;
  for (const ContentKey& k : keys) {
    const std::string before = three.names()[three.ShardFor(k)];
    const std::string after = four.names()[four.ShardFor(k)];
    if (before != after) {
      ++moved;
      EXPECT_EQ(after, Names(4)[3]) << "a key moved between two old shards";
    }
  }
  // Expected 1/4 of the keys; modulo hashing would move 3/4.
  EXPECT_GT(moved, 40000 * 0.18);
  EXPECT_LT(moved, 40000 * 0.32);
}

TEST(HashRing, RemovingAShardMovesOnlyItsKeys) {
  const HashRing four(Names(4));
  std::vector<std::string> three_names = Names(4);
  three_names.erase(three_names.begin() + 1);
  const HashRing three(three_names);
  for (const ContentKey& k : RandomKeys(20000)) {
    const std::string before = four.names()[four.ShardFor(k)];
    const std::string after = three.names()[three.ShardFor(k)];
    if (before != Names(4)[1]) {
      EXPECT_EQ(before, after);
    }
  }
}

TEST(HashRing, ListingOrderDoesNotMatter) {
  std::vector<std::string> a = Names(5);
  std::vector<std::string> b(a.rbegin(), a.rend());
  const HashRing ra(a), rb(b);
  for (const ContentKey& k : RandomKeys(5000)) EXPECT_EQ(ra.names()[ra.ShardFor(k)], rb.names()[rb.ShardFor(k)]);
}

TEST(HashRing, OneShardTakesEverything) {
  const HashRing ring({"only:6379/0"});
  for (const ContentKey& k : RandomKeys(100)) EXPECT_EQ(ring.ShardFor(k), 0u);
}

TEST(HashRing, NoShardsIsAnError) { EXPECT_THROW(HashRing({}), Error); }

}  // namespace
}  // namespace epd
