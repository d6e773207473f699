// WorkerLoop with a shared tier on a real redis-server (each test starts its
// own): several loops stand for several encode servers. What one encodes,
// another serves as an L3 hit with the exact bytes FakeTower gives that
// image; the cluster-wide lease makes one loop encode a key that several ask
// for at once; a lapsed lease is taken over; a Redis that is killed,
// full or holding a corrupt value never fails a request; and with a cluster
// key a forged value is re-encoded and a forged lease stalls nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <limits>
#include <thread>

#include "epd/l3/l3_value.h"
#include "epd/l3/redis_tier.h"
#include "epd/media/content_key.h"
#include "epd/worker/worker_loop.h"
#include "l3_test_util.h"
#include "redis_server.h"
#include "test_names.h"
#include "worker_test_util.h"

namespace epd {
namespace {

using test_util::RedisKey;
using test_util::RedisServer;
using testing::Expected;
using testing::ExpectSameEmbedding;
using testing::FakeTower;
using testing::FakeTowerState;
using testing::Png;
using testing::Request;

struct Node {
  std::shared_ptr<FakeTowerState> tower = std::make_shared<FakeTowerState>();
  std::shared_ptr<SharedTier> tier;
  std::unique_ptr<WorkerLoop> loop;
};

RedisTierOptions TierOptions(const RedisServer& redis, const std::string& owner) {
  RedisTierOptions o;
  o.urls = {redis.url()};
  o.owner_id = owner;
  o.timeout = std::chrono::milliseconds(500);
  o.lease = std::chrono::milliseconds(30000);
  o.wait.wait = std::chrono::milliseconds(30000);
  o.reconnect_min = std::chrono::milliseconds(1);
  o.reconnect_max = std::chrono::milliseconds(20);
  return o;
}

std::unique_ptr<Node> MakeNode(RedisTierOptions o) {
  auto n = std::make_unique<Node>();
  StatusOr<std::shared_ptr<SharedTier>> tier = OpenRedisTier(std::move(o));
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  n->tier = *tier;
  WorkerOptions wo;
  wo.model_id = "test-model";
  wo.shared_tier = n->tier;
  auto w = EncodeWorker::Create(std::move(wo), std::make_unique<FakeTower>(testing::FakeTowerOptions{}, n->tower));
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  n->loop = std::make_unique<WorkerLoop>(std::move(*w));
  return n;
}

ContentKey KeyOf(const std::string& media) {
  WorkerOptions wo;
  wo.model_id = "test-model";
  auto w = EncodeWorker::Create(wo, std::make_unique<FakeTower>());
  return *(*w)->ItemKeys(Request("k", {media}))[0];
}

RequestResult EncodeOne(Node& n, const std::string& id, const std::string& media) {
  return n.loop->Submit(Request(id, {media})).get();
}

// Bounded wait for the node's writer to have written `n` values.
void AwaitWrites(const Node& node, std::uint64_t n) {
  for (int i = 0; i < 2000 && node.loop->SharedTierStatsSnapshot().writes < n; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(node.loop->SharedTierStatsSnapshot().writes, n);
}

// `img`, whose stored value `n` must refuse: encoded by n's tower with its
// own rows, the refusal counted in `counter`, and written back.
void ExpectRefusedAndReencoded(Node& n, const std::string& img, std::uint64_t SharedTierStats::*counter) {
  RequestResult r = EncodeOne(n, "r", img);
  ASSERT_TRUE(r.all_ok());
  EXPECT_EQ(r.items[0].source, ItemSource::kMiss);
  ExpectSameEmbedding(*r.items[0].embedding, Expected(img));
  EXPECT_EQ(n.loop->SharedTierStatsSnapshot().*counter, 1u);
  EXPECT_EQ(n.tower->items_encoded(), 1);
  AwaitWrites(n, 1);
}

TEST(WorkerLoopL3, SecondServerServesWhatTheFirstEncodedAsAnL3Hit) {
  RedisServer redis(EPD_REDIS_SERVER);
  auto a = MakeNode(TierOptions(redis, "a"));
  auto b = MakeNode(TierOptions(redis, "b"));
  const std::string img = Png(56, 84, 1);
  RequestResult ra = EncodeOne(*a, "r1", img);
  ASSERT_TRUE(ra.all_ok()) << ra.status.ToString();
  EXPECT_EQ(ra.items[0].source, ItemSource::kMiss);
  AwaitWrites(*a, 1);
  RequestResult rb = EncodeOne(*b, "r1", img);
  ASSERT_TRUE(rb.all_ok()) << rb.items[0].status.ToString();
  EXPECT_EQ(rb.items[0].source, ItemSource::kL3);
  ExpectSameEmbedding(*rb.items[0].embedding, Expected(img));
  EXPECT_EQ(b->tower->items_encoded(), 0);
  // Promoted into b's L1: the next request is a local hit, no Redis call.
  const std::uint64_t gets = b->loop->SharedTierStatsSnapshot().gets;
  RequestResult again = EncodeOne(*b, "r2", img);
  EXPECT_EQ(again.items[0].source, ItemSource::kL1);
  EXPECT_EQ(b->loop->SharedTierStatsSnapshot().gets, gets);
  const WorkerStats ws = b->loop->Stats();
  EXPECT_EQ(ws.hits_l3, 1u);
  EXPECT_EQ(ws.hits_l1, 1u);
  EXPECT_EQ(ws.misses, 0u);
}

TEST(WorkerLoopL3, ManyRequestsForOneNewKeyCostOneLookup) {
  RedisServer redis(EPD_REDIS_SERVER);
  auto a = MakeNode(TierOptions(redis, "a"));
  auto b = MakeNode(TierOptions(redis, "b"));
  const std::string img = Png(56, 56, 8);
  ASSERT_TRUE(EncodeOne(*a, "w", img).all_ok());
  AwaitWrites(*a, 1);
  std::vector<std::future<RequestResult>> futures;
  futures.reserve(8);
  for (int i = 0; i < 8; ++i) futures.push_back(b->loop->Submit(Request(test_util::Name("r", i), {img})));
  for (auto& f : futures) {
    RequestResult r = f.get();
    ASSERT_TRUE(r.all_ok());
    ExpectSameEmbedding(*r.items[0].embedding, Expected(img));
  }
  // Whether the later requests came while the first was looked up (they
  // follow its lookup) or after (L1 hits), Redis is asked once.
  EXPECT_EQ(b->loop->SharedTierStatsSnapshot().gets, 1u);
  EXPECT_EQ(b->loop->Stats().hits_l3, 1u);
  EXPECT_EQ(b->loop->Stats().hits_l1, 7u);
  EXPECT_EQ(b->tower->items_encoded(), 0);
}

TEST(WorkerLoopL3, WaiterGetsTheLeaseHoldersValueAndItsTowerNeverRuns) {
  RedisServer redis(EPD_REDIS_SERVER);
  auto a = MakeNode(TierOptions(redis, "a"));
  auto b = MakeNode(TierOptions(redis, "b"));
  auto c = MakeNode(TierOptions(redis, "c"));
  const std::string img = Png(56, 56, 2);
  a->tower->Close();  // a holds the lease while its tower is stuck
  std::future<RequestResult> fa = a->loop->Submit(Request("r", {img}));
  a->tower->WaitForEncodes(1);
  std::future<RequestResult> fb = b->loop->Submit(Request("r", {img}));
  std::future<RequestResult> fc = c->loop->Submit(Request("r", {img}));
  // Both wait on a's lease (bounded wait for them to be seen waiting).
  for (int i = 0; i < 2000; ++i) {
    if (b->loop->SharedTierStatsSnapshot().lease_waits == 1 && c->loop->SharedTierStatsSnapshot().lease_waits == 1)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(b->loop->SharedTierStatsSnapshot().lease_waits, 1u);
  a->tower->Open();
  RequestResult ra = fa.get(), rb = fb.get(), rc = fc.get();
  ASSERT_TRUE(ra.all_ok() && rb.all_ok() && rc.all_ok());
  EXPECT_EQ(ra.items[0].source, ItemSource::kMiss);
  EXPECT_EQ(rb.items[0].source, ItemSource::kL3);
  EXPECT_EQ(rc.items[0].source, ItemSource::kL3);
  ExpectSameEmbedding(*rc.items[0].embedding, Expected(img));
  EXPECT_EQ(a->tower->items_encoded() + b->tower->items_encoded() + c->tower->items_encoded(), 1);
  EXPECT_EQ(b->loop->SharedTierStatsSnapshot().lease_wait_hits, 1u);
}

TEST(WorkerLoopL3, SameImagesSentToThreeServersAtOnceAreEncodedOnceInTotal) {
  RedisServer redis(EPD_REDIS_SERVER);
  std::vector<std::unique_ptr<Node>> nodes;
  for (const char* id : {"a", "b", "c"}) nodes.push_back(MakeNode(TierOptions(redis, id)));
  std::vector<std::string> images;
  images.reserve(6);
  for (int i = 0; i < 6; ++i) images.push_back(Png(56, 56, 10 + i));
  std::vector<std::future<RequestResult>> futures;
  for (int i = 0; i < 6; ++i) {
    for (auto& n : nodes) futures.push_back(n->loop->Submit(Request(test_util::Name("r", i), {images[i]})));
  }
  for (auto& f : futures) ASSERT_TRUE(f.get().all_ok());
  std::uint64_t misses = 0, l3 = 0;
  std::int64_t encoded = 0;
  for (auto& n : nodes) {
    misses += n->loop->Stats().misses;
    l3 += n->loop->Stats().hits_l3;
    encoded += n->tower->items_encoded();
  }
  EXPECT_EQ(misses, 6u) << "each distinct image must run the tower exactly once in the cluster";
  EXPECT_EQ(encoded, 6);
  EXPECT_EQ(l3, 12u);
}

TEST(WorkerLoopL3, LapsedLeaseOfACrashedHolderIsTakenOver) {
  RedisServer redis(EPD_REDIS_SERVER);
  const std::string img = Png(56, 56, 3);
  // A holder that died: its lease lapses after 300 ms (Redis's clock).
  redis.Cli({"SET", RedisKey("epd:lease:", KeyOf(img)), "crashed-server", "PX", "300"});
  auto b = MakeNode(TierOptions(redis, "b"));
  RequestResult rb = EncodeOne(*b, "r", img);
  ASSERT_TRUE(rb.all_ok());
  EXPECT_EQ(rb.items[0].source, ItemSource::kMiss);
  ExpectSameEmbedding(*rb.items[0].embedding, Expected(img));
  const SharedTierStats s = b->loop->SharedTierStatsSnapshot();
  EXPECT_EQ(s.lease_waits, 1u);
  EXPECT_EQ(s.lease_takeovers, 1u);
  EXPECT_EQ(s.lease_wait_timeouts, 0u);
}

TEST(WorkerLoopL3, WaitEndsAfterThePolicysDeadlineAndEncodesLocally) {
  RedisServer redis(EPD_REDIS_SERVER);
  const std::string img = Png(56, 56, 4);
  redis.Cli({"SET", RedisKey("epd:lease:", KeyOf(img)), "stuck-server", "PX", "600000"});
  RedisTierOptions o = TierOptions(redis, "b");
  o.wait.wait = std::chrono::milliseconds(100);
  auto b = MakeNode(o);
  RequestResult rb = EncodeOne(*b, "r", img);
  ASSERT_TRUE(rb.all_ok());
  EXPECT_EQ(rb.items[0].source, ItemSource::kMiss);
  EXPECT_EQ(b->loop->SharedTierStatsSnapshot().lease_wait_timeouts, 1u);
}

TEST(WorkerLoopL3, CancelEndsAWaitOnAnotherServersLease) {
  RedisServer redis(EPD_REDIS_SERVER);
  const std::string img = Png(56, 56, 5);
  redis.Cli({"SET", RedisKey("epd:lease:", KeyOf(img)), "stuck-server", "PX", "600000"});
  auto b = MakeNode(TierOptions(redis, "b"));  // would wait 30 s
  std::future<RequestResult> f = b->loop->Submit(Request("r", {img}));
  for (int i = 0; i < 2000 && b->loop->SharedTierStatsSnapshot().lease_waits == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  b->loop->Cancel("r");
  RequestResult r = f.get();
  EXPECT_EQ(r.status.code(), StatusCode::kCancelled);
  EXPECT_EQ(b->tower->items_encoded(), 0);
}

TEST(WorkerLoopL3, CorruptValueIsRejectedReencodedAndRewritten) {
  RedisServer redis(EPD_REDIS_SERVER);
  const std::string img = Png(56, 56, 6);
  const ContentKey key = KeyOf(img);
  std::string bad = EncodeL3Value(key, Expected(img), kContentKeyVersion);
  bad[bad.size() / 2] ^= 0x40;
  redis.Cli({"SET", RedisKey("epd:v:", key), bad});
  auto a = MakeNode(TierOptions(redis, "a"));
  ExpectRefusedAndReencoded(*a, img, &SharedTierStats::corrupt);
  auto b = MakeNode(TierOptions(redis, "b"));
  RequestResult rb = EncodeOne(*b, "r", img);
  EXPECT_EQ(rb.items[0].source, ItemSource::kL3);
  ExpectSameEmbedding(*rb.items[0].embedding, Expected(img));
}

TEST(WorkerLoopL3, KilledRedisFallsBackToTheLocalTiersAndRestartedRedisIsUsedAgain) {
  RedisServer redis(EPD_REDIS_SERVER);
  auto a = MakeNode(TierOptions(redis, "a"));
  const std::string warm = Png(56, 56, 7);
  ASSERT_TRUE(EncodeOne(*a, "w", warm).all_ok());
  redis.Kill();
  // Served by L1 and by the tower; nothing fails.
  RequestResult hit = EncodeOne(*a, "h", warm);
  ASSERT_TRUE(hit.all_ok());
  EXPECT_EQ(hit.items[0].source, ItemSource::kL1);
  for (int i = 0; i < 3; ++i) {
    RequestResult r = EncodeOne(*a, test_util::Name("m", i), Png(56, 56, 20 + i));
    ASSERT_TRUE(r.all_ok()) << r.items[0].status.ToString();
    EXPECT_EQ(r.items[0].source, ItemSource::kMiss);
  }
  SharedTierStats down = a->loop->SharedTierStatsSnapshot();
  EXPECT_TRUE(down.degraded);
  std::uint64_t errors = 0;
  for (const auto& [kind, n] : down.errors) errors += n;
  EXPECT_GT(errors, 0u);

  redis.Restart();  // empty: nothing was persisted
  const std::string fresh = Png(56, 56, 30);
  // The first call after the backoff reconnects; retry until a write lands.
  for (int i = 0; i < 200 && a->loop->SharedTierStatsSnapshot().writes == 0; ++i) {
    ASSERT_TRUE(EncodeOne(*a, test_util::Name("f", i), Png(56, 56, 40 + i)).all_ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(EncodeOne(*a, "fresh", fresh).all_ok());
  AwaitWrites(*a, 2);
  auto b = MakeNode(TierOptions(redis, "b"));
  RequestResult rb = EncodeOne(*b, "fresh", fresh);
  EXPECT_EQ(rb.items[0].source, ItemSource::kL3);
  EXPECT_FALSE(a->loop->SharedTierStatsSnapshot().degraded);
}

TEST(WorkerLoopL3, FullRedisRefusesWritesAndServingGoesOn) {
  RedisServer redis(EPD_REDIS_SERVER, {"--maxmemory-policy", "noeviction"});
  // 4 MB of other data, then a 1 MB limit: every write is refused (OOM).
  const std::string filler(std::size_t{200} * 1024, 'x');
  for (int i = 0; i < 20; ++i) redis.Cli({"SET", test_util::Name("filler", i), filler});
  ASSERT_EQ(redis.Cli({"CONFIG", "SET", "maxmemory", "1mb"}), "+OK\r\n");
  auto a = MakeNode(TierOptions(redis, "a"));
  for (int i = 0; i < 4; ++i) {
    RequestResult r = EncodeOne(*a, test_util::Name("r", i), Png(56, 56, 50 + i));
    ASSERT_TRUE(r.all_ok());
  }
  for (int i = 0; i < 2000 && a->loop->SharedTierStatsSnapshot().write_drops < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const SharedTierStats s = a->loop->SharedTierStatsSnapshot();
  EXPECT_EQ(s.write_drops, 4u);
  EXPECT_EQ(s.writes, 0u);
  EXPECT_GT(s.errors.count("oom"), 0u);
  EXPECT_EQ(a->loop->Stats().misses, 4u);
}

std::shared_ptr<const L3Keyring> ClusterKey() { return test_util::TestKeyring(9, 0x3c); }

// A forged value: another image's rows under this image's key, with a
// correct checksum (issue 25: 5 of 5 such values were served).
TEST(WorkerLoopL3, ForgedValueIsServedWithoutAKeyAndRefusedAndReencodedWithOne) {
  RedisServer redis(EPD_REDIS_SERVER);
  const std::string img = Png(56, 56, 60), other = Png(56, 56, 61);
  const ContentKey key = KeyOf(img);
  const std::string forged = EncodeL3Value(key, Expected(other), kContentKeyVersion);
  // Today's exposure, the control: an unkeyed server serves the forgery.
  redis.Cli({"SET", RedisKey("epd:v:", key), forged});
  auto open = MakeNode(TierOptions(redis, "open"));
  RequestResult served = EncodeOne(*open, "r", img);
  ASSERT_TRUE(served.all_ok());
  EXPECT_EQ(served.items[0].source, ItemSource::kL3);
  ExpectSameEmbedding(*served.items[0].embedding, Expected(other));

  RedisTierOptions o = TierOptions(redis, "a");
  o.keyring = ClusterKey();
  auto a = MakeNode(o);
  ExpectRefusedAndReencoded(*a, img, &SharedTierStats::auth_failures);
  o.owner_id = "b";
  auto b = MakeNode(o);
  RequestResult rb = EncodeOne(*b, "r", img);
  EXPECT_EQ(rb.items[0].source, ItemSource::kL3);
  ExpectSameEmbedding(*rb.items[0].embedding, Expected(img));
}

// A forged lease held a key back for the whole wait (12 s by default) before
// the MAC (WaitEndsAfterThePolicysDeadlineAndEncodesLocally is that
// behaviour, without a key); with a key it is deleted and taken at once.
TEST(WorkerLoopL3, ForgedLeaseDoesNotStallAKeyedServer) {
  RedisServer redis(EPD_REDIS_SERVER);
  const std::string img = Png(56, 56, 62);
  redis.Cli({"SET", RedisKey("epd:lease:", KeyOf(img)), "forged-holder", "PX", "600000"});
  RedisTierOptions o = TierOptions(redis, "a");  // would wait 30 s
  o.keyring = ClusterKey();
  auto a = MakeNode(o);
  RequestResult ra = EncodeOne(*a, "r", img);
  ASSERT_TRUE(ra.all_ok());
  EXPECT_EQ(ra.items[0].source, ItemSource::kMiss);
  const SharedTierStats s = a->loop->SharedTierStatsSnapshot();
  EXPECT_EQ(s.lease_auth_failures, 1u);
  EXPECT_EQ(s.lease_waits, 0u);
  EXPECT_EQ(s.leases_acquired, 1u);
  EXPECT_EQ(a->tower->items_encoded(), 1);
}

// Issue 27, fault 3: values the tier itself accepts (checksummed or
// authentic, and self-consistent) that do not match what the request
// predicts. Planted for `img`, such a value must be refused by the worker
// (adopt_rejections, and the tier's `corrupt` through RejectAsync), deleted
// from Redis while the item's re-encode still waits on the tower, and
// re-encoded with a fresh encode's rows, which are then written back.
// `by_worker` false: the tier's own decode refuses it (NaN rows).
void ExpectPlantedValueRefused(RedisServer& redis, Node& n, const std::string& img, const std::string& value,
                               bool by_worker = true) {
  const std::string k = RedisKey("epd:v:", KeyOf(img));
  redis.Cli({"SET", k, value});
  n.tower->Close();
  std::future<RequestResult> f = n.loop->Submit(Request("r", {img}));
  n.tower->WaitForEncodes(1);  // the item went on as a miss
  for (int i = 0; i < 2000 && redis.Cli({"EXISTS", k}) != ":0\r\n"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(redis.Cli({"EXISTS", k}), ":0\r\n") << "the refused value must leave the tier";
  n.tower->Open();
  RequestResult r = f.get();
  ASSERT_TRUE(r.all_ok()) << r.items[0].status.ToString();
  EXPECT_EQ(r.items[0].source, ItemSource::kMiss);
  ExpectSameEmbedding(*r.items[0].embedding, Expected(img));
  EXPECT_EQ(n.tower->items_encoded(), 1);
  EXPECT_EQ(n.loop->Stats().adopt_rejections, by_worker ? 1u : 0u);
  EXPECT_EQ(n.loop->Stats().hits_l3, 0u);
  EXPECT_EQ(n.loop->SharedTierStatsSnapshot().corrupt, 1u);
  AwaitWrites(n, 1);
  EXPECT_EQ(redis.Cli({"EXISTS", k}), ":1\r\n") << "the re-encode is written back";
}

std::string Planted(const std::string& img, const Embedding& e, std::shared_ptr<const L3Keyring> ring = nullptr) {
  L3ValueOptions o;
  o.keyring = std::move(ring);
  return EncodeL3Value(KeyOf(img), e, kContentKeyVersion, o);
}

TEST(WorkerLoopL3, ValueWithTheRightTokensButAnotherGridIsRefusedDeletedAndReencoded) {
  RedisServer redis(EPD_REDIS_SERVER);
  const std::string img = Png(56, 56, 70);  // grid (1, 4, 4): 4 tokens
  Embedding e = Expected(img);
  e.grid = {1, 2, 8};  // 4 tokens too
  auto a = MakeNode(TierOptions(redis, "a"));
  ExpectPlantedValueRefused(redis, *a, img, Planted(img, e));
  // What the tier holds now is the fresh encode: another server serves it.
  auto b = MakeNode(TierOptions(redis, "b"));
  RequestResult rb = EncodeOne(*b, "r", img);
  EXPECT_EQ(rb.items[0].source, ItemSource::kL3);
  ExpectSameEmbedding(*rb.items[0].embedding, Expected(img));
}

TEST(WorkerLoopL3, ValueWithNaNRowsIsRefusedDeletedAndReencoded) {
  RedisServer redis(EPD_REDIS_SERVER);
  const std::string img = Png(56, 56, 71);
  Embedding e = Expected(img);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(e.main.data() + 4, &nan, sizeof nan);
  auto a = MakeNode(TierOptions(redis, "a"));
  ExpectPlantedValueRefused(redis, *a, img, Planted(img, e), /*by_worker=*/false);
}

TEST(WorkerLoopL3, ValueOfAnotherDtypeIsRefusedDeletedAndReencoded) {
  RedisServer redis(EPD_REDIS_SERVER);
  const std::string img = Png(56, 56, 72);
  auto a = MakeNode(TierOptions(redis, "a"));
  ExpectPlantedValueRefused(redis, *a, img, Planted(img, Expected(img, {.dtype = DType::kBFloat16})));
}

TEST(WorkerLoopL3, ValueWithAnotherDeepstackCountIsRefusedDeletedAndReencoded) {
  RedisServer redis(EPD_REDIS_SERVER);
  const std::string img = Png(56, 56, 73);
  auto a = MakeNode(TierOptions(redis, "a"));
  ExpectPlantedValueRefused(redis, *a, img, Planted(img, Expected(img, {.deepstack_layers = 3})));
}

// A server of another configuration (hidden size 16) holds the cluster key:
// its value is authentic, and still not this server's to serve.
TEST(WorkerLoopL3, AuthenticValueFromAnotherHiddenSizeIsRefusedDeletedAndReencoded) {
  RedisServer redis(EPD_REDIS_SERVER);
  const std::string img = Png(56, 56, 74);
  RedisTierOptions o = TierOptions(redis, "a");
  o.keyring = ClusterKey();
  auto a = MakeNode(o);
  ExpectPlantedValueRefused(redis, *a, img, Planted(img, Expected(img, {.hidden = 16}), ClusterKey()));
  EXPECT_EQ(a->loop->SharedTierStatsSnapshot().auth_failures, 0u);
}

// Issue 26: the encode cost measured where a value was encoded travels with
// it through L3 (the value's cost field) and is what its adoptions save.
TEST(WorkerLoopL3, AnAdoptedValueCarriesTheCostMeasuredWhereItWasEncoded) {
  RedisServer redis(EPD_REDIS_SERVER);
  auto a = MakeNode(TierOptions(redis, "a"));
  const std::string img = Png(56, 84, 75);
  RequestResult ra = EncodeOne(*a, "r", img);
  ASSERT_TRUE(ra.all_ok());
  const double cost = a->loop->Stats().miss_seconds;
  ASSERT_GT(cost, 0);
  EXPECT_EQ(ra.items[0].encode_seconds, cost);
  AwaitWrites(*a, 1);
  // The stored value's cost field, read with the codec.
  const std::string reply = redis.Cli({"GET", RedisKey("epd:v:", KeyOf(img))});
  const std::size_t body = reply.find("\r\n") + 2;
  const std::string value = reply.substr(body, reply.size() - body - 2);
  double stored = 0;
  ASSERT_TRUE(DecodeL3Value(value, KeyOf(img), kContentKeyVersion, {}, &stored).ok());
  EXPECT_EQ(stored, cost);

  auto b = MakeNode(TierOptions(redis, "b"));
  RequestResult rb = EncodeOne(*b, "r", img);
  ASSERT_TRUE(rb.all_ok());
  EXPECT_EQ(rb.items[0].source, ItemSource::kL3);
  // b did not encode it: its result carries the cost a measured (replay's manifest writes it as cost_s).
  EXPECT_EQ(rb.items[0].encode_seconds, cost);
  EXPECT_EQ(b->loop->Stats().hit_seconds_l3, cost);
  EXPECT_EQ(EncodeOne(*b, "r2", img).items[0].source, ItemSource::kL1);
  const WorkerStats s = b->loop->Stats();
  EXPECT_EQ(s.hit_seconds_l1, cost);  // cached in L1 with that cost
  EXPECT_EQ(s.encode_seconds_saved, 2 * cost);
  EXPECT_EQ(s.miss_seconds, 0);
}

}  // namespace
}  // namespace epd
