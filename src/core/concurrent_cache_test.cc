// ConcurrentEmbeddingCache under load from several threads. Run it under
// ThreadSanitizer with `make tsan`.
#include "epd/core/concurrent_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace epd {
namespace {

TEST(ConcurrentCacheTest, HammeredFromSeveralThreadsKeepsBytesAndValuesConsistent) {
  constexpr int kThreads = 4;
  constexpr int kOps = 40000;
  constexpr std::int64_t kCap = std::int64_t{64} * 100;
  std::atomic<std::int64_t> evicted_bytes{0};
  ConcurrentEmbeddingCache<int, std::shared_ptr<const int>> cache(
      kCap, 8, [&](const int&, std::shared_ptr<const int>&&, std::int64_t n) { evicted_bytes += n; });
  std::atomic<std::int64_t> put_bytes{0};
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::uint64_t s = 99 + t;
      for (int i = 0; i < kOps; ++i) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const int k = static_cast<int>((s >> 33) % 500);
        if ((s >> 20) % 3 == 0) {
          cache.Put(k, std::make_shared<const int>(k * 7), 100);
          put_bytes += 100;  // every put of a new key adds 100; a replace nets 0 (counted below)
        } else if (auto v = cache.Get(k)) {
          if (**v != k * 7) ++wrong;  // a value always matches its key
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(cache.current_bytes(), kCap);
  EXPECT_EQ(cache.current_bytes(), static_cast<std::int64_t>(cache.size()) * 100);
  EXPECT_EQ(cache.evictions() * 100, static_cast<std::uint64_t>(evicted_bytes.load()));
  EXPECT_EQ(cache.hits() + cache.misses() + put_bytes.load() / 100, std::uint64_t{kThreads} * kOps);
}

TEST(ConcurrentCacheTest, HookRunsOutsideTheShardLock) {
  ConcurrentEmbeddingCache<int, int>* self = nullptr;
  bool reentered = false;
  ConcurrentEmbeddingCache<int, int> cache(100, 1, [&](const int& k, int&&, std::int64_t) {
    // Re-entering the same shard from the hook would deadlock if the lock were held.
    reentered = !self->Contains(k);
  });
  self = &cache;
  cache.Put(1, 1, 100);
  cache.Put(2, 2, 100);
  EXPECT_TRUE(reentered);
}

TEST(ConcurrentCacheTest, CapacityIsSplitAcrossShards) {
  ConcurrentEmbeddingCache<int, int> cache(103, 4);
  EXPECT_EQ(cache.capacity_bytes(), 103);
  EXPECT_EQ(cache.shard_count(), 4);
}

TEST(ConcurrentCacheTest, RejectsZeroShards) { EXPECT_THROW((ConcurrentEmbeddingCache<int, int>(100, 0)), Error); }

}  // namespace
}  // namespace epd
