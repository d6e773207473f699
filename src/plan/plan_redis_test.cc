// plan's L3 model against a real redis-server (src/testing/redis_server.h)
// written through the real RedisTier (epd/l3/redis_tier.h), the client a
// server runs:
//   - RedisChargeBytes (plan_tiers.h) against Redis's own `used_memory`
//     after thousands of values of 80 B to 40 kB, and after 32 of 4 and
//     5 MiB (production embeddings, 13.5 % over their bytes);
//   - plan's L3-only sizing (no L1, no L2) with `maxmemory` set to its L3
//     column: the values Redis holds are charged that column (within 2 %),
//     and it holds about as many as the model does (within 5 %; a model
//     charging the entries' bytes alone would hold 13 % more), and serves about
//     the hits predicted. Not closer: Redis's LRU clock ticks once a second
//     (LRU_CLOCK_RESOLUTION), and this test replaces its Redis's keys within
//     a second (the whole run takes a few), so Redis picks its victims among
//     keys of equal idle time, near at random: 1.5 to 2.7 points under the
//     exact LRU over five runs (the same with maxmemory-samples 64). A
//     production L3, whose keys stay minutes or hours, ranks them by recency.
// What the test does per request is what WorkerLoop does on an L1/L2 miss
// (src/worker/shared_tier_lookup.cc): Get; on a miss, TryLease, then
// PutAsync of the tower's result (which releases the lease).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "epd/l3/l3_value.h"
#include "epd/l3/redis_tier.h"
#include "epd/plan/plan.h"
#include "epd/plan/plan_tiers.h"
#include "redis_server.h"

namespace epd::plan {
namespace {

static_assert(kRedisL3ValueHeaderBytes == static_cast<std::int64_t>(kL3CostedHeaderBytes),
              "plan charges L3 values for the header the worker writes");

using test_util::RedisServer;

constexpr std::int64_t kHidden = 4;  // float32 rows: 16 bytes a token

ContentKey KeyOf(std::uint64_t k) {
  ContentKey key;
  key.bytes.fill(0x5a);
  for (int i = 0; i < 8; ++i) key.bytes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(k >> (8 * i));
  return key;
}

// An embedding of `bytes` (a multiple of 16) bytes of zeros, grid (1, 2, 2 x tokens) at merge 2.
EmbeddingPtr Rows(std::int64_t bytes) {
  auto e = std::make_shared<Embedding>();
  e->tokens = bytes / (kHidden * 4);
  e->hidden = kHidden;
  e->grid = {1, 2, 2 * e->tokens};
  e->main.assign(static_cast<std::size_t>(bytes), std::byte{0});
  return e;
}

std::shared_ptr<SharedTier> Open(const RedisServer& redis) {
  RedisTierOptions o;
  o.urls = {redis.url()};
  o.timeout = std::chrono::milliseconds(2000);
  o.lease = std::chrono::milliseconds(60000);
  StatusOr<std::shared_ptr<SharedTier>> t = OpenRedisTier(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? *t : nullptr;
}

// The integer in a reply line (":<n>\r\n"), or the field `name` of an INFO reply.
std::int64_t Integer(const std::string& reply) { return std::stoll(reply.substr(1)); }
std::int64_t InfoField(const RedisServer& redis, const std::string& section, const std::string& name) {
  const std::string info = redis.Cli({"INFO", section});
  const std::string field = "\r\n" + name + ":";
  const std::size_t at = info.find(field);
  if (at == std::string::npos) throw std::runtime_error("INFO has no " + name);
  return std::stoll(info.substr(at + name.size() + 3));
}

// Waits until the tier's writer has done `n` writes; returns false after 20 s.
bool AwaitWrites(const SharedTier& t, std::uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    const SharedTierStats s = t.Stats();
    if (s.writes + s.write_drops >= n) return s.write_drops == 0;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return false;
}

TEST(PlanRedisTest, UsedMemoryIsTheChargeOfTheValuesWritten) {
  RedisServer redis(EPD_REDIS_SERVER);
  std::shared_ptr<SharedTier> tier = Open(redis);
  ASSERT_NE(tier, nullptr);
  // One value first, so that the connections and their buffers are in the baseline.
  tier->PutAsync(KeyOf(0), Rows(64), 1e-3);
  ASSERT_TRUE(AwaitWrites(*tier, 1));
  const std::int64_t base = InfoField(redis, "memory", "used_memory") - RedisChargeBytes(64);
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::int64_t> tokens(5, 2500);  // 80 B to 40 kB of rows
  double charged = 0;
  const int n = 3000;
  for (int i = 1; i <= n; ++i) {
    const std::int64_t bytes = 16 * tokens(rng);
    tier->PutAsync(KeyOf(static_cast<std::uint64_t>(i)), Rows(bytes), 1e-3);
    charged += static_cast<double>(RedisChargeBytes(bytes));
  }
  ASSERT_TRUE(AwaitWrites(*tier, n + 1));
  // The value stored is the header and the rows.
  EXPECT_EQ(Integer(redis.Cli({"STRLEN", test_util::RedisKey("epd:v:", KeyOf(0))})), kRedisL3ValueHeaderBytes + 64);
  const double used = static_cast<double>(InfoField(redis, "memory", "used_memory") - base);
  // Within 0.4 %: the 184 bytes a key besides the value's string are 0.8 % of these values' mean charge.
  EXPECT_NEAR(used / charged, 1.0, 0.004) << "used_memory grew by " << used << " bytes; the model charges " << charged;
}

// Embeddings of production size (Qwen2.5-VL-7B, 7168 bytes a token): 560
// tokens fit 4 MiB, 600 tokens take 5 MiB, 22 % over their bytes. The
// writer's connection keeps a query buffer of the last value's size, so the
// baseline is taken after one such value.
TEST(PlanRedisTest, MegabyteValuesAreChargedTheirSizeClass) {
  RedisServer redis(EPD_REDIS_SERVER);
  std::shared_ptr<SharedTier> tier = Open(redis);
  ASSERT_NE(tier, nullptr);
  tier->PutAsync(KeyOf(0), Rows(std::int64_t{600} * 7168), 1e-3);
  ASSERT_TRUE(AwaitWrites(*tier, 1));
  const StatusOr<EmbeddingPtr> warm = tier->Get(KeyOf(0), nullptr);
  ASSERT_TRUE(warm.ok() && *warm != nullptr);
  redis.Cli({"DEL", test_util::RedisKey("epd:v:", KeyOf(0))});
  const std::int64_t base = InfoField(redis, "memory", "used_memory");
  double charged = 0, bytes = 0;
  std::uint64_t n = 1;
  for (const std::int64_t tokens : {560, 600}) {
    for (int i = 0; i < 16; ++i) {
      tier->PutAsync(KeyOf(++n), Rows(tokens * 7168), 1e-3);
      charged += static_cast<double>(RedisChargeBytes(tokens * 7168));
      bytes += static_cast<double>(tokens * 7168);
    }
  }
  ASSERT_TRUE(AwaitWrites(*tier, n));
  const double used = static_cast<double>(InfoField(redis, "memory", "used_memory") - base);
  EXPECT_NEAR(used / charged, 1.0, 0.01) << "used_memory grew by " << used << " bytes; the model charges " << charged
                                         << ", the rows are " << bytes;
}

// Zipf(0.9) over 3000 keys of 256 B to 20 kB, 30,000 requests, cost per byte spread 10x.
std::vector<CacheAccess> Workload() {
  std::mt19937_64 rng(26);
  const int keys = 3000;
  std::vector<double> popularity(keys);
  for (int r = 0; r < keys; ++r) popularity[static_cast<std::size_t>(r)] = std::pow(r + 1.0, -0.9);
  std::discrete_distribution<int> pick(popularity.begin(), popularity.end());
  std::uniform_int_distribution<std::int64_t> tokens(16, 1280);
  std::uniform_real_distribution<double> per_byte(1e-8, 1e-7);
  std::vector<std::int64_t> bytes(keys);
  std::vector<double> seconds(keys);
  for (std::size_t k = 0; k < bytes.size(); ++k) {
    bytes[k] = 16 * tokens(rng);
    seconds[k] = static_cast<double>(bytes[k]) * per_byte(rng);
  }
  std::vector<CacheAccess> out;
  for (int i = 0; i < 30000; ++i) {
    const auto k = static_cast<std::size_t>(pick(rng));
    out.push_back({0x1000 + k, bytes[k], seconds[k]});  // never KeyOf(1), the warm-up's
  }
  return out;
}

TEST(PlanRedisTest, AtPlansL3SizeRedisHoldsTheKeysAndServesTheHitsPredicted) {
  const std::vector<CacheAccess> trace = Workload();
  PlanOptions o;
  o.eviction = EvictionPolicy::kLru;
  o.l1_max_bytes = 0;  // L3 alone: Redis's maxmemory is the whole plan
  o.l2_max_bytes = 0;
  o.targets = {0.8};
  o.threads = 1;
  const PlanResult plan = RunPlan(trace, o);
  ASSERT_EQ(plan.rows.size(), 1u);
  const SizingRow& row = plan.rows[0];
  ASSERT_GT(row.l3_bytes, 0);
  ASSERT_TRUE(plan.replayed);
  const double predicted = row.replayed.Ratio(row.replayed.l3, Weighting::kSeconds);
  // The model's keys held at the end: the same replay, kept.
  TierReplayer model({0, 0, row.l3_bytes}, 1.0, o);
  for (const CacheAccess& a : trace) model.Access(a, false);

  RedisServer redis(EPD_REDIS_SERVER);
  std::shared_ptr<SharedTier> tier = Open(redis);
  ASSERT_NE(tier, nullptr);
  // The baseline: an empty Redis with the tier's connections (Get, lease,
  // writer) open and their buffers grown to the largest value, as on a
  // server that has run a while (about 100 kB here: 2 % of this Redis, noise
  // on one of gigabytes).
  std::int64_t largest = 0;
  for (const CacheAccess& a : trace) largest = std::max(largest, a.bytes);
  ASSERT_EQ(tier->TryLease(KeyOf(1)), LeaseResult::kAcquired);
  tier->PutAsync(KeyOf(1), Rows(largest), 1.0);
  ASSERT_TRUE(AwaitWrites(*tier, 1));
  const StatusOr<EmbeddingPtr> warm = tier->Get(KeyOf(1), nullptr);
  ASSERT_TRUE(warm.ok() && *warm != nullptr);
  redis.Cli({"DEL", test_util::RedisKey("epd:v:", KeyOf(1))});
  // Every command name used keeps a latency histogram (about 25 kB, Redis 7):
  // CONFIG's too, so the policy is set before the baseline is read.
  redis.Cli({"CONFIG", "SET", "maxmemory-policy", "allkeys-lru"});
  const std::int64_t base = InfoField(redis, "memory", "used_memory");
  const auto maxmemory = base + static_cast<std::int64_t>(row.l3_bytes);
  redis.Cli({"CONFIG", "SET", "maxmemory", std::to_string(maxmemory)});
  double hit = 0, total = 0;
  std::uint64_t writes = 1;
  for (const CacheAccess& a : trace) {
    total += a.seconds;
    const ContentKey key = KeyOf(a.key);
    const StatusOr<EmbeddingPtr> got = tier->Get(key, nullptr);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    if (*got != nullptr) {
      hit += a.seconds;
      continue;
    }
    ASSERT_EQ(tier->TryLease(key), LeaseResult::kAcquired);
    tier->PutAsync(key, Rows(a.bytes), a.seconds);
    ASSERT_TRUE(AwaitWrites(*tier, ++writes)) << "a write was dropped";
  }
  const double live = hit / total;
  // The values held (a lease key can outlive its write by a moment), and what the model charges for them.
  const std::int64_t keys = Integer(redis.Cli({"EVAL", "return #redis.call('KEYS', ARGV[1])", "0", "epd:v:*"}));
  std::unordered_map<std::uint64_t, std::int64_t> size_of;
  for (const CacheAccess& a : trace) size_of[a.key] = a.bytes;
  double held = 0;
  for (const auto& [k, b] : size_of) {
    if (Integer(redis.Cli({"EXISTS", test_util::RedisKey("epd:v:", KeyOf(k))})) == 1) {
      held += static_cast<double>(RedisChargeBytes(b));
    }
  }
  // Within 2 % (0.3 % under it over six runs: client buffers grow); a
  // model that charged the entries' bytes alone would be about 10 % under.
  EXPECT_NEAR(held, row.l3_bytes, 0.02 * row.l3_bytes)
      << "the values Redis holds at maxmemory " << maxmemory << " are charged " << held << " bytes";
  // What the model would say if Redis charged the entries' bytes alone.
  const double uncharged = row.l3_bytes / (plan.working_set_bytes / static_cast<double>(plan.distinct_keys));
  // The count varies more than the bytes: Redis, evicting near at random here (above), keeps another mix of
  // sizes (967 to 1,019 where the model holds 995, over two dozen runs).
  EXPECT_NEAR(static_cast<double>(keys), static_cast<double>(model.l3_entries()), 0.05 * model.l3_entries())
      << "Redis holds " << keys << " keys at maxmemory " << maxmemory << "; the model " << model.l3_entries()
      << " (charging entry bytes alone, about " << uncharged << ")";
  // Redis's LRU clock ticks once a second and the test replaces its keys
  // within seconds, so Redis evicts among keys of equal idle time: its hits
  // can only fall under exact LRU's (1.5 to 4.6 points under, docs/PLAN.md),
  // never rise far above them.
  EXPECT_LE(live, predicted + 0.02) << "Redis served " << live << " of encode seconds; plan predicted " << predicted;
  EXPECT_GE(live, predicted - 0.06) << "Redis served " << live << " of encode seconds; plan predicted " << predicted;
  EXPECT_NEAR(predicted, row.hit_ratio, 0.01) << "the row was sized for its target";
  EXPECT_EQ(tier->Stats().write_drops, 0u);
}

}  // namespace
}  // namespace epd::plan
