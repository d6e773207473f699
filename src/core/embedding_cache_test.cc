// The cache contract, run against every implementation: EmbeddingCache under
// each policy (LRU, GDSF, adaptive, GDSF with probation, and LRU, GDSF and
// adaptive partitioned by tenant: TenantPartition<P>), and
// ConcurrentEmbeddingCache with one shard (an exact LRU). Each test is one
// sentence of the contract in epd/core/embedding_cache.h; the sentences that
// hold only for LRU run in LruContractTest, GDSF's own in GdsfTest.
#include "epd/core/embedding_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "epd/core/concurrent_cache.h"
#include "epd/core/content_key_type.h"
#include "epd/core/embedding.h"
#include "test_names.h"

namespace epd {
namespace {

using test_util::Name;

using ::testing::ElementsAre;

using Evicted = std::tuple<std::string, int, std::int64_t>;

// Adapts both cache types to one constructor shape.
template <typename C>
std::unique_ptr<C> Make(std::int64_t cap, typename C::EvictHook hook);
template <>
std::unique_ptr<EmbeddingCache<std::string, int>> Make(std::int64_t cap,
                                                       EmbeddingCache<std::string, int>::EvictHook hook) {
  return std::make_unique<EmbeddingCache<std::string, int>>(cap, std::move(hook));
}
// EmbeddingCache under GDSF (or kAdaptive), with the plain hook's constructor
// shape. Puts without a cost charge 1e-9 s/B, so cost per byte is uniform
// and GDSF orders by frequency, then by touch.
template <EvictionPolicy P, bool kProbation = false>
class RankedCache : public EmbeddingCache<std::string, int> {
 public:
  using Base = EmbeddingCache<std::string, int>;
  static CacheOptions Options() {
    CacheOptions o{P};
    o.gdsf_probation = kProbation;
    return o;
  }
  RankedCache(std::int64_t cap, EvictHook hook)
      : Base(cap, Options(), [hook = std::move(hook)](const std::string& k, int&& v, std::int64_t n, const EntryCost&) {
          // NOLINTNEXTLINE(performance-move-const-arg): the hook takes int&&; std::move binds the lvalue to it.
          if (hook) hook(k, std::move(v), n);
        }) {}
};
using GdsfCache = RankedCache<EvictionPolicy::kGdsf>;
using AdaptiveCache = RankedCache<EvictionPolicy::kAdaptive>;
using ProbationCache = RankedCache<EvictionPolicy::kGdsf, true>;
template <>
std::unique_ptr<GdsfCache> Make(std::int64_t cap, GdsfCache::EvictHook hook) {
  return std::make_unique<GdsfCache>(cap, std::move(hook));
}
template <>
std::unique_ptr<AdaptiveCache> Make(std::int64_t cap, AdaptiveCache::EvictHook hook) {
  return std::make_unique<AdaptiveCache>(cap, std::move(hook));
}
template <>
std::unique_ptr<ProbationCache> Make(std::int64_t cap, ProbationCache::EvictHook hook) {
  return std::make_unique<ProbationCache>(cap, std::move(hook));
}
// The same policies partitioned by tenant (TenantPartition<P>): a reservation
// of 0 for the shared tenant switches the partition on; every entry is the
// shared tenant's and it is always over its reservation, so the victims are
// the policy's own.
template <EvictionPolicy P>
class PartitionedCache : public RankedCache<P> {
 public:
  PartitionedCache(std::int64_t cap, typename RankedCache<P>::EvictHook hook) : RankedCache<P>(cap, std::move(hook)) {
    this->SetTenantReservation(kSharedTenant, 0);
  }
};
using PartitionedLru = PartitionedCache<EvictionPolicy::kLru>;
using PartitionedGdsf = PartitionedCache<EvictionPolicy::kGdsf>;
using PartitionedAdaptive = PartitionedCache<EvictionPolicy::kAdaptive>;
template <>
std::unique_ptr<PartitionedLru> Make(std::int64_t cap, PartitionedLru::EvictHook hook) {
  return std::make_unique<PartitionedLru>(cap, std::move(hook));
}
template <>
std::unique_ptr<PartitionedGdsf> Make(std::int64_t cap, PartitionedGdsf::EvictHook hook) {
  return std::make_unique<PartitionedGdsf>(cap, std::move(hook));
}
template <>
std::unique_ptr<PartitionedAdaptive> Make(std::int64_t cap, PartitionedAdaptive::EvictHook hook) {
  return std::make_unique<PartitionedAdaptive>(cap, std::move(hook));
}
template <>
std::unique_ptr<ConcurrentEmbeddingCache<std::string, int>> Make(
    std::int64_t cap, ConcurrentEmbeddingCache<std::string, int>::EvictHook hook) {
  return std::make_unique<ConcurrentEmbeddingCache<std::string, int>>(cap, 1, std::move(hook));
}

template <typename C>
class CacheContractTest : public ::testing::Test {
 protected:
  // Every hook call, in order.
  std::vector<Evicted> evicted_;
  std::unique_ptr<C> New(std::int64_t cap) {
    return Make<C>(cap, [this](const std::string& k, int&& v, std::int64_t n) { evicted_.emplace_back(k, v, n); });
  }
};

using CacheTypes =
    ::testing::Types<EmbeddingCache<std::string, int>, ConcurrentEmbeddingCache<std::string, int>, GdsfCache,
                     AdaptiveCache, ProbationCache, PartitionedLru, PartitionedGdsf, PartitionedAdaptive>;
TYPED_TEST_SUITE(CacheContractTest, CacheTypes);

// The sentences of the contract that are LRU's alone.
template <typename C>
class LruContractTest : public CacheContractTest<C> {};
using LruCacheTypes =
    ::testing::Types<EmbeddingCache<std::string, int>, ConcurrentEmbeddingCache<std::string, int>, PartitionedLru>;
TYPED_TEST_SUITE(LruContractTest, LruCacheTypes);

TYPED_TEST(CacheContractTest, MissReturnsNulloptAndCountsMiss) {
  auto c = this->New(100);
  EXPECT_EQ(c->Get("a"), std::nullopt);
  EXPECT_EQ(c->misses(), 1u);
  EXPECT_EQ(c->hits(), 0u);
}

TYPED_TEST(CacheContractTest, HitReturnsValueAndCountsHit) {
  auto c = this->New(100);
  c->Put("a", 7, 10);
  EXPECT_EQ(c->Get("a"), 7);
  EXPECT_EQ(c->hits(), 1u);
  EXPECT_EQ(c->misses(), 0u);
}

// Regression case from the issue: capacity 250; a, b, get a, c -> b evicted.
TYPED_TEST(CacheContractTest, EvictsLeastRecentlyUsedFirst) {
  auto c = this->New(250);
  c->Put("a", 1, 100);
  c->Put("b", 2, 100);
  EXPECT_EQ(c->Get("a"), 1);
  c->Put("c", 3, 100);
  EXPECT_FALSE(c->Contains("b"));
  EXPECT_TRUE(c->Contains("a"));
  EXPECT_TRUE(c->Contains("c"));
  EXPECT_EQ(c->current_bytes(), 200);
  EXPECT_THAT(this->evicted_, ElementsAre(Evicted{"b", 2, 100}));
}

// Regression case from the issue: hooks fire [a, b], oldest first; re-put never fires.
// (GDSF: the re-put raises b's frequency, so c goes before b: GdsfTest.)
TYPED_TEST(LruContractTest, HookFiresOldestFirstAndNotOnReput) {
  auto c = this->New(200);
  c->Put("a", 1, 100);
  c->Put("b", 2, 100);
  c->Put("b", 22, 100);  // update in place: no hook, b becomes MRU
  EXPECT_TRUE(this->evicted_.empty());
  c->Put("c", 3, 100);
  c->Put("a", 4, 100);
  EXPECT_TRUE(c->Contains("a"));
  EXPECT_TRUE(c->Contains("c"));
  EXPECT_FALSE(c->Contains("b"));
  EXPECT_EQ(c->current_bytes(), 200);
  EXPECT_THAT(this->evicted_, ElementsAre(Evicted{"a", 1, 100}, Evicted{"b", 22, 100}));
}

TYPED_TEST(CacheContractTest, UpdateInPlaceRechargesBytesAndReplacesValue) {
  auto c = this->New(1000);
  c->Put("a", 1, 100);
  c->Put("a", 2, 300);
  EXPECT_EQ(c->current_bytes(), 300);
  EXPECT_EQ(c->size(), 1u);
  EXPECT_EQ(c->Get("a"), 2);
  EXPECT_TRUE(this->evicted_.empty());
}

TYPED_TEST(CacheContractTest, UpdateThatOverflowsEvictsOthersNotItself) {
  auto c = this->New(300);
  c->Put("a", 1, 100);
  c->Put("b", 2, 100);
  c->Put("a", 3, 250);  // a is MRU now; b must go
  EXPECT_THAT(this->evicted_, ElementsAre(Evicted{"b", 2, 100}));
  EXPECT_EQ(c->Get("a"), 3);
  EXPECT_EQ(c->current_bytes(), 250);
}

TYPED_TEST(CacheContractTest, OversizedItemIsSkippedWithoutEvicting) {
  auto c = this->New(250);
  c->Put("a", 1, 100);
  c->Put("big", 9, 251);
  EXPECT_FALSE(c->Contains("big"));
  EXPECT_TRUE(c->Contains("a"));
  EXPECT_EQ(c->current_bytes(), 100);
  EXPECT_TRUE(this->evicted_.empty());
}

TYPED_TEST(CacheContractTest, OversizedUpdateLeavesExistingEntryAsItWas) {
  auto c = this->New(250);
  c->Put("a", 1, 100);
  c->Put("a", 2, 1000);
  EXPECT_EQ(c->Get("a"), 1);
  EXPECT_EQ(c->current_bytes(), 100);
}

TYPED_TEST(CacheContractTest, ItemOfExactlyCapacityFits) {
  auto c = this->New(250);
  c->Put("a", 1, 100);
  c->Put("b", 2, 250);
  EXPECT_TRUE(c->Contains("b"));
  EXPECT_FALSE(c->Contains("a"));
  EXPECT_EQ(c->current_bytes(), 250);
}

TYPED_TEST(CacheContractTest, PopIsStructural) {
  auto c = this->New(250);
  c->Put("a", 1, 100);
  auto popped = c->Pop("a");
  ASSERT_TRUE(popped.has_value());
  EXPECT_EQ(popped->value, 1);
  EXPECT_EQ(popped->nbytes, 100);
  EXPECT_EQ(c->hits(), 0u);
  EXPECT_EQ(c->misses(), 0u);
  EXPECT_TRUE(this->evicted_.empty());
  EXPECT_EQ(c->current_bytes(), 0);
  EXPECT_EQ(c->size(), 0u);
  EXPECT_EQ(c->Pop("a"), std::nullopt);
  EXPECT_EQ(c->misses(), 0u);
}

TYPED_TEST(CacheContractTest, ContainsDoesNotTouchRecencyOrCounters) {
  auto c = this->New(200);
  c->Put("a", 1, 100);
  c->Put("b", 2, 100);
  EXPECT_TRUE(c->Contains("a"));  // must not make a MRU
  c->Put("c", 3, 100);
  EXPECT_THAT(this->evicted_, ElementsAre(Evicted{"a", 1, 100}));
  EXPECT_EQ(c->hits() + c->misses(), 0u);
}

TYPED_TEST(CacheContractTest, CapacityZeroHoldsOnlyZeroByteItems) {
  auto c = this->New(0);
  c->Put("a", 1, 1);
  EXPECT_FALSE(c->Contains("a"));
  c->Put("z", 2, 0);
  EXPECT_TRUE(c->Contains("z"));
  EXPECT_EQ(c->Get("z"), 2);
  EXPECT_EQ(c->current_bytes(), 0);
  EXPECT_TRUE(this->evicted_.empty());
}

TYPED_TEST(CacheContractTest, NegativeNbytesIsRejectedNamingTheArgument) {
  auto c = this->New(100);
  c->Put("a", 1, 10);
  try {
    c->Put("b", 2, -1);
    FAIL() << "expected epd::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("nbytes must be >= 0, got -1"));
  }
  EXPECT_EQ(c->size(), 1u);
  EXPECT_EQ(c->current_bytes(), 10);
}

TYPED_TEST(CacheContractTest, ManyEvictionsInOnePutFireInLruOrder) {
  auto c = this->New(300);
  for (int i = 0; i < 30; ++i) c->Put(Name("k", i), i, 10);
  c->Get("k0");  // k0 becomes MRU
  c->Put("big", 99, 295);
  // Everything but... nothing fits beside 295 except nothing of 10: all 30 go, k0 last.
  ASSERT_EQ(this->evicted_.size(), 30u);
  EXPECT_EQ(std::get<0>(this->evicted_.front()), "k1");
  EXPECT_EQ(std::get<0>(this->evicted_[28]), "k29");
  EXPECT_EQ(std::get<0>(this->evicted_.back()), "k0");
  EXPECT_EQ(c->size(), 1u);
  EXPECT_EQ(c->current_bytes(), 295);
}

TEST(EmbeddingCacheTest, NegativeCapacityIsRejectedNamingTheArgument) {
  try {
    EmbeddingCache<std::string, int> c(-5);
    FAIL() << "expected epd::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(e.what(), ::testing::HasSubstr("capacity_bytes must be >= 0, got -5"));
  }
}

TEST(EmbeddingCacheTest, ValueStaysValidAfterEvictionReplaceAndPop) {
  EmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash> cache(100);
  ContentKey k1, k2;
  k1.bytes[0] = 1;
  k2.bytes[0] = 2;
  auto make = [](float v) {
    auto e = std::make_shared<Embedding>();
    e->tokens = 1;
    e->hidden = 1;
    e->main.resize(4);
    std::memcpy(e->main.data(), &v, 4);
    return EmbeddingPtr(e);
  };
  cache.Put(k1, make(1.5f), 60);
  std::optional<EmbeddingPtr> held = cache.Get(k1);
  ASSERT_TRUE(held.has_value());
  std::weak_ptr<const Embedding> watch = *held;
  cache.Put(k2, make(2.5f), 60);  // evicts k1
  EXPECT_FALSE(cache.Contains(k1));
  float v;
  std::memcpy(&v, (*held)->main.data(), 4);
  EXPECT_EQ(v, 1.5f);
  held.reset();
  EXPECT_TRUE(watch.expired()) << "the cache must not keep an evicted value alive";

  auto held2 = cache.Get(k2);
  cache.Put(k2, make(3.5f), 60);  // replace
  std::memcpy(&v, (*held2)->main.data(), 4);
  EXPECT_EQ(v, 2.5f);
  auto held3 = cache.Get(k2);
  cache.Pop(k2);
  std::memcpy(&v, (*held3)->main.data(), 4);
  EXPECT_EQ(v, 3.5f);
}

// A model of the contract (a vector in recency order), compared with the cache
// after every operation of a long random sequence; it exercises index growth,
// backward-shift deletion, slab reuse and recency-log compaction.
TEST(EmbeddingCacheTest, MatchesNaiveModelOverRandomOperations) {
  struct ModelEntry {
    int key, value;
    std::int64_t nbytes;
  };
  for (std::int64_t cap : {0, 7, 64, 1000, 100000}) {
    std::vector<ModelEntry> model;  // oldest first
    std::int64_t model_bytes = 0;
    std::vector<std::pair<int, int>> model_evicted, evicted;
    EmbeddingCache<int, int> c(cap, [&](const int& k, int&& v, std::int64_t) { evicted.emplace_back(k, v); });
    std::uint64_t state = 12345 + cap;
    auto rnd = [&](std::uint64_t n) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return (state >> 33) % n;
    };
    auto find = [&](int k) {
      for (std::size_t i = 0; i < model.size(); ++i)
        if (model[i].key == k) return static_cast<int>(i);
      return -1;
    };
    for (int step = 0; step < 20000; ++step) {
      const int k = static_cast<int>(rnd(300));
      const auto op = rnd(10);
      if (op < 4) {
        const std::int64_t n = static_cast<std::int64_t>(rnd(60));
        const int v = step;
        c.Put(k, v, n);
        if (n <= cap) {
          int i = find(k);
          if (i >= 0) {
            model_bytes -= model[i].nbytes;
            model.erase(model.begin() + i);
          }
          model.push_back({k, v, n});
          model_bytes += n;
          while (model_bytes > cap && !model.empty()) {
            model_bytes -= model.front().nbytes;
            model_evicted.emplace_back(model.front().key, model.front().value);
            model.erase(model.begin());
          }
        }
      } else if (op < 8) {
        auto got = c.Get(k);
        int i = find(k);
        if (i < 0) {
          ASSERT_FALSE(got.has_value()) << "step " << step;
        } else {
          ASSERT_EQ(got, model[i].value) << "step " << step;
          ModelEntry e = model[i];
          model.erase(model.begin() + i);
          model.push_back(e);
        }
      } else {
        auto got = c.Pop(k);
        int i = find(k);
        ASSERT_EQ(got.has_value(), i >= 0) << "step " << step;
        if (i >= 0) {
          ASSERT_EQ(got->value, model[i].value);
          model_bytes -= model[i].nbytes;
          model.erase(model.begin() + i);
        }
      }
      ASSERT_EQ(c.size(), model.size()) << "cap " << cap << " step " << step;
      ASSERT_EQ(c.current_bytes(), model_bytes);
    }
    EXPECT_EQ(evicted, model_evicted) << "cap " << cap;
    std::vector<int> order;
    c.ForEachLruToMru([&](const int& k, const int&, std::int64_t) { order.push_back(k); });
    std::vector<int> model_order;
    model_order.reserve(model.size());
    for (const auto& e : model) model_order.push_back(e.key);
    EXPECT_EQ(order, model_order);
  }
}

TEST(EmbeddingCacheTest, ThrowingHookPropagatesAfterVictimIsRemoved) {
  int calls = 0;
  EmbeddingCache<std::string, int> c(300, [&](const std::string&, int&&, std::int64_t) {
    ++calls;
    throw std::runtime_error("hook failed");
  });
  c.Put("a", 1, 100);
  c.Put("b", 2, 100);
  c.Put("c", 3, 100);
  EXPECT_EQ(calls, 0);
  EXPECT_THROW(c.Put("d", 4, 200), std::runtime_error);
  // The first victim (a) left before the hook threw; b is still over capacity.
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(c.Contains("a"));
  EXPECT_TRUE(c.Contains("b"));
  EXPECT_EQ(c.current_bytes(), 400);
}

TEST(EmbeddingCacheTest, BookkeepingPerEntryIsWithinTheDocumentedBound) {
  EmbeddingCache<ContentKey, EmbeddingPtr, ContentKeyHash> cache(std::int64_t{1} << 40);
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    ContentKey k;
    std::memcpy(k.bytes.data(), &i, sizeof(i));
    k.bytes[8] = static_cast<std::uint8_t>(i * 37);
    cache.Put(k, nullptr, 1);
  }
  const double per_entry = static_cast<double>(cache.bookkeeping_bytes()) / n;
  // Header: 56-104 bytes per entry (vector capacity slack can add up to 2x on the slab records).
  EXPECT_GE(per_entry, 56.0);
  EXPECT_LE(per_entry, 104.0 + 24.0);
}

}  // namespace
}  // namespace epd
