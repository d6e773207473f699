// Regression tests for faults found by attacking the core (issue 15): byte
// counts past what the counters hold, user code (destructors, Eq) that
// re-enters the cache in the middle of a call, and a Hash that throws while
// its key is being evicted. One test per fault, named after it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "epd/core/concurrent_cache.h"
#include "epd/core/embedding_cache.h"
#include "epd/core/encode_scheduler.h"
#include "epd/core/status.h"
#include "epd/core/tiered_cache.h"
#include "test_names.h"

namespace epd {
namespace {

using test_util::Name;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// Runs f, which must throw epd::Error(kInvalidArgument); returns its message.
template <typename F>
std::string InvalidArgumentOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    return e.what();
  }
  ADD_FAILURE() << "expected epd::Error(kInvalidArgument)";
  return "";
}

// The reported instance: capacity 2^63 - 1 and two charges of 2^63 - 1 left
// current_bytes at -2. Such a capacity is now refused, by every cache type.
TEST(CacheLimitsTest, CapacityBeyondTheCounterIsRejectedNamingTheBound) {
  EXPECT_EQ(kMaxCacheBytes, 4611686018427387903);  // 2^62 - 1
  const std::string bound = "capacity_bytes must be <= 4611686018427387903 (2^62 - 1), got ";
  EXPECT_THAT(InvalidArgumentOf([] { EmbeddingCache<std::string, int> c(kInt64Max); }),
              HasSubstr(bound + "9223372036854775807"));
  EXPECT_THAT(InvalidArgumentOf([] { EmbeddingCache<std::string, int> c(kMaxCacheBytes + 1); }),
              HasSubstr(bound + "4611686018427387904"));
  EXPECT_THAT(InvalidArgumentOf([] { ConcurrentEmbeddingCache<std::string, int> c(kInt64Max, 4); }), HasSubstr(bound));
  EXPECT_THAT(InvalidArgumentOf([] { TieredEmbeddingCache<std::string, int> c(10, kMaxCacheBytes + 1); }),
              HasSubstr(bound));
  EmbeddingCache<std::string, int> at_the_bound(kMaxCacheBytes);
  EXPECT_EQ(at_the_bound.capacity_bytes(), kMaxCacheBytes);
}

TEST(CacheLimitsTest, ChargeBeyondTheCounterIsRejectedAndChangesNothing) {
  EmbeddingCache<std::string, int> c(100);
  c.Put("a", 1, 10);
  EXPECT_THAT(InvalidArgumentOf([&] { c.Put("b", 2, kInt64Max); }),
              HasSubstr("nbytes must be <= 4611686018427387903 (2^62 - 1), got 9223372036854775807"));
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.current_bytes(), 10);
  EXPECT_FALSE(c.Contains("b"));
}

// At the bound, a full cache plus one more charge (2^63 - 2) still fits the
// counter: the second entry evicts the first and the count stays exact.
TEST(CacheLimitsTest, TwoMaximalChargesKeepTheByteCountExact) {
  std::vector<std::string> evicted;
  EmbeddingCache<std::string, int> c(kMaxCacheBytes,
                                     [&](const std::string& k, int&&, std::int64_t) { evicted.push_back(k); });
  c.Put("a", 1, kMaxCacheBytes);
  c.Put("b", 2, kMaxCacheBytes);
  EXPECT_THAT(evicted, ElementsAre("a"));
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.current_bytes(), kMaxCacheBytes);
}

// A hook that throws can leave the cache over capacity; with huge charges the
// next put must finish that eviction first rather than wrap the counter.
TEST(CacheLimitsTest, OverflowLeftByAThrowingHookCannotWrapTheCounter) {
  bool fail = true;
  EmbeddingCache<std::string, int> c(kMaxCacheBytes, [&](const std::string&, int&&, std::int64_t) {
    if (fail) throw std::runtime_error("hook failed");
  });
  c.Put("small", 0, 1);
  c.Put("a", 1, kMaxCacheBytes - 1);
  EXPECT_THROW(c.Put("b", 2, kMaxCacheBytes), std::runtime_error);  // "small" left, then the hook threw
  EXPECT_EQ(c.size(), 2u);
  EXPECT_EQ(c.current_bytes(), 2 * kMaxCacheBytes - 1);  // over capacity, as documented
  fail = false;
  c.Put("c", 3, kMaxCacheBytes);
  EXPECT_EQ(c.size(), 1u);
  EXPECT_TRUE(c.Contains("c"));
  EXPECT_EQ(c.current_bytes(), kMaxCacheBytes);
}

// A value whose destructor runs a callback (a Python __del__, a deleter).
using Probe = std::shared_ptr<int>;

// The reported fault: put() replaced a value in place, the old value's
// destructor re-entered the cache and grew its slab, and put() then wrote the
// new charge into freed memory, so the entry kept its old charge.
TEST(CacheReentryTest, ReplacedValueWhoseDestructorReEntersLeavesTheCountExact) {
  EmbeddingCache<std::string, Probe> c(1 << 20);
  std::int64_t bytes_seen_by_destructor = -1;
  Probe old(new int(1), [&c, &bytes_seen_by_destructor](int* p) {
    delete p;
    bytes_seen_by_destructor = c.current_bytes();
    for (int i = 0; i < 1000; ++i) c.Put(Name("grow", i), std::make_shared<int>(i), 1);
  });
  c.Put("k", std::move(old), 10);
  c.Put("k", std::make_shared<int>(2), 20);
  // The destructor ran after the replacement was fully booked.
  EXPECT_EQ(bytes_seen_by_destructor, 20);
  EXPECT_EQ(c.size(), 1001u);
  EXPECT_EQ(c.current_bytes(), 1020);
  std::optional<PoppedEntry<Probe>> k = c.Pop("k");
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->nbytes, 20);
  EXPECT_EQ(*k->value, 2);
  EXPECT_EQ(c.current_bytes(), 1000);
}

// A key type whose destructor runs a callback: shared strings compared by text.
using SharedKey = std::shared_ptr<const std::string>;
struct SharedKeyHash {
  std::size_t operator()(const SharedKey& k) const { return std::hash<std::string>()(*k); }
};
struct SharedKeyEq {
  bool operator()(const SharedKey& a, const SharedKey& b) const { return *a == *b; }
};

TEST(CacheReentryTest, RemovedKeyWhoseDestructorReEntersSeesAConsistentCache) {
  std::vector<std::string> evicted;
  EmbeddingCache<SharedKey, int, SharedKeyHash, SharedKeyEq> c(
      1 << 20, [&](const SharedKey& k, int&&, std::int64_t) { evicted.push_back(*k); });
  std::size_t size_seen_by_destructor = 0;
  SharedKey stored(new std::string("k"), [&c, &size_seen_by_destructor](const std::string* p) {
    delete p;
    size_seen_by_destructor = c.size();
    for (int i = 0; i < 100; ++i) c.Put(std::make_shared<const std::string>(Name("grow", i)), i, 1);
  });
  c.Put(stored, 7, 10);
  stored.reset();  // the cache holds the last reference
  std::optional<PoppedEntry<int>> popped = c.Pop(std::make_shared<const std::string>("k"));
  ASSERT_TRUE(popped.has_value());
  EXPECT_EQ(popped->value, 7);
  EXPECT_EQ(size_seen_by_destructor, 0u);  // "k" was fully removed first
  EXPECT_EQ(c.size(), 100u);
  EXPECT_EQ(c.current_bytes(), 100);
  // Every entry left is a live one: a big put evicts exactly the 100, oldest first.
  c.Put(std::make_shared<const std::string>("big"), 0, 1 << 20);
  ASSERT_EQ(evicted.size(), 100u);
  EXPECT_EQ(evicted.front(), "grow0");
  EXPECT_EQ(evicted.back(), "grow99");
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.current_bytes(), 1 << 20);
}

// An Eq that runs `*reenter` (once) after comparing: a Python __eq__ that
// calls back into the cache.
struct ReenteringEq {
  std::function<void()>* reenter;
  bool operator()(const std::string& a, const std::string& b) const {
    const bool equal = a == b;
    if (*reenter) std::exchange(*reenter, nullptr)();
    return equal;
  }
};

// A lookup whose Eq removed the entry it was comparing (and refilled the
// slot) returned that slot anyway: a get served another key's value.
TEST(CacheReentryTest, EqThatChangesTheCacheRestartsTheLookup) {
  std::function<void()> reenter;
  EmbeddingCache<std::string, int, std::hash<std::string>, ReenteringEq> c(1 << 20, nullptr, {},
                                                                           ReenteringEq{&reenter});
  c.Put("k", 7, 1);
  reenter = [&c] {
    c.Pop("k");
    for (int i = 0; i < 1000; ++i) c.Put(Name("grow", i), i, 1);  // reuses k's slot, rehashes the index
  };
  EXPECT_EQ(c.Get("k"), std::nullopt);
  EXPECT_EQ(c.misses(), 1u);
  EXPECT_EQ(c.hits(), 0u);
  EXPECT_EQ(c.size(), 1000u);
  EXPECT_EQ(c.Get("grow0"), 0);
  EXPECT_EQ(c.Get("grow999"), 999);
}

// A Hash that throws for "flaky" while *fail is set.
struct FlakyHash {
  const bool* fail;
  std::size_t operator()(const std::string& k) const {
    if (*fail && k == "flaky") throw std::runtime_error("hash failed");
    return std::hash<std::string>()(k);
  }
};

// The reported fault: eviction consumed the victim's recency record, then its
// hash threw; the key stayed cached and charged but was never evicted again.
TEST(CacheReentryTest, HashThatThrowsDuringEvictionLeavesTheVictimEvictable) {
  bool fail = false;
  std::vector<std::string> evicted;
  EmbeddingCache<std::string, int, FlakyHash> c(
      20, [&](const std::string& k, int&&, std::int64_t) { evicted.push_back(k); }, FlakyHash{&fail});
  c.Put("flaky", 1, 10);
  c.Put("b", 2, 10);
  fail = true;
  EXPECT_THROW(c.Put("c", 3, 10), std::runtime_error);
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.current_bytes(), 30);
  fail = false;
  c.Put("d", 4, 0);  // finishes the eviction: the victim is still "flaky"
  EXPECT_THAT(evicted, ElementsAre("flaky"));
  EXPECT_FALSE(c.Contains("flaky"));
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(c.current_bytes(), 20);
}

// The scheduler's pending token total wrapped for huge costs.
TEST(SchedulerLimitsTest, PendingTokenTotalPastInt64IsRejectedAndChangesNothing) {
  EncodeScheduler s(10, 16);
  s.Add({"a", 0, kInt64Max - 5});
  EXPECT_THAT(InvalidArgumentOf([&] {
                s.Add({"a", 1, 6});
              }),
              HasSubstr("cost 6 would take the pending token total (9223372036854775802) past 2^63 - 1"));
  EXPECT_EQ(s.pending_size(), 1u);
  EXPECT_EQ(s.pending_tokens(), kInt64Max - 5);
  s.Add({"a", 1, 5});
  EXPECT_EQ(s.pending_tokens(), kInt64Max);
  s.Add({"a", 0, kInt64Max - 5});  // an overwrite is charged net of the old cost
  EXPECT_EQ(s.pending_tokens(), kInt64Max);
  EXPECT_EQ(s.NextBatch().size(), 1u);
  EXPECT_EQ(s.pending_tokens(), 5);
}

TEST(SchedulerLimitsTest, NegativeCostIsRejectedNamingTheItem) {
  EncodeScheduler s(10, 16);
  EXPECT_THAT(InvalidArgumentOf([&] {
                s.Add({"req-1", 3, -1});
              }),
              HasSubstr("cost must be >= 0 (a post-merge token count), got -1 for item 3 of request 'req-1'"));
  EXPECT_EQ(s.pending_size(), 0u);
  EXPECT_EQ(s.pending_tokens(), 0);
}

}  // namespace
}  // namespace epd
